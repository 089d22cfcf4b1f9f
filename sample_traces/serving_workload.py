"""The inference server of ``inference_serving.sqlite``: continuous batching, cudaMalloc
called directly for every request's buffers, and a KV budget that counts only the server's own
caches (``README.md`` in this folder says what the trace shows)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from driver_pages import OutOfMemory, round_up
from traced_process import A100_PCIE_40GB, KiB, MiB, Process, Thread, Trace, log_uniform

from nsysfrag.testing.nsys_export import ExportOptions, Gpu


@dataclass
class _Request:
    prompt: int  # tokens
    output: int  # tokens to generate
    samples: int  # parallel samples (n): the logits of each go back to the client
    conversation: int
    # Streaming clients get each step's logits in a buffer of its own, read after a lag (in
    # iterations); the others get one buffer for the whole answer.
    client_lag: tuple[int, int] | None = None
    worker: Thread | None = None
    state: int = 0  # addresses of its blocks while it runs
    kv: int = 0
    response: int = 0
    prefill_left: int = 0  # iterations of prefill still to run
    done: int = 0
    records: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.prompt + self.output


SESSIONS_KEPT = 600  # conversations whose token records stay on the GPU for a follow-up turn
DECODE_TOKENS = 128  # tokens per decode iteration
PREFILL_TOKENS = 1024  # prompt tokens per prefill iteration (chunked prefill)
ITERATIONS = 285  # the capture window closes while the server is busy, as `nsys --duration` does
SPIKE = range(20, 90)  # iterations of a burst of streaming chats from slow clients
LONG_DOCUMENTS = 140  # from this iteration on, most requests are long documents
HEADROOM = 512 * MiB  # what the server leaves outside its KV budget for everything else


class _Server:
    """A server that batches every running request into each iteration and calls cudaMalloc
    directly for each request's buffers (no caching allocator in between)."""

    def __init__(self, proc: Process, kv_per_token: int, vocab: int, kv_budget: int) -> None:
        self.proc, self.rng = proc, proc.rng
        self.kv_per_token, self.vocab, self.kv_budget = kv_per_token, vocab, kv_budget
        self.kv_in_use = 0
        self.iteration = 0
        self.workers = [Thread(proc, proc.pid + 40 + i) for i in range(48)]
        self.streamer = Thread(proc, proc.pid + 17)
        self.running: list[_Request] = []
        self.waiting: list[_Request] = []
        self.unread: list[tuple[int, int]] = []  # (iteration its client reads it, address)
        self.sessions: dict[int, list[int]] = {}  # conversation -> records, oldest first
        self.conversations = 0
        # After a failed prefill the server admits nothing until as much KV cache as that
        # request asked for has been freed.
        self.blocked_above: int | None = None

    def arrive(self) -> None:
        rng, it = self.rng, self.iteration
        if self.sessions and rng.random() < 0.2:
            conversation = rng.choice(sorted(self.sessions))  # a follow-up turn
        else:
            self.conversations += 1
            conversation = self.conversations
        if it >= LONG_DOCUMENTS and rng.random() < 0.6:
            # A long document: its KV cache alone is GiBs.
            req = _Request(log_uniform(rng, 5_000, 20_000), log_uniform(rng, 256, 1_024), 1,
                           conversation)  # fmt: skip
        elif it in SPIKE:
            # Streaming chats with four samples each, from clients that read slowly.
            req = _Request(log_uniform(rng, 64, 1_500), log_uniform(rng, 512, 1_536), 4,
                           conversation, (30, 150))  # fmt: skip
        else:
            req = _Request(log_uniform(rng, 64, 3_000), log_uniform(rng, 128, 768),
                           rng.choice((1, 1, 2)), conversation)  # fmt: skip
        self.waiting.append(req)

    def admit(self) -> None:
        """Start waiting requests, first come first served, while the KV budget allows: what
        the server counts is its own caches, not what the driver has left."""
        busy = {id(r.worker) for r in self.running}
        if self.blocked_above is not None and self.kv_in_use > self.blocked_above:
            return
        self.blocked_above = None
        while self.waiting:
            req = self.waiting[0]
            idle = [w for w in self.workers if id(w) not in busy]
            if not idle or self.kv_in_use + req.tokens * self.kv_per_token > self.kv_budget:
                return
            req.worker = self.rng.choice(idle)
            if not self.prefill(req):
                # It stays first in the queue.
                self.blocked_above = self.kv_in_use - req.tokens * self.kv_per_token
                return
            self.waiting.pop(0)
            busy.add(id(req.worker))
            self.running.append(req)

    def prefill(self, req: _Request) -> bool:
        w = req.worker
        assert w is not None
        with w.range("request"), w.range("prefill"):
            # Token ids, positions, sampling parameters: under a page, alive with the request.
            req.state = w.malloc(round_up(req.prompt * 8 + 4 * KiB, 512))
            try:
                req.kv = w.malloc(req.tokens * self.kv_per_token)
            except OutOfMemory:
                # The server's budget said yes, the driver said no.
                w.free(req.state)
                return False
            if req.client_lag is None:
                # One buffer for the logits of the whole answer.
                req.response = w.malloc(req.samples * self.vocab * 4)
        self.kv_in_use += req.tokens * self.kv_per_token
        req.records = self.sessions.pop(req.conversation, [])
        req.prefill_left = -(-req.prompt // PREFILL_TOKENS)
        return True

    def decode(self, req: _Request) -> None:
        if req.client_lag is not None:
            w = req.worker
            assert w is not None
            with w.range("request"), w.range("decode"):
                # A record of the step's tokens, kept with the conversation, then the step's
                # logits for every sample, kept until the client has read them.
                req.records.append(w.malloc(self.rng.choice((24, 28, 32, 36, 40)) * KiB))
                response = w.malloc(req.samples * self.vocab * 4)
            self.unread.append((self.iteration + self.rng.randint(*req.client_lag), response))
        req.done += DECODE_TOKENS

    def finish(self, req: _Request) -> None:
        w = req.worker
        assert w is not None
        with w.range("request"), w.range("finish"):
            w.free(req.kv)
            w.free(req.state)
            if req.response:
                w.free(req.response)
                req.records.append(w.malloc(self.rng.choice((8, 16, 32, 64)) * KiB))
        self.kv_in_use -= req.tokens * self.kv_per_token
        # A follow-up of the same conversation may have finished meanwhile: keep both turns.
        self.sessions[req.conversation] = self.sessions.pop(req.conversation, []) + req.records
        while len(self.sessions) > SESSIONS_KEPT:
            oldest = next(iter(self.sessions))
            with w.range("session_evict"):
                for r in self.sessions.pop(oldest):
                    w.free(r)

    def stream_out(self) -> None:
        ready = [u for u in self.unread if u[0] <= self.iteration]
        if not ready:
            return
        with self.streamer.range("stream_out"):
            for u in ready:
                self.unread.remove(u)
                self.streamer.free(u[1])

    def step(self) -> None:
        self.iteration += 1
        for _ in range(3 if self.iteration in SPIKE else 2 if self.iteration >= LONG_DOCUMENTS else 1):
            if self.rng.random() < 0.5:
                self.arrive()
        self.admit()
        for req in list(self.running):
            if req.prefill_left:
                req.prefill_left -= 1
                continue
            self.decode(req)
            if req.done >= req.output:
                self.running.remove(req)
                self.finish(req)
        self.stream_out()
        self.proc.idle(8_000, 25_000)


def inference_serving() -> Path:
    trace = Trace()
    pid = 3310
    gpu = A100_PCIE_40GB
    proc = Process(
        trace, pid, seed=2, start_ns=1_730_000_000, devices={0: (gpu.total_memory, 0x7F1C_C000_0000)}
    )
    main = proc.main
    # A 13B-class model in fp16 (40 layers, d 5120, 8 KV heads of 128, a 128k vocabulary):
    # 23 GiB of weights; the server budgets what is left, less its headroom, for KV caches.
    d, ffn, layers, vocab = 5120, 13_824, 40, 128_256
    with main.range("load_weights"):
        main.load_module([112, 16, 16, 4 * KiB], us=900)
        for _ in range(2):
            main.malloc(2 * vocab * d)
        for _ in range(layers):
            # Norm, fused QKV, output projection, norm, fused gate-and-up, down projection.
            for n in (d, d * (d + 2048), d * d, d, 2 * d * ffn, ffn * d):
                main.malloc(2 * n)
        main.malloc(2 * d)
        main.launch(1)
    kv_budget = gpu.total_memory - proc.heaps[0].reserved_bytes - HEADROOM
    proc.idle(50_000, 120_000)
    server = _Server(proc, 2 * layers * 8 * 128 * 2, vocab, kv_budget)
    while server.iteration < ITERATIONS:
        server.step()
    return trace.write(
        "inference_serving.sqlite",
        [Gpu(0, *gpu)],
        ExportOptions(
            processes=[(pid, "python3")],
            cuda_devices=[(pid, 0, 0)],
            registered_nvtx_strings=True,
        ),
    )



"""Regenerate the sample Nsight Systems exports in this folder.

No public nsys export carries ``CUDA_GPU_MEMORY_USAGE_EVENTS`` (see ``shared/real_traces``), and
real captures with memory tracking are large and hold private process names and paths. These
samples are the stand-in: small synthetic workloads written through
``nsysfrag.testing.nsys_export.write_export``, so they have nsys's own DDL, and built to follow the rules
real captures follow, because the analyzer joins the tables and would silently mis-attribute
anything that breaks them:

* every memory row's ``correlationId`` names an API row of the same process whose
  ``[start, end]`` contains the memory row's ``start``; API names carry nsys's version suffixes;
* allocation calls sit inside NVTX push/pop ranges on the calling thread, so sites are attributable;
* addresses come from a first-fit placement over a realistic device VA window, so live blocks never
  overlap (except where ``churn_anomalies.sqlite`` overlaps them on purpose) and out-of-order
  frees leave real holes.

Every workload has its own fixed seed, so the files are reproducible byte for byte. Run from the
repository root::

    PYTHONPATH=. .venv/bin/python sample_traces/make_samples.py
"""

from __future__ import annotations

import bisect
import random
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from nsysfrag.testing.nsys_export import (
    ALLOC,
    ARRAY,
    DEVICE,
    DEVICE_STATIC,
    FREE,
    MANAGED,
    PINNED,
    START_END,
    ApiRow,
    ExportOptions,
    Gpu,
    MemoryRow,
    NvtxRow,
    write_export,
)

HERE = Path(__file__).resolve().parent
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


class GpuModel(NamedTuple):
    name: str
    total_memory: int


A100_80GB = GpuModel("NVIDIA A100-SXM4-80GB", 85_899_345_920)
A100_40GB = GpuModel("NVIDIA A100-SXM4-40GB", 42_505_273_344)
H100_80GB = GpuModel("NVIDIA H100 80GB HBM3", 85_520_809_984)

# nsys names API rows by their exported symbol, hence the version suffixes.
MALLOC, FREE_API = "cudaMalloc_v3020", "cudaFree_v3020"
MALLOC_ASYNC, FREE_ASYNC = "cudaMallocAsync_v11020", "cudaFreeAsync_v11020"
CU_MEM_ALLOC, CU_MEM_FREE = "cuMemAlloc_v2", "cuMemFree_v2"
HOST_ALLOC, FREE_HOST = "cudaHostAlloc_v3020", "cudaFreeHost_v3020"
MALLOC_MANAGED = "cudaMallocManaged_v6000"
MALLOC_ARRAY, FREE_ARRAY = "cudaMallocArray_v3020", "cudaFreeArray_v3020"
LAUNCH = "cudaLaunchKernel_v7000"
SET_DEVICE = "cudaSetDevice_v3020"
SYNC = "cudaDeviceSynchronize_v3020"
MODULE_LOAD = "cuModuleLoadData"

# The free call CUDA requires for memory obtained from each allocation call.
FREE_FOR = {
    MALLOC: FREE_API,
    MALLOC_ASYNC: FREE_ASYNC,
    CU_MEM_ALLOC: CU_MEM_FREE,
    HOST_ALLOC: FREE_HOST,
    MALLOC_MANAGED: FREE_API,
    MALLOC_ARRAY: FREE_ARRAY,
}
ASYNC_APIS = {MALLOC_ASYNC, FREE_ASYNC}

# cudaErrorMemoryAllocation and CUDA_ERROR_OUT_OF_MEMORY share the value 2.
OUT_OF_MEMORY = 2


class OutOfMemory(Exception):
    """A placement failed: the workload sees cudaMalloc return cudaErrorMemoryAllocation."""


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    """Allocation sizes in real programs spread over decades, not evenly over a range."""
    return int(lo * (hi / lo) ** rng.random())


class Placement:
    """First-fit placement of blocks inside one virtual-address window.

    nsys records only what the driver returned, so the samples must invent addresses. First fit over
    the lowest free gap is close enough to what the CUDA driver does to give realistic holes when
    frees come out of order. As the driver does, blocks of 2 MiB or more start on and fill whole
    2 MiB pages; smaller ones get 512-byte alignment.
    """

    def __init__(self, base: int, size: int) -> None:
        self.base, self.limit = base, base + size
        self._starts: list[int] = []
        self._ends: dict[int, int] = {}

    @staticmethod
    def _granule(nbytes: int) -> int:
        return 2 * MiB if nbytes >= 2 * MiB else 512

    def alloc(self, nbytes: int) -> int:
        align = self._granule(nbytes)
        span = round_up(max(nbytes, 1), align)
        cursor = self.base
        for start in self._starts:
            if round_up(cursor, align) + span <= start:
                break
            cursor = max(cursor, self._ends[start])
        addr = round_up(cursor, align)
        if addr + span > self.limit:
            raise OutOfMemory(f"no {span} B gap in the {self.limit - self.base} B window")
        self.reserve(addr, nbytes)
        return addr

    def reserve(self, addr: int, nbytes: int) -> None:
        """Take ``[addr, addr + span)``; used directly to force a placement."""
        end = addr + round_up(max(nbytes, 1), self._granule(nbytes))
        i = bisect.bisect_left(self._starts, addr)
        if (i and self._ends[self._starts[i - 1]] > addr) or (
            i < len(self._starts) and self._starts[i] < end
        ):
            raise ValueError(f"placement at {addr:#x} overlaps a live block")
        self._starts.insert(i, addr)
        self._ends[addr] = end

    def release(self, addr: int) -> None:
        self._starts.pop(bisect.bisect_left(self._starts, addr))
        del self._ends[addr]


@dataclass
class Trace:
    """The rows of one export, from any number of processes."""

    memory: list[MemoryRow] = field(default_factory=list)
    api: list[ApiRow] = field(default_factory=list)
    nvtx: list[NvtxRow] = field(default_factory=list)

    def write(self, name: str, gpus: list[Gpu], options: ExportOptions) -> Path:
        # nsys writes each table in time order; the analyzer breaks start ties by rowid.
        return write_export(
            HERE / name,
            sorted(self.memory, key=lambda r: r.start),
            sorted(self.api, key=lambda r: r.start),
            sorted(self.nvtx, key=lambda r: r.start),
            gpus,
            options,
        )


@dataclass
class _Block:
    heap: Placement
    device: int
    kind: int
    nbytes: int
    free_api: str


class Process:
    """One traced process: a clock, CUPTI correlation ids, its address windows, its live blocks."""

    def __init__(
        self,
        trace: Trace,
        pid: int,
        seed: int,
        start_ns: int,
        heaps: dict[int | str, Placement],
    ) -> None:
        self.trace, self.pid = trace, pid
        self.rng = random.Random(seed)
        self.now = start_ns
        self.heaps = heaps
        self.blocks: dict[int, _Block] = {}
        self._next_correlation = 1
        self.main = Thread(self, pid)

    def idle(self, lo_us: float, hi_us: float) -> None:
        self.now += int(self.rng.uniform(lo_us, hi_us) * 1000)

    def api_call(self, tid: int, name: str, duration_ns: int, ret: int = 0) -> tuple[int, int, int]:
        start, end = self.now, self.now + duration_ns
        # Untraced internal calls consume correlation ids too, so real ids have gaps.
        corr = self._next_correlation
        self._next_correlation += 1 if self.rng.random() < 0.8 else self.rng.randint(2, 6)
        event_class = 1 if name.startswith("cu") and not name.startswith("cuda") else 0
        self.trace.api.append(ApiRow(start, end, self.pid, tid, name, corr, ret, event_class))
        self.now = end + self.rng.randint(300, 3000)
        return corr, start, end

    def inside(self, start: int, end: int) -> int:
        """The moment within an API call at which CUPTI stamps the memory event."""
        return start + (end - start) * self.rng.randint(30, 85) // 100


class Thread:
    """API calls and NVTX ranges on one thread of a Process."""

    def __init__(self, proc: Process, tid: int) -> None:
        self.proc, self.tid = proc, tid

    def call(self, name: str, lo_us: float = 2.0, hi_us: float = 8.0, ret: int = 0) -> int:
        duration = int(self.proc.rng.uniform(lo_us, hi_us) * 1000)
        return self.proc.api_call(self.tid, name, duration, ret)[0]

    def launch(self, n: int = 1) -> None:
        for _ in range(n):
            self.call(LAUNCH, 3, 9)
            self.proc.idle(2, 40)

    @contextmanager
    def range(self, text: str) -> Iterator[None]:
        start = self.proc.now
        self.proc.idle(0.5, 3)
        try:
            yield
        finally:
            self.proc.idle(0.5, 3)
            self.proc.trace.nvtx.append(
                NvtxRow(start, self.proc.now, self.proc.pid, self.tid, text)
            )

    def start_range(self, text: str) -> tuple[str, int]:
        """nvtxRangeStart: unlike push/pop, these need not nest and may outlive the caller."""
        return text, self.proc.now

    def end_range(self, handle: tuple[str, int]) -> None:
        text, start = handle
        self.proc.trace.nvtx.append(
            NvtxRow(start, self.proc.now, self.proc.pid, self.tid, text, START_END)
        )

    def _duration(self, api: str, nbytes: int) -> int:
        rng = self.proc.rng
        if api in ASYNC_APIS:
            return int(rng.uniform(1, 4) * 1000)
        # Mapping pages dominates large cudaMalloc/cudaFree: about a millisecond per GiB.
        return int(rng.uniform(4, 15) * 1000) + nbytes * 1_000_000 // GiB

    def malloc(
        self,
        nbytes: int,
        api: str = MALLOC,
        kind: int = DEVICE,
        device: int = 0,
        at: int | None = None,
        correlated: bool = True,
    ) -> int:
        proc = self.proc
        heap = proc.heaps["host" if kind == PINNED else "managed" if kind == MANAGED else device]
        if at is None:
            try:
                addr = heap.alloc(nbytes)
            except OutOfMemory:
                proc.api_call(self.tid, api, self._duration(api, 0), ret=OUT_OF_MEMORY)
                raise
        else:
            heap.reserve(at, nbytes)
            addr = at
        corr: int | None = None
        if correlated:
            corr, start, end = proc.api_call(self.tid, api, self._duration(api, nbytes))
            when = proc.inside(start, end)
        else:
            when = proc.now
            proc.idle(1, 5)
        proc.trace.memory.append(MemoryRow(when, proc.pid, device, addr, nbytes, ALLOC, kind, corr))
        proc.blocks[addr] = _Block(heap, device, kind, nbytes, FREE_FOR.get(api, FREE_API))
        return addr

    def free(self, addr: int, *, recorded: bool = True) -> None:
        """Free a block; ``recorded=False`` frees it where nsys could not see (a missed free)."""
        proc = self.proc
        block = proc.blocks.pop(addr)
        block.heap.release(addr)
        if not recorded:
            return
        corr, start, end = proc.api_call(
            self.tid, block.free_api, self._duration(block.free_api, block.nbytes // 4)
        )
        proc.trace.memory.append(
            MemoryRow(
                proc.inside(start, end),
                proc.pid,
                block.device,
                addr,
                block.nbytes,
                FREE,
                block.kind,
                corr,
            )
        )


# --- training: shared by training_loop.sqlite and multi_gpu.sqlite ---


@dataclass(frozen=True, slots=True)
class Transformer:
    layers: int
    d_model: int
    vocab: int
    batch: int

    def parameter_bytes(self) -> list[list[int]]:
        """fp16 parameter tensors: embeddings, then one group per layer, then the final norm."""
        d = self.d_model
        layer = [d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d]
        groups = [[self.vocab * d, 2048 * d]] + [layer] * self.layers + [[d, d]]
        return [[2 * n for n in g] for g in groups]

    def activation_bytes(self, tokens: int) -> list[int]:
        """Per layer, saved for backward: ln1, qkv, attention out, ln2, fc1, gelu (fp16)."""
        d = self.d_model
        return [2 * tokens * n for n in (d, 3 * d, d, d, 4 * d, 4 * d)]


def _train(
    t: Thread,
    model: Transformer,
    steps: int,
    seq_lengths: tuple[int, ...],
    between_steps: Callable[[int], None] | None = None,
    all_reduce: bool = False,
) -> None:
    """A mixed-precision training loop as a framework without a caching allocator would run it."""
    rng = t.proc.rng
    sizes = model.parameter_bytes()
    with t.range("model_init"):
        for group in sizes:
            for n in group:
                t.malloc(n)
            t.launch(1)
    t.proc.idle(20_000, 60_000)

    for step in range(1, steps + 1):
        tokens = model.batch * rng.choice(seq_lengths)
        with t.range("train_step"):
            with t.range("data"):
                ids = t.malloc(tokens * 8)
                t.launch(1)
            saved: list[list[int]] = []
            with t.range("forward"):
                for layer in range(model.layers):
                    with t.range(f"layer_{layer:02d}"):
                        acts = []
                        for i, n in enumerate(model.activation_bytes(tokens)):
                            acts.append(t.malloc(n))
                            if i == 1:
                                workspace = t.malloc(rng.choice((4, 8, 16, 32)) * MiB)
                                t.launch(1)
                                t.free(workspace)
                        t.launch(2)
                        saved.append(acts)
                    t.proc.idle(300, 2500)
                logits = t.malloc(tokens * model.vocab * 2)
                loss = t.malloc(4)
                t.launch(2)
            with t.range("backward"):
                d_logits = t.malloc(tokens * model.vocab * 2)
                t.free(logits)
                t.launch(1)
                for layer in reversed(range(model.layers)):
                    with t.range(f"layer_{layer:02d}"):
                        d_hidden = t.malloc(tokens * model.d_model * 8)
                        acts = saved.pop()[::-1]
                        # Autograd frees saved tensors roughly, not exactly, in reverse order.
                        if rng.random() < 0.5:
                            i = rng.randrange(len(acts) - 1)
                            acts[i], acts[i + 1] = acts[i + 1], acts[i]
                        new_grads = sizes[layer + 1] if step == 1 else []
                        for i, a in enumerate(acts):
                            t.free(a)
                            # Step 1 creates .grad tensors in the holes the activations leave;
                            # they live forever and pin the activation region from then on.
                            for n in new_grads[2 * i : 2 * i + 2]:
                                t.malloc(n)
                            t.launch(1)
                        t.free(d_hidden)
                        if all_reduce and layer % 2 == 0:
                            with t.range("nccl:all_reduce"):
                                t.launch(1)
                t.free(d_logits)
                t.free(loss)
                if step == 1:
                    for n in sizes[0] + sizes[-1]:
                        t.malloc(n)
            with t.range("optimizer"):
                if step == 1:
                    # Adam state (fp32 exp_avg, exp_avg_sq) is created beside an fp32 grad copy
                    # that is freed at once: long-lived blocks with holes in between.
                    for n in (n for g in sizes for n in g):
                        scratch = t.malloc(2 * n)
                        t.malloc(2 * n)
                        t.malloc(2 * n)
                        t.free(scratch)
                norm = t.malloc(4 * KiB)
                t.launch(3)
                t.free(norm)
            t.free(ids)
        if between_steps:
            between_steps(step)
        t.proc.idle(2_000, 10_000)


def training_loop() -> Path:
    trace = Trace()
    proc = Process(
        trace,
        2817,
        seed=1,
        start_ns=412_000_000,
        heaps={0: Placement(0x7F3A_0000_0000, A100_80GB.total_memory)},
    )
    model = Transformer(layers=6, d_model=2048, vocab=32_000, batch=24)
    _train(proc.main, model, steps=40, seq_lengths=(640, 768, 896, 1024))
    return trace.write(
        "training_loop.sqlite",
        [Gpu(0, *A100_80GB)],
        ExportOptions(processes=[(2817, "python3")], cuda_devices=[(2817, 0, 0)]),
    )


# --- inference serving ---


def _serve_request(
    t: Thread, rng: random.Random, prompt: int, output: int, kv_bytes_per_token: int
) -> Iterator[None]:
    """One request on its worker thread; yields between steps so that other workers run.

    Every step is its own "request" range rather than one range over the request's life: the
    capture ends while requests are in flight, and a range still open then would have no end.
    """
    kv: int | None = None
    capacity = done = 0
    while done < output:
        try:
            if kv is None:
                with t.range("request"), t.range("prefill"):
                    capacity = round_up(prompt + done + 1, 16)
                    kv = t.malloc(capacity * kv_bytes_per_token)
                    scratch = t.malloc((prompt + done) * 64 * KiB, api=MALLOC_ASYNC)
                    t.launch(1)
                    t.free(scratch)
                yield
            chunk = min(rng.choice((64, 128, 128, 256)), output - done)
            with t.range("request"), t.range("decode"):
                if prompt + done + chunk > capacity:
                    # The cache grows by reallocate-and-copy, leaving the old buffer as a hole.
                    capacity = round_up(prompt + done + chunk, 256)
                    grown = t.malloc(capacity * kv_bytes_per_token)
                    t.launch(1)
                    t.free(kv)
                    kv = grown
                logits = t.malloc(32_000 * 4 * rng.choice((1, 2, 4)), api=MALLOC_ASYNC)
                t.launch(1)
                t.free(logits)
            done += chunk
        except OutOfMemory:
            # Preempt-and-recompute: give the cache back, wait, prefill again later.
            if kv is not None:
                with t.range("request"), t.range("preempt"):
                    t.free(kv)
                kv = None
            for _ in range(rng.randint(4, 12)):
                yield
        yield
    if kv is not None:
        with t.range("request"), t.range("finish"):
            t.free(kv)


def inference_serving() -> Path:
    trace = Trace()
    pid = 3310
    gpu = H100_80GB
    proc = Process(
        trace,
        pid,
        seed=2,
        start_ns=1_730_000_000,
        heaps={0: Placement(0x7F1C_4000_0000, gpu.total_memory)},
    )
    rng = proc.rng
    # A 34B-class model (48 layers, d 8192, 8 KV heads of 128) in fp16: 63 GiB of weights leave
    # about 16 GiB for the KV cache, so the cache runs near full and out-of-order frees bite.
    d, ffn, layers = 8192, 22_016, 48
    kv_per_token = 2 * layers * 8 * 128 * 2
    with proc.main.range("load_weights"):
        for n in (32_000 * d, 32_000 * d):
            proc.main.malloc(2 * n)
        for _ in range(layers):
            for n in (d, d * (d + 2048), d * d, d, 2 * d * ffn, ffn * d):
                proc.main.malloc(2 * n)
            proc.main.launch(1)
    weights = sum(b.nbytes for b in proc.blocks.values())
    proc.idle(50_000, 120_000)

    workers = [Thread(proc, pid + 40 + i) for i in range(160)]
    kv_budget = 15 * GiB
    pending = 400
    active: dict[int, Iterator[None]] = {}
    # The capture window closes while the server is still busy, as a `nsys --duration` one does.
    while pending:
        idle_workers = [i for i in range(len(workers)) if i not in active]
        in_use = sum(b.nbytes for b in proc.blocks.values()) - weights
        if pending and idle_workers and in_use < kv_budget and rng.random() < 0.5:
            w = rng.choice(idle_workers)
            prompt = log_uniform(rng, 32, 2048)
            output = log_uniform(rng, 16, 1024)
            active[w] = _serve_request(workers[w], rng, prompt, output, kv_per_token)
            pending -= 1
        if not active:
            proc.idle(1_000, 12_000)
            continue
        w = rng.choice(sorted(active))
        if next(active[w], StopIteration) is StopIteration:
            del active[w]
        proc.idle(1_000, 12_000)
    return trace.write(
        "inference_serving.sqlite",
        [Gpu(0, *gpu)],
        ExportOptions(processes=[(pid, "python3")], cuda_devices=[(pid, 0, 0)]),
    )


# --- random churn with every anomaly ---


def churn_anomalies() -> Path:
    trace = Trace()
    pid = 5120
    dev = Placement(0x7F21_4000_0000, A100_40GB.total_memory)
    proc = Process(
        trace,
        pid,
        seed=3,
        # nsys stamps the first few calls before the session's zero.
        start_ns=-160_000,
        heaps={
            0: dev,
            "host": Placement(0x7F21_0000_0000, 1 * GiB),
            "managed": Placement(0x7F20_0000_0000, 4 * GiB),
        },
    )
    rng, t = proc.rng, proc.main
    io = Thread(proc, pid + 7)

    # Blocks allocated before the capture started: their frees will be unmatched.
    before_capture = []
    for n in (256 * KiB, 8 * MiB, 2 * MiB + 512, 64 * MiB, 3 * KiB):
        before_capture.append(dev.alloc(n))
        proc.blocks[before_capture[-1]] = _Block(dev, 0, DEVICE, n, FREE_API)

    with t.range("init"):
        t.call(SET_DEVICE, 1, 3)
        with t.range("load_module"):
            # Static __device__ symbols are reported when their module loads.
            corr, start, end = proc.api_call(t.tid, MODULE_LOAD, 180_000)
            for n in (64 * KiB, 4 * KiB, 1 * MiB):
                addr = dev.alloc(n)
                when = proc.inside(start, end)
                trace.memory.append(MemoryRow(when, pid, 0, addr, n, ALLOC, DEVICE_STATIC, corr))
        first = t.malloc(1 * MiB)
        t.launch(1)

    # With lazy module loading the first launch of another module loads it, statics included.
    corr, start, end = proc.api_call(t.tid, LAUNCH, 90_000)
    addr = dev.alloc(32 * KiB)
    trace.memory.append(
        MemoryRow(proc.inside(start, end), pid, 0, addr, 32 * KiB, ALLOC, DEVICE_STATIC, corr)
    )

    sites = ("tokenizer", "image_decode", "feature_cache", "scratch", "index_build")
    apis = (MALLOC, MALLOC, MALLOC, MALLOC_ASYNC, CU_MEM_ALLOC)
    live: list[int] = [first]
    pinned: list[int] = []
    managed: list[int] = []
    arrays: list[int] = []
    epoch = t.start_range("epoch 0")
    prefetch: tuple[str, int] | None = None

    for i in range(1300):
        proc.idle(5, 400)
        thread = io if i % 9 == 0 else t
        # Inside the prefetch window some calls sit under the start/end range alone.
        site: AbstractContextManager[None] = (
            nullcontext()
            if prefetch and thread is t and rng.random() < 0.5
            else thread.range(rng.choice(sites))
        )
        with site:
            if live and (len(live) > 220 or rng.random() < 0.47):
                thread.free(live.pop(rng.randrange(len(live))))
            else:
                live.append(thread.malloc(log_uniform(rng, 256, 96 * MiB), api=rng.choice(apis)))

        if i in (40, 310, 640, 905, 1210) and before_capture:
            with t.range("cleanup_stale"):
                t.free(before_capture.pop())
        if i in (120, 700, 1100):
            # The free of a live block goes unrecorded, then a new block lands on top of it.
            victim = max(live, key=lambda a: proc.blocks[a].nbytes)
            live.remove(victim)
            size = proc.blocks[victim].nbytes
            t.free(victim, recorded=False)
            offset = {120: 0, 700: 0, 1100: round_up(size // 3, 2 * MiB)}[i]
            with t.range("reuse_after_missed_free"):
                nbytes = size if i == 120 else max(512, (size - offset) // 2)
                live.append(t.malloc(nbytes, at=victim + offset))
        if i in (90, 450, 451, 1000):
            with t.range("empty_batch"):
                t.malloc(0)
        if i in (260, 261, 262, 980, 1150):
            with t.range("huge_request"):
                api = {980: CU_MEM_ALLOC, 1150: MALLOC_ASYNC}.get(i, MALLOC)
                t.call(api, 20, 90, ret=OUT_OF_MEMORY)
        if i % 60 == 5:
            with io.range("h2d_staging"):
                pinned.append(io.malloc(log_uniform(rng, 64 * KiB, 32 * MiB), HOST_ALLOC, PINNED))
        if i % 60 == 35 and len(pinned) > 2:
            with io.range("h2d_staging"):
                io.free(pinned.pop(0))
        if i % 150 == 75:
            with t.range("unified_buffers"):
                managed.append(
                    t.malloc(log_uniform(rng, 1 * MiB, 256 * MiB), MALLOC_MANAGED, MANAGED)
                )
        if i % 150 == 140 and len(managed) > 1:
            with t.range("unified_buffers"):
                t.free(managed.pop(0))
        if i in (150, 500, 900):
            with t.range("texture_upload"):
                arrays.append(t.malloc(rng.choice((1, 4, 16)) * MiB, MALLOC_ARRAY, ARRAY))
        if i in (600, 1200) and arrays:
            with t.range("texture_upload"):
                t.free(arrays.pop(0))
        if i == 530:
            # Allocated inside the driver with no API call that CUPTI attributes it to.
            live.append(t.malloc(6 * MiB, correlated=False))
        if i == 560:
            # VMM calls leave no memory rows; they only show up as API calls.
            with t.range("vmm_reserve"):
                for name in ("cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess"):
                    t.call(name, 3, 20)
        if i in (300, 800) and prefetch is None:
            prefetch = t.start_range("prefetch_window")
        if i in (420, 1000) and prefetch is not None:
            t.end_range(prefetch)
            prefetch = None
        if i == 650:
            t.end_range(epoch)
            epoch = t.start_range("epoch 1")

    t.call(SYNC, 100, 800)
    t.end_range(epoch)
    return trace.write(
        "churn_anomalies.sqlite",
        [Gpu(0, *A100_40GB)],
        ExportOptions(processes=[(pid, "churn_worker")], cuda_devices=[(pid, 0, 0)]),
    )


# --- two DDP ranks on two GPUs ---


def multi_gpu() -> Path:
    trace = Trace()
    model = Transformer(layers=4, d_model=2048, vocab=32_000, batch=4)
    # Each rank maps its own GPU at the same VA: identical addresses in two processes are normal.
    base = 0x7F52_6000_0000
    rank0 = Process(
        trace,
        4101,
        seed=41,
        start_ns=903_000_000,
        heaps={
            0: Placement(base, H100_80GB.total_memory),
            1: Placement(base + 0x60_0000_0000, A100_80GB.total_memory),
        },
    )
    rank1 = Process(
        trace,
        4102,
        seed=42,
        start_ns=905_500_000,
        heaps={0: Placement(base, A100_80GB.total_memory)},
    )

    def evaluate_on_second_gpu(step: int) -> None:
        # Rank 0 sees both GPUs and borrows CUDA device 1 (rank 1's GPU) for evaluation.
        if step % 8:
            return
        t = rank0.main
        with t.range("eval"):
            t.call(SET_DEVICE, 1, 4)
            buffers = [t.malloc(n, device=1) for n in (16 * MiB, 250 * MiB, 4 * KiB, 32 * MiB)]
            t.launch(4)
            for b in reversed(buffers):
                t.free(b)
            t.call(SET_DEVICE, 1, 4)

    for proc in (rank0, rank1):
        t = proc.main
        with t.range("ddp_init"):
            t.call(SET_DEVICE, 1, 4)
            with t.range("nccl:comm_init"):
                for _ in range(6):
                    t.malloc(4 * MiB)
                t.malloc(64 * KiB)
            with t.range("reducer_buckets"):
                total = sum(n for g in model.parameter_bytes() for n in g)
                for _ in range(total // (25 * MiB)):
                    t.malloc(25 * MiB)
                t.malloc(total % (25 * MiB))
        hook = evaluate_on_second_gpu if proc is rank0 else None
        _train(
            t, model, steps=24, seq_lengths=(512, 768, 1024), between_steps=hook, all_reduce=True
        )

    return trace.write(
        "multi_gpu.sqlite",
        # Two different 80 GB GPUs, so that a wrong cudaId -> gpuId mapping shows in the report.
        [Gpu(0, *H100_80GB), Gpu(1, *A100_80GB)],
        ExportOptions(
            nsys_version="2025.1.3.140",
            schema_version="3.17.2",
            cuda_devices=[(4101, 0, 0), (4101, 1, 1), (4102, 0, 1)],
            processes=[(4101, "python3"), (4102, "python3")],
            # The nvtx Python package registers its messages: text NULL, textId set.
            registered_nvtx_strings=True,
        ),
    )


# --- PyTorch caching allocator ---


@dataclass
class _CachedBlock:
    addr: int
    size: int
    free: bool


class TorchCachingAllocator:
    """Just enough of PyTorch's CUDACachingAllocator to know when it calls cudaMalloc and cudaFree.

    Rules from c10/cuda/CUDACachingAllocator.cpp (see shared/ALLOCATORS.md): 512-byte rounding;
    requests up to 1 MiB come from 2 MiB small-pool segments, up to 10 MiB from 20 MiB segments,
    larger ones get their own segment rounded to 2 MiB; best fit by (size, address); split from the
    low end; frees merge within the segment and return nothing to CUDA until ``empty_cache``.
    """

    def __init__(self) -> None:
        self.segments: dict[int, list[_CachedBlock]] = {}
        self.small: dict[int, bool] = {}
        self.segment_of: dict[int, int] = {}

    def malloc(self, t: Thread, nbytes: int) -> int:
        size = round_up(max(nbytes, 1), 512)
        small = size <= 1 * MiB
        best: tuple[int, int, int] | None = None
        for seg, blocks in self.segments.items():
            if self.small[seg] != small:
                continue
            for b in blocks:
                if b.free and b.size >= size and (best is None or (b.size, b.addr) < best[:2]):
                    best = (b.size, b.addr, seg)
        if best is None:
            seg_size = (
                2 * MiB if small else 20 * MiB if size < 10 * MiB else round_up(size, 2 * MiB)
            )
            seg = t.malloc(seg_size)
            self.segments[seg] = [_CachedBlock(seg, seg_size, True)]
            self.small[seg] = small
            best = (seg_size, seg, seg)
        _, addr, seg = best
        blocks = self.segments[seg]
        i = next(i for i, b in enumerate(blocks) if b.addr == addr)
        block = blocks[i]
        remaining = block.size - size
        if remaining >= 512 if small else remaining > 1 * MiB:
            blocks.insert(i + 1, _CachedBlock(addr + size, remaining, True))
            block.size = size
        block.free = False
        self.segment_of[addr] = seg
        return addr

    def free(self, addr: int) -> None:
        blocks = self.segments[self.segment_of.pop(addr)]
        i = next(i for i, b in enumerate(blocks) if b.addr == addr)
        blocks[i].free = True
        if i + 1 < len(blocks) and blocks[i + 1].free:
            blocks[i].size += blocks.pop(i + 1).size
        if i and blocks[i - 1].free:
            blocks[i - 1].size += blocks.pop(i).size

    def empty_cache(self, t: Thread) -> None:
        whole = [s for s, b in self.segments.items() if len(b) == 1 and b[0].free]
        # release_cached_blocks walks the large pool, then the small one, each by (size, address).
        whole.sort(key=lambda s: (self.small[s], self.segments[s][0].size, s))
        for seg in whole:
            del self.segments[seg], self.small[seg]
            t.free(seg)


def caching_allocator() -> Path:
    trace = Trace()
    pid = 6020
    proc = Process(
        trace,
        pid,
        seed=5,
        start_ns=2_210_000_000,
        heaps={0: Placement(0x7F0E_8000_0000, A100_80GB.total_memory)},
    )
    rng, main = proc.rng, proc.main
    autograd = Thread(proc, pid + 73)  # PyTorch runs backward on its own engine thread.
    cache = TorchCachingAllocator()
    d, layers, vocab = 1024, 16, 50_257

    per_layer = (d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d)
    sizes = [2 * vocab * d] + [2 * n for _ in range(layers) for n in per_layer]
    with main.range("model_init"):
        for n in sizes:
            cache.malloc(main, n)
        main.launch(1)

    for step in range(1, 31):
        tokens = 8 * rng.choice((256, 384, 512, 640, 768, 1024))
        with main.range("train_step"):
            saved: list[list[int]] = []
            with main.range("forward"):
                for _ in range(layers):
                    # LayerNorm stats (small pool), then ln1, qkv, attention, ln2, fc1, gelu.
                    acts = [
                        cache.malloc(main, tokens * n)
                        for n in (4 * 2, 2 * d, 6 * d, 2 * d, 2 * d, 8 * d, 8 * d)
                    ]
                    scratch = cache.malloc(main, tokens * 2 * d)
                    cache.free(scratch)
                    saved.append(acts)
                logits = cache.malloc(main, tokens * vocab * 2)
                main.launch(2)
            # The main thread blocks in loss.backward() while the engine thread allocates.
            with main.range("backward"), autograd.range("autograd::engine"):
                d_logits = cache.malloc(autograd, tokens * vocab * 2)
                cache.free(logits)
                for layer in reversed(range(layers)):
                    d_x = cache.malloc(autograd, tokens * 8 * d)
                    for a in reversed(saved.pop()):
                        cache.free(a)
                    if step == 1:
                        for n in sizes[1 + 12 * layer : 13 + 12 * layer]:
                            cache.malloc(autograd, n)
                    cache.free(d_x)
                if step == 1:
                    cache.malloc(autograd, sizes[0])
                cache.free(d_logits)
                autograd.launch(2)
            with main.range("optimizer"):
                if step == 1:
                    # fp32 exp_avg and exp_avg_sq per parameter, alive for the rest of the run.
                    for n in sizes:
                        cache.malloc(main, 2 * n)
                        cache.malloc(main, 2 * n)
                main.launch(2)
        if step == 18:
            with main.range("empty_cache"):
                main.call(SYNC, 200, 900)
                cache.empty_cache(main)
        proc.idle(20_000, 60_000)
    return trace.write(
        "caching_allocator.sqlite",
        [Gpu(0, *A100_80GB)],
        ExportOptions(processes=[(pid, "python3")], cuda_devices=[(pid, 0, 0)]),
    )


# --- entry point ---


def summarize(path: Path) -> str:
    con = sqlite3.connect(path)
    try:
        counts = {
            table: con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in (
                "CUDA_GPU_MEMORY_USAGE_EVENTS",
                "CUPTI_ACTIVITY_KIND_RUNTIME",
                "NVTX_EVENTS",
            )
        }
    finally:
        con.close()
    memory, api, nvtx = counts.values()
    return (
        f"{path.name:26} {path.stat().st_size:>9,} B  memory {memory:>6,}  api {api:>6,}"
        f"  nvtx {nvtx:>5,}  total {memory + api + nvtx:>6,}"
    )


def main() -> None:
    for workload in (
        training_loop,
        inference_serving,
        churn_anomalies,
        multi_gpu,
        caching_allocator,
    ):
        print(summarize(workload()))


if __name__ == "__main__":
    main()

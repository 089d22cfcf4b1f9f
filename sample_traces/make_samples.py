"""Regenerate the sample Nsight Systems exports in this folder.

No public nsys export carries ``CUDA_GPU_MEMORY_USAGE_EVENTS`` in quantity (six small genuine ones
are the project's reference, ``README.md``), and real captures with memory tracking are large and
hold private process names and paths. These samples are the stand-in: small synthetic workloads
written through ``nsysfrag.testing.nsys_export.write_export``, so they have nsys's own DDL, and
built to follow the rules real captures follow, because the analyzer joins the tables and would
silently mis-attribute anything that breaks them:

* every memory row's ``correlationId`` names an API row of the same process whose
  ``[start, end]`` contains the memory row's ``start``; API names carry nsys's version suffixes;
* allocation calls sit inside NVTX push/pop ranges on the calling thread, so sites are attributable;
* addresses and failures come from a model of the CUDA driver (``driver_pages.py``): blocks of
  2 MiB or more on fresh whole pages placed downwards, smaller ones packed at 512-byte steps into
  partly used 2 MiB chunks, and a cudaMalloc fails exactly when the driver cannot serve it.

Every workload has its own fixed seed, so the files are reproducible byte for byte. Run from the
repository root::

    PYTHONPATH=. .venv/bin/python sample_traces/make_samples.py
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as a script it is there already; imported, it may not be
    sys.path.insert(0, str(HERE))
from driver_pages import PAGE, MemoryPool, OutOfMemory, round_up  # noqa: E402
import traced_process  # noqa: E402
from serving_workload import inference_serving  # noqa: E402
from traced_process import (  # noqa: E402
    A100_40GB,
    A100_80GB,
    CU_MEM_ALLOC,
    FREE_API,
    H100_80GB,
    HOST_ALLOC,
    LAUNCH,
    MALLOC_ARRAY,
    MALLOC_ASYNC,
    MALLOC_MANAGED,
    MALLOC,
    SET_DEVICE,
    STREAM_SYNC,
    SYNC,
    GiB,
    KiB,
    MiB,
    Process,
    Thread,
    Trace,
    Block,
    log_uniform,
)

from nsysfrag.testing.nsys_export import ARRAY, DEVICE, MANAGED, PINNED, ExportOptions, Gpu  # noqa: E402


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
        """Per layer, saved for backward: ln1 and its statistics (fp32 mean and rstd per
        token), qkv, the attention output and its softmax log-sum-exp (fp32 per token and head),
        ln2 and its statistics, fc1, gelu (fp16). The statistics and the log-sum-exp are under a
        page: the driver packs them into shared chunks."""
        d, heads = self.d_model, self.d_model // 128
        return [
            2 * tokens * d, 8 * tokens, 6 * tokens * d, 2 * tokens * d, 4 * tokens * heads,
            2 * tokens * d, 8 * tokens, 8 * tokens * d, 8 * tokens * d,
        ]  # fmt: skip


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
                            if i == 2:  # after qkv
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
        devices={0: (A100_80GB.total_memory, 0x7F3A_0000_0000)},
    )
    model = Transformer(layers=6, d_model=2048, vocab=32_000, batch=24)
    _train(proc.main, model, steps=30, seq_lengths=(640, 768, 896, 1024))
    return trace.write(
        "training_loop.sqlite",
        [Gpu(0, *A100_80GB)],
        ExportOptions(processes=[(2817, "python3")], cuda_devices=[(2817, 0, 0)]),
    )


# --- random churn with every anomaly ---


def churn_anomalies() -> Path:
    trace = Trace()
    pid = 5120
    proc = Process(
        trace,
        pid,
        seed=3,
        # nsys stamps the first few calls before the session's zero.
        start_ns=-160_000,
        devices={0: (A100_40GB.total_memory, 0x7F21_4000_0000)},
        host_top=0x7E21_0000_0000,
    )
    rng, t = proc.rng, proc.main
    dev = proc.heaps[0]
    io = Thread(proc, pid + 7)
    # cudaMallocAsync serves from the device's default pool; nsys writes the pool's figures on
    # each of its rows.
    pool = MemoryPool(dev, va_bytes=8 * GiB)

    # Blocks allocated before the capture started: their frees will be unmatched.
    before_capture = []
    for n in (256 * KiB, 8 * MiB, 2 * MiB + 512, 64 * MiB, 3 * KiB):
        before_capture.append(dev.malloc(n))
        proc.blocks[before_capture[-1]] = Block(dev, 0, DEVICE, n, FREE_API)

    with t.range("init"):
        t.call(SET_DEVICE, 1, 3)
        with t.range("load_module"):
            # Static __device__ symbols are reported when their module loads, 256 B apart.
            t.load_module([112, 16, 16, 64 * KiB, 4 * KiB, 1 * MiB])
        first = t.malloc(1 * MiB)
        t.launch(1)

    # With lazy module loading the first launch of another module loads it, statics included.
    t.load_module([32 * KiB], api=LAUNCH, us=90)

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
                api = rng.choice(apis)
                nbytes = log_uniform(rng, 256, 96 * MiB)
                on_pool = pool if api == MALLOC_ASYNC else None
                live.append(thread.malloc(nbytes, api=api, pool=on_pool))
        if i % 40 == 39:
            # A synchronization trims the pool to what its blocks use.
            t.call(STREAM_SYNC, 20, 200)
            pool.trim()

        if i in (40, 310, 640, 905, 1210) and before_capture:
            with t.range("cleanup_stale"):
                t.free(before_capture.pop())
        if i in (120, 700, 1100):
            # The free of a live block goes unrecorded, then the driver maps a new block on its
            # pages: same address and size, same address and half the size, a page inside it.
            victim = max(
                (a for a in live if proc.blocks[a].pool is None),
                key=lambda a: proc.blocks[a].nbytes,
            )
            live.remove(victim)
            size = proc.blocks[victim].nbytes
            t.free(victim, recorded=False)
            offset = {120: 0, 700: 0, 1100: round_up(size // 3, PAGE)}[i]
            with t.range("reuse_after_missed_free"):
                nbytes = size if i == 120 else (size - offset) // 2
                assert nbytes >= PAGE, "the victim is a large block"
                live.append(t.malloc(nbytes, at=victim + offset))
        if i in (90, 450, 451, 1000):
            with t.range("empty_batch"):
                t.malloc(0)
        if i in (260, 261, 262, 980, 1150):
            with t.range("huge_request"):
                api = {980: CU_MEM_ALLOC, 1150: MALLOC_ASYNC}.get(i, MALLOC)
                try:
                    t.malloc(48 * GiB, api=api, pool=pool if api == MALLOC_ASYNC else None)
                except OutOfMemory:
                    pass  # more than the device has: the driver refuses it
                else:
                    raise AssertionError("a 48 GiB request on a 40 GB device succeeded")
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
        # One virtual address space for both devices (unified addressing): disjoint windows.
        devices={
            0: (H100_80GB.total_memory, base),
            1: (A100_80GB.total_memory, base - 0x200_0000_0000),
        },
    )
    rank1 = Process(
        trace,
        4102,
        seed=42,
        start_ns=905_500_000,
        devices={0: (A100_80GB.total_memory, base)},
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
            t, model, steps=20, seq_lengths=(512, 768, 1024), between_steps=hook, all_reduce=True
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
        devices={0: (A100_80GB.total_memory, 0x7F0E_8000_0000)},
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the sample nsys exports.")
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write them in")
    traced_process.OUT_DIR = parser.parse_args(argv).out
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

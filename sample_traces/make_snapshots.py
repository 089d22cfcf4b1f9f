"""Regenerate the sample PyTorch memory snapshots in this folder.

``torch.cuda.memory._dump_snapshot()`` pickles a dict of plain data; these samples are the same
dict built without torch or a GPU, so anyone can run the demo. A small re-implementation of the
PyTorch caching allocator (ALLOCATORS.md §1: ``round_size``, small and large pools, 2 MiB /
20 MiB / rounded segments, best fit by (size, address), split rules, merging with free
neighbours in the same segment, ``empty_cache``, the OOM path, ``garbage_collection_threshold``
with a memory fraction, expandable segments mapped in 2 MiB / 20 MiB pages) serves a scripted
workload and records the trace PyTorch would record:

* ``alloc`` / ``free_requested`` / ``free_completed`` with the requested bytes, and frees of
  blocks used on a side stream completed only at the next allocation (``record_stream``);
* ``segment_alloc`` / ``segment_free`` (native) or ``segment_map`` / ``segment_unmap``
  (expandable segments), and ``oom`` with ``device_free`` where a request does not fit;
* stacks like ``_record_memory_history(stacks="all")``: C++ frames first, then Python frames
  innermost first; autograd backward allocations have C++ frames only.

The trace is kept as a ring buffer of ``MAX_ENTRIES`` entries, as PyTorch does, so each window
starts mid-run with weights and optimizer state allocated before it. The keys follow PyTorch
2.6 (``allocator_settings``, ``external_annotations``, ``compile_context``). Every workload has
a fixed seed; the files are reproducible byte for byte (pickle protocol 4). Run from the
repository root::

    .venv/bin/python sample_traces/make_snapshots.py
"""

from __future__ import annotations

import math
import pickle
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# CUDACachingAllocator constants (ALLOCATORS.md §1.1).
MIN_BLOCK = 512
SMALL_SIZE = 1 * MiB
SMALL_BUFFER = 2 * MiB
LARGE_BUFFER = 20 * MiB
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB
PAGE = {"small": SMALL_BUFFER, "large": LARGE_BUFFER}  # expandable-segment page sizes
MAX_ENTRIES = 8000
T0_US = 1_757_000_000_000_000  # a plausible time_us: microseconds since the epoch

Frames = list[dict[str, Any]]


def round_size(n: int) -> int:
    return MIN_BLOCK if n < MIN_BLOCK else -(-n // MIN_BLOCK) * MIN_BLOCK


def allocation_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class OutOfMemory(Exception):
    pass


@dataclass(eq=False)
class Block:
    address: int
    size: int
    pool: str
    segment: int  # native: the segment's address; expandable: the pool's VA base
    allocated: bool = False
    pending: bool = False  # free_requested, waiting for the side stream
    requested: int = 0
    frames: Frames = field(default_factory=list)
    gc_base: int = 0  # the pool's get_free_block count when the block was last cached

    @property
    def end(self) -> int:
        return self.address + self.size

    @property
    def reusable(self) -> bool:
        return not self.allocated and not self.pending


class CachingAllocator:
    """Just enough of PyTorch's native caching allocator (one device, one stream)."""

    def __init__(
        self,
        capacity: int,
        context_bytes: int,
        expandable: bool,
        va_base: int,
        memory_fraction: float | None = None,
        gc_threshold: float = 0.0,
        faithful: bool = False,
    ) -> None:
        self.capacity = capacity
        self.usable = capacity - context_bytes  # the CUDA context takes the rest
        # torch.cuda.set_per_process_memory_fraction: the allocator itself refuses beyond this.
        self.allowed = int(memory_fraction * capacity) if memory_fraction else None
        self.limit = min(self.usable, self.allowed) if self.allowed else self.usable
        # garbage_collection_threshold works only with a memory fraction set.
        self.gc_threshold = gc_threshold
        self.gc = bool(self.allowed) and gc_threshold > 0
        self.free_calls = {"small": 0, "large": 0}  # get_free_block calls: the GC's clock
        # Expandable segments as PyTorch searches them (get_free_block's growth rule,
        # find_expandable_block's chains). The samples made before this was written use a
        # simpler search, kept so that those files stay the same byte for byte.
        self.faithful = faithful
        self.expandable = expandable
        self.now_us = T0_US
        self.blocks: dict[int, Block] = {}
        self.ends: dict[int, Block] = {}
        self.segments: dict[int, int] = {}  # native: address -> size
        self.reserved = 0
        self.trace: list[dict[str, Any]] = []
        self.pending: list[Block] = []
        self.va_base = va_base
        # Expandable: one VA reservation per pool, 1.125 x the device, mapped page by page.
        # A reservation is (base, mapped flag per page); a pool takes another when no unmapped
        # range of its reservations fits a request (a new ExpandableSegment).
        # PyTorch reserves 1.125 x the device; the faithful samples reserve 4 x, so that a
        # sample under pressure shows the OOM path rather than an exhausted reservation.
        va = (4 if faithful else 1.125) * capacity
        self.va_pages = {p: math.ceil(va / PAGE[p]) for p in PAGE}
        self.reservations: dict[str, list[tuple[int, list[bool]]]] = {
            p: [(base, [False] * self.va_pages[p])]
            for p, base in (("small", va_base), ("large", va_base + 64 * GiB))
        }

    @property
    def allocated(self) -> int:
        return sum(b.size for b in self.blocks.values() if b.allocated or b.pending)

    # -- time and the trace

    def tick(self, us: float) -> None:
        self.now_us += max(1, int(us))

    def _record(self, action: str, addr: int, size: int, frames: Frames, **extra: Any) -> None:
        self.tick(2)
        entry: dict[str, Any] = {"action": action}
        if action == "oom":
            entry["device_free"] = extra["device_free"]
        else:
            entry["addr"] = addr
        entry.update(size=size, stream=0, time_us=self.now_us, compile_context="N/A", frames=frames)
        self.trace.append(entry)

    # -- blocks

    def _add(self, b: Block) -> None:
        self.blocks[b.address] = b
        self.ends[b.end] = b

    def _drop(self, b: Block) -> None:
        del self.blocks[b.address]
        del self.ends[b.end]

    def _merge(self, b: Block) -> Block:
        prev = self.ends.get(b.address)
        if prev is not None and prev.reusable and prev.segment == b.segment and prev.pool == b.pool:
            self._drop(prev)
            self._drop(b)
            b = Block(prev.address, prev.size + b.size, b.pool, b.segment)
            self._add(b)
        nxt = self.blocks.get(b.end)
        if nxt is not None and nxt.reusable and nxt.segment == b.segment and nxt.pool == b.pool:
            self._drop(nxt)
            self._drop(b)
            b = Block(b.address, b.size + nxt.size, b.pool, b.segment)
            self._add(b)
        return b

    def _best_fit(self, pool: str, size: int) -> Block | None:
        fits = [b for b in self.blocks.values() if b.pool == pool and b.reusable and b.size >= size]
        if not fits:
            return None
        fits.sort(key=lambda b: (b.size, b.address))
        if not (self.expandable and self.faithful):
            return fits[0]
        # get_free_block with expandable segments: a block followed by unmapped pages counts as
        # that much larger, so walk on while the next candidate would grow less.
        k = 0
        while k + 1 < len(fits) and self._growable(fits[k + 1]) < self._growable(fits[k]):
            k += 1
        return fits[k]

    def _growable(self, b: Block) -> int:
        """The block's size plus the unmapped pages right after it."""
        page = PAGE[b.pool]
        mapped = next(m for s, m in self.reservations[b.pool] if s == b.segment)
        k = (b.end - b.segment) // page
        if (b.end - b.segment) % page:
            return b.size
        n = 0
        while k + n < len(mapped) and not mapped[k + n]:
            n += 1
        return b.size + n * page

    # -- the public calls

    def malloc(self, nbytes: int, frames: Frames) -> Block:
        self._process_events()
        size = round_size(nbytes)
        pool = "small" if size <= SMALL_SIZE else "large"
        if self.gc:
            self.free_calls[pool] += 1
        block = self._best_fit(pool, size)
        if block is None:
            block = self._grow(pool, size, frames)
        remaining = block.size - size
        split = (
            remaining >= MIN_BLOCK if pool == "small" or self.expandable else remaining > SMALL_SIZE
        )
        if split:
            self._drop(block)
            rest = Block(block.address + size, remaining, pool, block.segment)
            rest.gc_base = self.free_calls[pool]
            block = Block(block.address, size, pool, block.segment)
            self._add(block)
            self._add(rest)
        block.allocated, block.requested, block.frames = True, nbytes, frames
        self._record("alloc", block.address, nbytes, frames)
        return block

    def free(self, block: Block, side_stream: bool = False) -> None:
        """``del tensor``: completed now, or at the next malloc when another stream used it."""
        block.allocated = False
        self._record("free_requested", block.address, block.requested, block.frames)
        if side_stream:
            block.pending = True
            self.pending.append(block)
        else:
            self._free_block(block)

    def empty_cache(self) -> None:
        self._release_cached()

    # -- internals

    def _free_block(self, block: Block) -> None:
        self._record("free_completed", block.address, block.requested, block.frames)
        block.pending = False
        block.requested, block.frames = 0, []
        merged = self._merge(block)
        merged.gc_base = self.free_calls[merged.pool]

    def _process_events(self) -> None:
        pending, self.pending = self.pending, []
        for b in pending:
            self._free_block(b)

    def _grow(self, pool: str, size: int, frames: Frames) -> Block:
        if self.gc:
            self._garbage_collect()
        for attempt in range(2):
            block = self._map(pool, size) if self.expandable else self._cuda_malloc(pool, size)
            if block is not None:
                return block
            if attempt == 0:
                self._release_cached()
        device_free = self.usable - self.reserved
        self._record("oom", 0, size, frames, device_free=device_free)
        raise OutOfMemory(f"tried to allocate {size} bytes")

    def _cuda_malloc(self, pool: str, size: int) -> Block | None:
        alloc = allocation_size(size)
        if self.reserved + alloc > self.limit:
            return None
        # The driver hands out the lowest free 2 MiB-aligned range of its VA window.
        address = self.va_base
        for start in sorted(self.segments):
            if address + alloc <= start:
                break
            address = max(address, -(-(start + self.segments[start]) // (2 * MiB)) * (2 * MiB))
        self.segments[address] = alloc
        self.reserved += alloc
        self._record("segment_alloc", address, alloc, [])
        block = Block(address, alloc, pool, address)
        self._add(block)
        return block

    def _map(self, pool: str, size: int) -> Block | None:
        """find_expandable_block + map_block: the lowest unmapped run that, with the free
        mapped block just below it, holds ``size`` (in a new reservation when none does); map
        whole pages."""
        if self.faithful:
            return self._map_chain(pool, size)
        page = PAGE[pool]
        for base, mapped in self.reservations[pool]:
            i = 0
            while i < len(mapped):
                if mapped[i]:
                    i += 1
                    continue
                j = i
                while j < len(mapped) and not mapped[j]:
                    j += 1
                start = base + i * page
                below = self.ends.get(start)
                have = (
                    start - below.address
                    if below is not None and below.reusable and below.segment == base
                    else 0
                )
                need = math.ceil((size - have) / page)
                if need <= j - i:
                    return self._map_pages(pool, base, mapped, i, need)
                i = j
        last_base, last = self.reservations[pool][-1]
        base = last_base + (len(last) + 1) * page
        self.reservations[pool].append((base, [False] * self.va_pages[pool]))
        return self._map(pool, size)

    def _chain(self, pool: str, base: int, mapped: list[bool], at: int, size: int) -> int:
        """Bytes of the free mapped blocks and unmapped runs that follow one another from
        ``at``, counted until ``size`` is reached (has_available_address_space)."""
        page, total = PAGE[pool], 0
        while total < size:
            b = self.blocks.get(at)
            if b is not None:
                if not b.reusable:
                    break
                total, at = total + b.size, b.end
                continue
            k = (at - base) // page
            if (at - base) % page or k >= len(mapped) or mapped[k]:
                break
            while k < len(mapped) and not mapped[k]:
                total, k = total + page, k + 1
            at = base + k * page
        return total

    def _map_chain(self, pool: str, size: int) -> Block | None:
        """PyTorch's find_expandable_block and try_allocate_expandable_block: the lowest
        unmapped run that, starting from the free block just below it, begins a chain of free
        and unmapped memory holding ``size``; map pages of its unmapped runs, one map per run,
        until the free block there holds ``size``."""
        page = PAGE[pool]
        found = None
        for base, mapped in self.reservations[pool]:
            for k in range(len(mapped)):
                if mapped[k] or (k > 0 and not mapped[k - 1]):
                    continue  # not the start of an unmapped run
                at = base + k * page
                below = self.ends.get(at)
                if below is not None and below.reusable and below.segment == base:
                    at = below.address
                if self._chain(pool, base, mapped, at, size) >= size:
                    found = (base, mapped, at)
                    break
            if found:
                break
        if found is None:
            last_base, last = self.reservations[pool][-1]
            base = last_base + (len(last) + 1) * page
            self.reservations[pool].append((base, [False] * self.va_pages[pool]))
            return self._map_chain(pool, size)
        base, mapped, at = found
        block = self.blocks.get(at)
        while block is None or block.size < size:
            start = at if block is None else block.end  # the unmapped run to map from
            k = (start - base) // page
            run = 0
            while k + run < len(mapped) and not mapped[k + run]:
                run += 1
            want = size if block is None else size - block.size
            need = math.ceil(min(want, run * page) / page)
            block = self._map_pages(pool, base, mapped, k, need)
            if block is None:
                return None
        return block

    def _map_pages(self, pool: str, base: int, mapped: list[bool], i: int, need: int) -> Block | None:
        page = PAGE[pool]
        if self.reserved + need * page > self.limit:
            return None
        for k in range(i, i + need):
            mapped[k] = True
        start = base + i * page
        self.reserved += need * page
        self._record("segment_map", start, need * page, [])
        fresh = Block(start, need * page, pool, base)
        self._add(fresh)
        return self._merge(fresh)

    def _release_cached(self) -> None:
        self._process_events()
        free = sorted(
            (b for b in self.blocks.values() if b.reusable),
            key=lambda b: (b.pool != "large", b.size, b.address),
        )
        for b in free:
            if self.expandable:
                self._unmap(b)
            elif self.segments.get(b.address) == b.size:
                self._drop(b)
                del self.segments[b.address]
                self.reserved -= b.size
                self._record("segment_free", b.address, b.size, [])

    def _garbage_collect(self) -> None:
        """garbage_collect_cached_blocks: while reserved is above the threshold, free the whole
        large-pool segments cached at least as long as the average (in get_free_block calls),
        pass after pass, until enough is freed or a pass frees nothing."""
        threshold = self.gc_threshold * (self.allowed or 0)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        whole = [
            b for b in self.blocks.values()
            if b.reusable and b.pool == "large" and self.segments.get(b.address) == b.size
        ]  # fmt: skip
        age = {b.address: self.free_calls["large"] - b.gc_base for b in whole}
        total, freeable, reclaimed, freed = sum(age.values()), len(whole), 0, True
        while reclaimed < target and freed and freeable > 0:
            mean = total / freeable
            freed = False
            for b in sorted(whole, key=lambda b: (b.size, b.address)):
                if b.address in self.segments and age[b.address] >= mean:
                    freed = True
                    reclaimed += b.size
                    total -= age[b.address]
                    freeable -= 1
                    self._drop(b)
                    del self.segments[b.address]
                    self.reserved -= b.size
                    self._record("segment_free", b.address, b.size, [])

    def _unmap(self, b: Block) -> None:
        page, base = PAGE[b.pool], b.segment
        mapped = next(m for s, m in self.reservations[b.pool] if s == base)
        first = -(-(b.address - base) // page)
        last = (b.end - base) // page
        if first >= last:
            return
        lo, hi = base + first * page, base + last * page
        self._drop(b)
        if b.address < lo:
            self._add(Block(b.address, lo - b.address, b.pool, b.segment))
        if hi < b.end:
            self._add(Block(hi, b.end - hi, b.pool, b.segment))
        for k in range(first, last):
            mapped[k] = False
        self.reserved -= hi - lo
        self._record("segment_unmap", lo, hi - lo, [])

    # -- the snapshot

    def snapshot(self, settings_conf: str) -> dict[str, Any]:
        return {
            "segments": self._segments(),
            "device_traces": [self.trace[-MAX_ENTRIES:]],
            "allocator_settings": {
                "PYTORCH_CUDA_ALLOC_CONF": settings_conf,
                "max_split_size": -1,
                "garbage_collection_threshold": self.gc_threshold,
                "expandable_segments": self.expandable,
                "pinned_num_register_threads": 1,
                "release_lock_on_cudamalloc": False,
                "pinned_use_cuda_host_register": False,
                "roundup_power2_divisions": {str(1 << k): 0 for k in range(16)},
            },
            "external_annotations": [],
        }

    def _segments(self) -> list[dict[str, Any]]:
        ranges: list[tuple[int, int, str]] = []
        if self.expandable:
            for pool, reservations in self.reservations.items():
                for base, mapped in reservations:
                    k = 0
                    while k < len(mapped):
                        if mapped[k]:
                            j = k
                            while j < len(mapped) and mapped[j]:
                                j += 1
                            ranges.append((base + k * PAGE[pool], (j - k) * PAGE[pool], pool))
                            k = j
                        else:
                            k += 1
        else:
            for address, size in self.segments.items():
                ranges.append((address, size, self.blocks[address].pool))
        out = []
        for address, size, pool in sorted(ranges):
            blocks = sorted(
                (b for b in self.blocks.values() if address <= b.address < address + size),
                key=lambda b: b.address,
            )
            out.append({
                "device": 0,
                "address": address,
                "total_size": size,
                "allocated_size": sum(b.size for b in blocks if b.allocated),
                "active_size": sum(b.size for b in blocks if b.allocated or b.pending),
                "requested_size": sum(b.requested for b in blocks if b.allocated or b.pending),
                "stream": 0,
                "segment_type": pool,
                "segment_pool_id": (0, 0),
                "is_expandable": self.expandable,
                "frames": [],
                "blocks": [
                    {
                        "address": b.address,
                        "size": b.size,
                        "requested_size": b.requested,
                        "state": "active_allocated" if b.allocated
                        else "active_pending_free" if b.pending else "inactive",
                        "frames": b.frames,
                    }
                    for b in blocks
                ],
            })  # fmt: skip
        return out


# ---------------------------------------------------------------- stacks


_CPP_ALLOC: Frames = [
    {"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
    {"name": "torch::CapturedTraceback::gather(bool, bool, bool)", "filename": "??", "line": 0},
    {"name": "torch::cuda::(anonymous namespace)::gather_with_cpp()", "filename": "memory_snapshot.cpp", "line": 0},
    {"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)",
     "filename": "CUDACachingAllocator.cpp", "line": 0},
    {"name": "at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)", "filename": "??", "line": 0},
]  # fmt: skip
_TORCH_PY = "/opt/conda/lib/python3.11/site-packages/torch"
_PYTHON_TAIL: Frames = [
    {"name": "_PyEval_EvalFrameDefault", "filename": "/usr/local/src/conda/python-3.11.9/Python/ceval.c", "line": 5140},
    {"name": "PyEval_EvalCode", "filename": "/usr/local/src/conda/python-3.11.9/Python/ceval.c", "line": 1148},
    {"name": "_start", "filename": "??", "line": 0},
]  # fmt: skip


class Stacks:
    """One frames list per call site, shared by every entry from it (as small as pickle allows)."""

    def __init__(self, project: str) -> None:
        self.project = project
        self._cache: dict[tuple[Any, ...], Frames] = {}

    def py(
        self, *calls: tuple[str, int, str], torch_frames: tuple[tuple[str, int, str], ...] = ()
    ) -> Frames:
        """C++ frames, then ``torch_frames`` (inside torch/), then the user's ``calls``,
        innermost first; ``calls`` name files relative to the project."""
        key = ("py", calls, torch_frames)
        if key not in self._cache:
            frames = list(_CPP_ALLOC)
            for filename, line, name in torch_frames:
                frames.append({"name": name, "filename": f"{_TORCH_PY}/{filename}", "line": line})
            for filename, line, name in calls:
                frames.append(
                    {"name": name, "filename": f"{self.project}/{filename}", "line": line}
                )
            frames.extend(_PYTHON_TAIL)
            self._cache[key] = frames
        return self._cache[key]

    def autograd(self, node: str) -> Frames:
        """A backward allocation on the autograd engine's thread: no Python frame at all."""
        key = ("autograd", node)
        if key not in self._cache:
            self._cache[key] = [
                *_CPP_ALLOC,
                {"name": f"torch::autograd::generated::{node}::apply(std::vector<at::Tensor>&&)",
                 "filename": "Functions.cpp", "line": 0},
                {"name": "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)",
                 "filename": "??", "line": 0},
                {"name": "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
                 "filename": "??", "line": 0},
                {"name": "__clone", "filename": "??", "line": 0},
            ]  # fmt: skip
        return self._cache[key]


LINEAR = (("nn/modules/linear.py", 125, "forward"), ("nn/modules/module.py", 1747, "_call_impl"))
ADAM = (("optim/adam.py", 537, "_multi_tensor_adam"), ("optim/adam.py", 247, "step"),
        ("optim/optimizer.py", 487, "wrapper"))  # fmt: skip


# ---------------------------------------------------------------- workloads


def training_loop() -> dict[str, Any]:
    """Eight transformer layers trained for 14 steps on an 80 GB GPU, sequence length bucketed
    per step (1024/1536/2048 tokens): zero_grad(set_to_none=True) frees every .grad, so the
    next backward allocates them again between activations that are still live."""
    rng = random.Random(20250611)
    a = CachingAllocator(85_899_345_920, 600 * MiB, expandable=False, va_base=0x7F2A_0000_0000)
    st = Stacks("/workspace/gpt")
    layers, h, vocab, batch = 8, 2048, 32000, 4
    params: list[tuple[str, int]] = [("embedding", vocab * h * 2)]
    for i in range(layers):
        params += [(f"h{i}.ln1", h * 2), (f"h{i}.qkv", 3 * h * h * 2), (f"h{i}.qkv_b", 3 * h * 2),
                   (f"h{i}.proj", h * h * 2), (f"h{i}.ln2", h * 2), (f"h{i}.fc1", 4 * h * h * 2),
                   (f"h{i}.fc1_b", 4 * h * 2), (f"h{i}.fc2", 4 * h * h * 2)]  # fmt: skip
    params.append(("ln_f", h * 2))
    init = st.py(
        ("model.py", 211, "__init__"),
        ("train.py", 40, "main"),
        torch_frames=(("nn/modules/module.py", 1355, "convert"),),
    )
    for _, n in params:  # the weights, loaded before the trace window
        a.malloc(n, init)
    a.tick(2e6)
    grads: list[Block] = []
    exp_avg: list[Block] = []
    for step in range(14):
        seq = rng.choice((1024, 1536, 2048))
        act = batch * seq * h * 2
        tokens = a.malloc(
            batch * seq * 8, st.py(("train.py", 58, "train_step"), ("train.py", 97, "main"))
        )
        a.tick(50)
        saved: list[list[Block]] = []
        x = a.malloc(act, st.py(("model.py", 190, "forward"), ("train.py", 61, "train_step")))
        a.free(tokens, side_stream=True)  # copied in on the loader's stream
        for i in range(layers):
            fwd = lambda line, n, name="forward": a.malloc(
                n,
                st.py(
                    ("model.py", line, name),
                    ("model.py", 196, "forward"),
                    ("train.py", 61, "train_step"),
                    torch_frames=LINEAR,
                ),
            )
            ln1 = fwd(88, act)
            stats = fwd(88, batch * seq * 8)  # layer-norm mean / rstd
            qkv = fwd(92, 3 * act)
            attn = fwd(97, act, "attention")
            lse = fwd(97, batch * 16 * seq * 4, "attention")
            proj = fwd(101, act)
            x2 = fwd(102, act)
            ln2 = fwd(120, act)
            fc1 = fwd(121, 4 * act)
            gelu = fwd(122, 4 * act)
            fc2 = fwd(123, act)
            x3 = fwd(124, act)
            saved.append([x, ln1, stats, qkv, attn, lse, proj, ln2, fc1, gelu, fc2])
            a.free(x2)
            x = x3
            a.tick(rng.uniform(800, 1500))
        logits = a.malloc(
            batch * seq * vocab * 2,
            st.py(
                ("model.py", 201, "forward"), ("train.py", 61, "train_step"), torch_frames=LINEAR
            ),
        )
        loss = a.malloc(4, st.py(("train.py", 62, "train_step"), ("train.py", 97, "main")))
        a.tick(3000)
        # backward, on the autograd thread: gradients of activations, then of weights
        g_logits = a.malloc(batch * seq * vocab * 2, st.autograd("LogSoftmaxBackward0"))
        a.free(logits)
        g_x = a.malloc(act, st.autograd("MmBackward0"))
        a.free(g_logits)
        a.free(x)
        first = not grads
        new_grads: dict[int, Block] = {}
        for i in reversed(range(layers)):
            x_in, ln1, stats, qkv, attn, lse, proj, ln2, fc1, gelu, fc2 = saved[i]
            base = 1 + 8 * i
            g_h = a.malloc(4 * act, st.autograd("MmBackward0"))
            new_grads[base + 7] = a.malloc(params[base + 7][1], st.autograd("MmBackward0"))
            a.free(fc2)
            g_gelu = a.malloc(4 * act, st.autograd("GeluBackward0"))
            a.free(g_h)
            a.free(gelu)
            new_grads[base + 5] = a.malloc(params[base + 5][1], st.autograd("MmBackward0"))
            new_grads[base + 6] = a.malloc(params[base + 6][1], st.autograd("SumBackward1"))
            g_ln2 = a.malloc(act, st.autograd("MmBackward0"))
            a.free(g_gelu)
            a.free(fc1)
            new_grads[base + 4] = a.malloc(
                params[base + 4][1], st.autograd("NativeLayerNormBackward0")
            )
            g_res = a.malloc(act, st.autograd("NativeLayerNormBackward0"))
            a.free(g_ln2)
            a.free(ln2)
            new_grads[base + 3] = a.malloc(params[base + 3][1], st.autograd("MmBackward0"))
            g_attn = a.malloc(act, st.autograd("MmBackward0"))
            a.free(proj)
            g_qkv = a.malloc(3 * act, st.autograd("ScaledDotProductFlashAttentionBackward0"))
            a.free(g_attn)
            a.free(attn)
            a.free(lse)
            new_grads[base + 1] = a.malloc(params[base + 1][1], st.autograd("MmBackward0"))
            new_grads[base + 2] = a.malloc(params[base + 2][1], st.autograd("SumBackward1"))
            g_in = a.malloc(act, st.autograd("MmBackward0"))
            a.free(g_qkv)
            a.free(qkv)
            new_grads[base] = a.malloc(params[base][1], st.autograd("NativeLayerNormBackward0"))
            a.free(ln1)
            a.free(stats)
            a.free(g_res)
            a.free(x_in)
            a.free(g_x)
            g_x = g_in
            a.tick(rng.uniform(1500, 2500))
        new_grads[0] = a.malloc(params[0][1], st.autograd("EmbeddingBackward0"))
        new_grads[len(params) - 1] = a.malloc(
            params[-1][1], st.autograd("NativeLayerNormBackward0")
        )
        a.free(g_x)
        a.free(loss)
        grads = [new_grads[k] for k in sorted(new_grads)]
        # optimizer.step(): Adam's state appears on the first step, foreach temporaries every step
        for k, (_, n) in enumerate(params):
            if first:
                exp_avg.append(
                    a.malloc(
                        2 * n,
                        st.py(
                            ("train.py", 71, "train_step"),
                            torch_frames=(("optim/adam.py", 172, "_init_group"),) + ADAM[1:],
                        ),
                    )
                )
                exp_avg.append(
                    a.malloc(
                        2 * n,
                        st.py(
                            ("train.py", 71, "train_step"),
                            torch_frames=(("optim/adam.py", 175, "_init_group"),) + ADAM[1:],
                        ),
                    )
                )
            tmp = a.malloc(2 * n, st.py(("train.py", 71, "train_step"), torch_frames=ADAM))
            upd = a.malloc(n, st.py(("train.py", 71, "train_step"), torch_frames=ADAM))
            a.free(tmp)
            a.free(upd)
        a.tick(5000)
        for g in grads:  # optimizer.zero_grad(set_to_none=True)
            a.free(g)
        a.tick(rng.uniform(2e4, 4e4))
    # The next batch, prefetched on the loader's stream and dropped: still pending at the dump.
    prefetch = a.malloc(
        batch * 2048 * 8, st.py(("data.py", 33, "prefetch"), ("train.py", 99, "main"))
    )
    a.free(prefetch, side_stream=True)
    return a.snapshot("")


def inference_loop(expandable: bool) -> dict[str, Any]:
    """A 16-layer, 3B-class model serving 60 requests of random prompt (32–3000 tokens) and
    output (8–48 tokens) length on a 16 GiB GPU, up to four in flight, finishing in random
    order; each request pre-allocates its KV cache. Request 57 asks for a 60,000-token prompt:
    the allocator releases its cache and still runs out of memory (OOM), the server frees that
    request, calls empty_cache() and goes on."""
    rng = random.Random(20250612)
    conf = "expandable_segments:True" if expandable else ""
    a = CachingAllocator(16 * GiB, 512 * MiB, expandable=expandable, va_base=0x7F80_0000_0000)
    st = Stacks("/srv/llm")
    layers, h, vocab = 16, 3072, 32000
    kv_token = h * 2  # K or V of one token in one layer, fp16
    load = st.py(
        ("loader.py", 64, "load_weights"),
        ("server.py", 31, "main"),
        torch_frames=(("nn/modules/module.py", 1355, "convert"),),
    )
    weights = [a.malloc(vocab * h * 2, load)]
    for _ in range(layers):
        for n in (h * 2, 3 * h * h * 2, h * h * 2, h * 2, 4 * h * h * 2, 4 * h * h * 2):
            weights.append(a.malloc(n, load))
    a.tick(3e6)

    @dataclass
    class Request:
        prompt: int
        output: int
        kv: list[Block] = field(default_factory=list)
        done: int = 0

    def prefill(r: Request) -> None:
        cap = r.prompt + r.output
        at = lambda line, name: st.py(
            ("engine.py", line, name), ("server.py", 77, "step"), torch_frames=LINEAR
        )
        for _ in range(layers):
            r.kv.append(
                a.malloc(
                    cap * kv_token,
                    st.py(
                        ("kv_cache.py", 41, "allocate"),
                        ("engine.py", 120, "prefill"),
                        ("server.py", 77, "step"),
                    ),
                )
            )
            r.kv.append(
                a.malloc(
                    cap * kv_token,
                    st.py(
                        ("kv_cache.py", 42, "allocate"),
                        ("engine.py", 120, "prefill"),
                        ("server.py", 77, "step"),
                    ),
                )
            )
            temps: list[Block] = []
            try:  # an OOM unwinds the frame: its temporaries are freed
                temps.append(a.malloc(r.prompt * h * 2, at(131, "prefill")))
                temps.append(a.malloc(r.prompt * 3 * h * 2, at(133, "prefill")))
                a.free(temps.pop())
                temps.append(a.malloc(r.prompt * 4 * h * 2, at(137, "prefill")))
                a.free(temps.pop())
            finally:
                for b in reversed(temps):
                    a.free(b)
            a.tick(r.prompt * 0.2)

    def decode(r: Request) -> None:
        hidden = a.malloc(
            h * 2 * 4,
            st.py(("engine.py", 152, "decode"), ("server.py", 80, "step"), torch_frames=LINEAR),
        )
        logits = a.malloc(
            vocab * 4,
            st.py(("engine.py", 158, "decode"), ("server.py", 80, "step"), torch_frames=LINEAR),
        )
        probs = a.malloc(
            vocab * 4,
            st.py(
                ("sampling.py", 22, "sample"),
                ("engine.py", 160, "decode"),
                ("server.py", 80, "step"),
            ),
        )
        a.free(logits)
        a.free(hidden)
        a.free(probs)
        r.done += 1
        a.tick(rng.uniform(300, 600))

    def finish(r: Request) -> None:
        for b in r.kv:
            a.free(b)
        r.kv.clear()

    in_flight: list[Request] = []
    for n in range(60):
        prompt = 60_000 if n == 57 else int(rng.triangular(32, 3000, 400))
        r = Request(prompt, rng.randint(8, 48))
        try:
            prefill(r)
        except OutOfMemory:
            finish(r)
            a.empty_cache()
            a.tick(2e4)
            continue
        in_flight.append(r)
        while len(in_flight) >= (1 if n == 56 else 4):  # request 57 runs alone
            for q in list(in_flight):
                decode(q)
                if q.done >= q.output:
                    finish(q)
                    in_flight.remove(q)
            rng.shuffle(in_flight)
        a.tick(rng.uniform(1e3, 5e3))
    return a.snapshot(conf)


def generation_under_pressure(variant: str) -> dict[str, Any]:
    """A 16-layer, 2.5 GiB model reading long documents in chunks on an 8 GiB GPU (512 MiB
    taken by the CUDA context): each chunk of 512 tokens extends every layer's K and V cache by
    concatenation (a new, larger tensor; the old one is freed), so each new cache tensor is
    larger than any the cache holds, and near the device's limit cudaMalloc refuses again and
    again: each time the allocator frees its cached segments and retries (the OOM-retry path).
    Each document is longer than the last; one that does not fit (an ``oom``) is dropped and
    the reader starts again with short ones. A small summary per chunk lives to the document's
    end, between the cache tensors.

    ``variant``: "native" (the reader calls empty_cache() once, late in the window),
    "gc" (set_per_process_memory_fraction(0.9375), i.e. 7.5 GiB, and
    garbage_collection_threshold:0.5: the allocator's collector frees old cached segments
    before cudaMalloc; documents of random length, the last read until it does not fit and the
    snapshot dumped in the OOM handler) or "expandable" (expandable_segments:True: pages are
    mapped, and unmapped on the OOM path)."""
    rng = random.Random({"native": 20250614, "gc": 20250615, "expandable": 20250616}[variant])
    conf = {"native": "", "gc": "garbage_collection_threshold:0.5",
            "expandable": "expandable_segments:True"}[variant]  # fmt: skip
    a = CachingAllocator(
        8 * GiB, 512 * MiB, expandable=variant == "expandable", va_base=0x7FA0_0000_0000,
        faithful=True,
        memory_fraction=0.9375 if variant == "gc" else None,
        gc_threshold=0.5 if variant == "gc" else 0.0,
    )  # fmt: skip
    st = Stacks("/srv/reader")
    layers, h, vocab, chunk = 16, 2560, 32000, 512
    kv_token = h * 2  # K or V of one token in one layer, fp16
    load = st.py(("loader.py", 40, "load_weights"), ("reader.py", 22, "main"),
                 torch_frames=(("nn/modules/module.py", 1355, "convert"),))  # fmt: skip
    a.malloc(vocab * h * 2, load)
    for _ in range(layers):
        for n in (h * 2, 3 * h * h * 2, h * h * 2, h * 2, 4 * h * h * 2, 4 * h * h * 2):
            a.malloc(n, load)
    a.tick(3e6)
    at = lambda line, name: st.py(("model.py", line, name), ("reader.py", 57, "read"),
                                  torch_frames=LINEAR)  # fmt: skip
    cat = st.py(("cache.py", 31, "update"), ("model.py", 88, "attention"), ("reader.py", 57, "read"))
    longest = 40  # chunks in the next document: each is longer than the last
    record = 0  # the most chunks of any document so far
    while True:
        tokens = rng.randint(64, 4000)  # what the document's header leaves in the cache
        kv: list[Block] = []
        notes: list[Block] = []  # a summary of each chunk, kept to the document's end
        try:
            kv += [a.malloc(tokens * kv_token, cat) for _ in range(2 * layers)]
            for done in range(longest):
                tokens += chunk
                notes.append(a.malloc(rng.randint(2, 6) * MiB, at(92, "summarize")))
                for layer in range(layers):
                    hidden = a.malloc(chunk * h * 2, at(70, "forward"))
                    for k in (2 * layer, 2 * layer + 1):  # K and V: torch.cat([past, new])
                        grown = a.malloc(tokens * kv_token, cat)
                        a.free(kv[k])
                        kv[k] = grown
                    mlp = a.malloc(chunk * 4 * h * 2, at(77, "forward"))
                    a.free(mlp)
                    a.free(hidden)
                    a.tick(rng.uniform(300, 600))
                record = max(record, done + 1)
                if variant == "native" and len(a.trace) > 55_000:
                    a.empty_cache()  # after a checkpoint, once, late in the run
                    variant = "native, trimmed"
                if len(a.trace) >= 60_000 and done + 5 >= record and variant != "gc":
                    return a.snapshot(conf)  # dumped while a document near the limit is read
            if variant == "gc":  # documents of any length; the last one is read to the end
                longest = 10**6 if len(a.trace) >= 60_000 else rng.randint(20, 45)
            else:
                longest += rng.randint(3, 8)
        except OutOfMemory:  # the document does not fit: the reader starts over with short ones
            if variant == "gc" and len(a.trace) >= 60_000:
                return a.snapshot(conf)  # dumped by the OOM handler
            a.tick(5e3)
            longest = 40
        for b in kv + notes:
            if b.allocated:
                a.free(b)
        a.tick(rng.uniform(1e4, 3e4))


def offloaded_inference() -> dict[str, Any]:
    """A 32-layer, 7B-class model whose layers live in host memory, run on a 24 GiB GPU (512
    MiB taken by the CUDA context) that other processes share: the embeddings, the LM head and
    each request's K/V cache stay on the GPU; each layer's nine weight tensors are copied in
    before it runs and dropped after it, and the program then calls
    ``torch.cuda.empty_cache()`` so that the other processes can use the memory. Every layer
    allocates its segments again (about a dozen, each layer the same shapes), and every burst of
    ``segment_free`` is followed by a ``segment_alloc`` for the next layer's first weight, which
    one of the released segments could have held: no OOM, no retry, only the program's own
    releases. Prompts of 128 to 2048 tokens, a few decoded tokens each."""
    rng = random.Random(20250617)
    a = CachingAllocator(24 * GiB, 512 * MiB, expandable=False, va_base=0x7F60_0000_0000,
                         faithful=True)  # fmt: skip
    st = Stacks("/srv/offload")
    layers, h, inter, vocab = 32, 4096, 11008, 32000
    load = st.py(("offload.py", 48, "fetch_layer"), ("generate.py", 30, "run_layer"),
                 torch_frames=(("nn/modules/module.py", 1355, "to"),))  # fmt: skip
    at = lambda line, name: st.py(("model.py", line, name), ("generate.py", 31, "run_layer"),
                                  torch_frames=LINEAR)  # fmt: skip
    resident = st.py(("generate.py", 12, "main"))
    a.malloc(vocab * h * 2, resident)  # embeddings
    a.malloc(vocab * h * 2, resident)  # LM head
    shapes = [h * 2, h * h * 2, h * h * 2, h * h * 2, h * h * 2, h * 2,
              h * inter * 2, h * inter * 2, inter * h * 2]  # fmt: skip
    while True:
        prompt = rng.randint(128, 2048)
        kv = [a.malloc(prompt * h * 2, at(60, "allocate_cache")) for _ in range(2 * layers)]
        for tokens in [prompt] + [1] * rng.randint(1, 3):  # the prefill, then decoding
            hidden = a.malloc(tokens * h * 2, at(20, "embed"))
            for _ in range(layers):
                weights = [a.malloc(n, load) for n in shapes]
                qkv = a.malloc(3 * tokens * h * 2, at(71, "attention"))
                attn = a.malloc(tokens * h * 2, at(74, "attention"))
                a.free(qkv)
                gate = a.malloc(tokens * inter * 2, at(80, "mlp"))
                up = a.malloc(tokens * inter * 2, at(81, "mlp"))
                out = a.malloc(tokens * h * 2, at(82, "mlp"))
                for b in (gate, up, attn, hidden):
                    a.free(b)
                hidden = out
                a.tick(rng.uniform(800, 3000) * (tokens / 512 + 0.2))
                for b in weights:
                    a.free(b)
                a.empty_cache()  # give the layer's memory back to the other processes
                a.tick(200)
            a.free(hidden)
            if len(a.trace) >= 12_000:
                return a.snapshot("")
        for b in kv:
            a.free(b)
        a.empty_cache()
        a.tick(rng.uniform(1e4, 3e4))


SAMPLES: dict[str, Callable[[], dict[str, Any]]] = {
    "training_snapshot.pickle": training_loop,
    "inference_snapshot.pickle": lambda: inference_loop(expandable=False),
    "inference_expandable_snapshot.pickle": lambda: inference_loop(expandable=True),
    "pressure_snapshot.pickle": lambda: generation_under_pressure("native"),
    "pressure_gc_snapshot.pickle": lambda: generation_under_pressure("gc"),
    "pressure_expandable_snapshot.pickle": lambda: generation_under_pressure("expandable"),
    "empty_cache_snapshot.pickle": offloaded_inference,
}


def main() -> None:
    for name, build in SAMPLES.items():
        snapshot = build()
        data = pickle.dumps(snapshot, protocol=4)
        (HERE / name).write_bytes(data)
        trace = snapshot["device_traces"][0]
        actions: dict[str, int] = {}
        for e in trace:
            actions[e["action"]] = actions.get(e["action"], 0) + 1
        print(f"{name}: {len(data):,} bytes, {len(snapshot['segments'])} segments,"
              f" {len(trace)} trace entries {actions}")  # fmt: skip


if __name__ == "__main__":
    main()

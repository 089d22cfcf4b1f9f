"""How the fake devices react to ``PYTORCH_CUDA_ALLOC_CONF``, as PyTorch's caching allocator
does (CUDACachingAllocator.cpp, CUDAAllocatorConfig.cpp), so that ``nsysfrag record --try``
measures a real change on the fake:

- ``expandable_segments:True``: the generator's expandable segments (pages mapped on demand);
- ``max_split_size_mb:N``: blocks of N MiB or more are never split, a request below N never
  takes one, a request of N or more takes a cached block at most 20 MiB larger, and the OOM path
  frees such oversize blocks first;
- ``roundup_power2_divisions:N`` (or ``[MB:N,...,>:N]``): request sizes rounded up to the next
  of N steps between powers of two;
- ``garbage_collection_threshold:T``: the generator's collector, which PyTorch runs only once
  ``torch.cuda.set_per_process_memory_fraction`` has set a fraction (so does the fake);
- ``backend:cudaMallocAsync``: no caching at all (every tensor its own allocation, freed at
  once), and, as in PyTorch, no allocation history.

An option PyTorch does not know ends the program at initialization, as PyTorch's parser does.
Written apart from the allocator model it configures (``_devices``) and independently of
nsysfrag's own model of these rules, so that a round on the fake checks nsysfrag's what-if
against an implementation that is not its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

MiB = 1 << 20
LARGE_BUFFER = 20 * MiB
MIN_BLOCK = 512
DIVISION_INTERVALS = 16  # one per power of two from 1 MiB: PyTorch's kRoundUpPowerOfTwoIntervals
UNLIMITED = (1 << 63) - 1
KNOWN = (
    "backend", "expandable_segments", "max_split_size_mb", "max_non_split_rounding_mb",
    "roundup_power2_divisions", "garbage_collection_threshold", "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register", "pinned_num_register_threads",
)  # fmt: skip


@dataclass(frozen=True)
class AllocConf:
    text: str = ""
    backend: str = "native"
    expandable: bool = False
    max_split_size: int = UNLIMITED
    gc_threshold: float = 0.0
    divisions: tuple[int, ...] = (0,) * DIVISION_INTERVALS
    given: dict[str, str] = field(default_factory=dict)

    def settings(self) -> dict[str, Any]:
        """``allocator_settings`` of a snapshot, as PyTorch 2.6 records them."""
        return {
            "PYTORCH_CUDA_ALLOC_CONF": self.text,
            "max_split_size": -1 if self.max_split_size == UNLIMITED else self.max_split_size,
            "garbage_collection_threshold": self.gc_threshold,
            "expandable_segments": self.expandable,
            "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {str(1 << k): d for k, d in enumerate(self.divisions)},
        }


def parse(text: str) -> AllocConf:
    """PYTORCH_CUDA_ALLOC_CONF as PyTorch parses it; RuntimeError (PyTorch's words) when it
    would refuse it."""
    given: dict[str, str] = {}
    for item in _items(text):
        key, sep, value = item.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or key not in KNOWN:
            raise RuntimeError(f"Unrecognized CachingAllocator option: {key}")
        given[key] = value
    backend = given.get("backend", "native")
    if backend not in ("native", "cudaMallocAsync"):
        raise RuntimeError(f"Unknown allocator backend, options should be native or cudaMallocAsync, got {backend}")
    split = UNLIMITED
    if "max_split_size_mb" in given:
        mb = int(given["max_split_size_mb"])
        split = max(mb, LARGE_BUFFER // MiB) * MiB  # PyTorch raises it to kLargeBuffer
    gc = float(given.get("garbage_collection_threshold", "0"))
    if "garbage_collection_threshold" in given and not 0.0 < gc < 1.0:
        raise RuntimeError("garbage_collect_threshold too small, set it 0.0~1.0")
    return AllocConf(
        text=text,
        backend=backend,
        expandable=given.get("expandable_segments", "False").lower() == "true",
        max_split_size=split,
        gc_threshold=gc,
        divisions=_divisions(given.get("roundup_power2_divisions", "")),
        given=given,
    )


def _items(text: str) -> list[str]:
    items, cur, depth = [], "", 0
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return [i for i in items if i.strip()]


def _divisions(text: str) -> tuple[int, ...]:
    if not text:
        return (0,) * DIVISION_INTERVALS
    if not text.startswith("["):
        return (int(text),) * DIVISION_INTERVALS
    out, last = [0] * DIVISION_INTERVALS, -1
    for item in text[1:-1].split(","):
        key, _, value = item.partition(":")
        d = int(value)
        if key.strip() == ">":
            for i in range(last + 1, DIVISION_INTERVALS):
                out[i] = d
            continue
        index = min(int(key).bit_length() - 1, DIVISION_INTERVALS - 1)
        if last < 0:  # PyTorch: the first key's value holds for every interval below it too
            out[:index] = [d] * index
        out[index] = d
        last = index
    return tuple(out)


def round_size(conf: AllocConf, size: int) -> int:
    """CUDACachingAllocator's round_size with roundup_power2_divisions."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    interval = min(max(size.bit_length() - 21, 0), DIVISION_INTERVALS - 1)  # log2(size / 1 MiB)
    divisions = conf.divisions[interval]
    if divisions > 1 and size > MIN_BLOCK * divisions:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor // divisions
        if step == 0:
            return floor << 1
        return floor + math.ceil((size - floor) / step) * step
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def configure(allocator: Any, conf: AllocConf, module: Any) -> Any:
    """Give ``allocator`` (the generator's, ``module`` the generator) the conf's rules."""
    allocator.conf = conf
    allocator.gc_threshold = conf.gc_threshold
    cls = type(allocator)
    if cls not in _CONFIGURED:
        _CONFIGURED[cls] = type(f"Configured{cls.__name__}", (_Rules, cls), {"ms": module})
    allocator.__class__ = _CONFIGURED[cls]
    return allocator


_CONFIGURED: dict[type, type] = {}


def set_memory_fraction(allocator: Any, fraction: float) -> None:
    """torch.cuda.set_per_process_memory_fraction: the allocator refuses beyond it, and the
    garbage collector (when configured) starts working."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"invalid fraction: {fraction}. Please set within [0, 1].")
    allocator.allowed = int(fraction * allocator.capacity)
    allocator.limit = min(allocator.usable, allocator.allowed)
    allocator.gc = allocator.gc_threshold > 0


class _Rules:
    """The options' rules over the generator's allocator (its ``malloc`` with the size, the
    search and the split decided here)."""

    conf: AllocConf
    ms: Any

    def malloc(self, nbytes: int, frames: Any) -> Any:
        ms = self.ms
        if self.conf.backend == "cudaMallocAsync":
            return self._malloc_async(nbytes, frames)
        self._process_events()
        size = round_size(self.conf, nbytes)
        pool = "small" if size <= ms.SMALL_SIZE else "large"
        if self.gc:
            self.free_calls[pool] += 1
        block = self._best_fit(pool, size)
        if block is None:
            block = self._grow(pool, size, frames)
        remaining = block.size - size
        if pool == "small" or self.expandable:
            split = remaining >= ms.MIN_BLOCK
        else:  # an oversize block is never split (should_split)
            split = size < self.conf.max_split_size and remaining > ms.SMALL_SIZE
        if split:
            self._drop(block)
            rest = ms.Block(block.address + size, remaining, pool, block.segment)
            rest.gc_base = self.free_calls[pool]
            block = ms.Block(block.address, size, pool, block.segment)
            self._add(block)
            self._add(rest)
        block.allocated, block.requested, block.frames = True, nbytes, frames
        self._record("alloc", block.address, nbytes, frames)
        return block

    def _best_fit(self, pool: str, size: int) -> Any:
        split = self.conf.max_split_size
        if split == UNLIMITED or pool == "small" or self.expandable:
            return super()._best_fit(pool, size)  # type: ignore[misc]
        fits = [
            b for b in self.blocks.values()
            if b.pool == pool and b.reusable and b.size >= size
            # get_free_block: no oversize block for a small request, and an oversize request
            # takes a block at most kLargeBuffer larger than itself.
            and not (size < split and b.size >= split)
            and not (size >= split and b.size >= size + LARGE_BUFFER)
        ]  # fmt: skip
        return min(fits, key=lambda b: (b.size, b.address), default=None)

    def _release_cached(self) -> None:
        split = self.conf.max_split_size
        if split != UNLIMITED and not self.expandable and not getattr(self, "_emptying", False):
            # release_available_cached_blocks: the oversize segments go first; a second
            # attempt that still fails releases everything (the generator's own path).
            for b in sorted(self.blocks.values(), key=lambda b: (b.size, b.address)):
                if b.reusable and b.size >= split and self.segments.get(b.address) == b.size:
                    self._drop(b)
                    del self.segments[b.address]
                    self.reserved -= b.size
                    self._record("segment_free", b.address, b.size, [])
        super()._release_cached()  # type: ignore[misc]

    def _malloc_async(self, nbytes: int, frames: Any) -> Any:
        """cudaMallocAsync: a stream-ordered allocation of its own, rounded to 2 MiB pages."""
        ms = self.ms
        size = -(-max(nbytes, 1) // (2 * MiB)) * (2 * MiB)
        if self.reserved + size > self.limit:
            self.retries += 1
            self._record("oom", 0, size, frames, device_free=self.usable - self.reserved)
            raise ms.OutOfMemory(f"tried to allocate {size} bytes")
        # A fresh address each time: the pool's virtual addresses are not what is measured.
        address = self.va_base + getattr(self, "async_next", 0)
        self.async_next = address - self.va_base + size
        self.segments[address] = size
        self.reserved += size
        block = ms.Block(address, size, "large", address)
        self._add(block)
        block.allocated, block.requested, block.frames = True, nbytes, frames
        return block

    def free(self, block: Any, side_stream: bool = False) -> None:
        if self.conf.backend != "cudaMallocAsync":
            super().free(block, side_stream)  # type: ignore[misc]
            return
        block.allocated = False
        self._drop(block)
        del self.segments[block.address]
        self.reserved -= block.size

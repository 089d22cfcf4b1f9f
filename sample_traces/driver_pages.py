"""How the CUDA driver places ``cudaMalloc`` blocks on the device's pages, as genuine nsys
exports show it (see ``README.md`` in this folder).

``make_samples.py`` uses it to give the synthetic samples the addresses and the failures a real
driver would produce, and ``tests/fake_cupy`` uses it to stand in for a GPU when
``make_driver_traces.py`` runs in CI. The rules, each from an export recorded on an A100 or a
GH200:

* a block of 2 MiB or more gets fresh whole pages (2 MiB each), 2 MiB-aligned, placed downwards
  through the address space with gaps that have nothing to do with free memory;
* a smaller block is packed at 512-byte steps into a partly used 2 MiB chunk: the smallest free
  gap that holds it, lowest address first (a 407 B block went to the tightest of four partly
  used chunks in a GH200 export, not the lowest one); else a new chunk, placed just above the
  previous new chunk where that is free (consecutive chunks climb upwards in the exports);
* a page goes back to the device the moment its last block is freed;
* a request fails (``cudaErrorMemoryAllocation``) exactly when it cannot be served: a large one
  needs more free pages than the device has, a small one fits in no partly used chunk and no page
  is free.

Module data (``__device__`` statics) sits in chunks of its own, symbol after symbol at 256-byte
steps, as in the exports.
"""

from __future__ import annotations

import bisect
import random

PAGE = 2 << 20
STEP = 512  # the driver's allocation granularity: every small block starts on a 512-byte step
MODULE_STEP = 256


class OutOfMemory(Exception):
    """The driver cannot serve the request: cudaMalloc returns cudaErrorMemoryAllocation."""


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class _VirtualRanges:
    """The virtual ranges reserved in ``[bottom, top)``: pages of large blocks and chunks."""

    def __init__(self, bottom: int, top: int) -> None:
        self.bottom, self.top = bottom, top
        self._starts: list[int] = []
        self._ends: dict[int, int] = {}

    def is_free(self, start: int, end: int) -> bool:
        if start < self.bottom or end > self.top:
            return False
        i = bisect.bisect_left(self._starts, start)
        if i and self._ends[self._starts[i - 1]] > start:
            return False
        return not (i < len(self._starts) and self._starts[i] < end)

    def take(self, start: int, end: int) -> None:
        if not self.is_free(start, end):
            raise ValueError(f"virtual range {start:#x}-{end:#x} is taken")
        bisect.insort(self._starts, start)
        self._ends[start] = end

    def release(self, start: int) -> None:
        self._starts.pop(bisect.bisect_left(self._starts, start))
        del self._ends[start]

    def highest_fit(self, size: int, pad: int) -> int:
        """The highest page-aligned start of ``size`` bytes that leaves ``pad`` bytes free above
        it, in the highest gap that holds both."""
        above = self.top
        for start in reversed(self._starts):
            candidate = (above - pad - size) // PAGE * PAGE
            if candidate >= self._ends[start]:
                return candidate
            above = start
        candidate = (above - pad - size) // PAGE * PAGE
        if candidate >= self.bottom:
            return candidate
        raise ValueError("the virtual address window is full")


class DriverPages:
    """One device's pages as the driver hands them out to one process.

    ``capacity_bytes`` is what the driver can map for the process (the device's memory less what
    its context and other processes hold). ``max_gap_pages`` bounds the random gap left above a
    large block: the exports show gaps of 0 to a few dozen pages between neighbours.
    """

    def __init__(
        self, capacity_bytes: int, top: int, rng: random.Random, max_gap_pages: int = 8
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.reserved_bytes = 0  # pages held: large blocks' pages and chunks
        self._rng = rng
        self._max_gap_pages = max_gap_pages
        # Virtual addresses are plentiful: sixteen times the device below the top.
        self._va = _VirtualRanges(max(PAGE, top - 16 * max(capacity_bytes, 1 << 30)), top)
        self._large: dict[int, int] = {}  # block address -> its pages' bytes
        self._small: dict[int, tuple[int, int]] = {}  # block address -> (its chunk, its end)
        self._chunk_blocks: dict[int, list[int]] = {}  # chunk -> its blocks' starts, sorted
        self._gaps: list[tuple[int, int]] = []  # (size, start) of every free gap in a chunk
        self._last_chunk: int | None = None
        self._module_chunk: tuple[int, int] | None = None  # (chunk, next free offset)

    @property
    def device_free_bytes(self) -> int:
        return self.capacity_bytes - self.reserved_bytes

    def malloc(self, nbytes: int) -> int:
        """The address of a new block of ``nbytes`` (> 0), or OutOfMemory."""
        if nbytes <= 0:
            raise ValueError("the driver places blocks of at least one byte")
        if nbytes >= PAGE:
            return self._malloc_large(nbytes)
        return self._malloc_small(round_up(nbytes, STEP))

    def free(self, address: int) -> None:
        if address in self._large:
            self.reserved_bytes -= self._large.pop(address)
            self._va.release(address)
        else:
            self._free_small(address)

    def place_large_at(self, address: int, nbytes: int) -> None:
        """Map a large block at a given page-aligned address (the samples' forced overlaps: the
        driver reusing an address whose free the trace missed)."""
        size = round_up(nbytes, PAGE)
        if address % PAGE or nbytes < PAGE:
            raise ValueError("a forced placement is of a large block on a page boundary")
        if size > self.device_free_bytes:
            raise OutOfMemory(f"{size} B of pages asked, {self.device_free_bytes} B free")
        self._va.take(address, address + size)
        self._large[address] = size
        self.reserved_bytes += size

    def module_data(self, sizes: list[int]) -> list[int]:
        """Addresses of a module's static symbols, packed at 256-byte steps in module chunks.
        They stay mapped as long as the module is loaded (every sample: to the end)."""
        addresses = []
        for nbytes in sizes:
            span = round_up(max(nbytes, 1), MODULE_STEP)
            if span > PAGE:
                addresses.append(self._malloc_large(nbytes))
                continue
            if self._module_chunk is None or self._module_chunk[1] + span > PAGE:
                self._module_chunk = (self._new_chunk(), 0)
            chunk, offset = self._module_chunk
            addresses.append(chunk + offset)
            self._module_chunk = (chunk, offset + span)
        return addresses

    def would_place_small(self, nbytes: int) -> int:
        """Where a small block would go now, without placing it (a cudaMalloc of 0 bytes that
        nsys still records with an address)."""
        i = bisect.bisect_left(self._gaps, (round_up(max(nbytes, 1), STEP), -1))
        return self._gaps[i][1] if i < len(self._gaps) else self._va.highest_fit(PAGE, 0)

    # --- large blocks: whole pages

    def _malloc_large(self, nbytes: int) -> int:
        size = round_up(nbytes, PAGE)
        if size > self.device_free_bytes:
            raise OutOfMemory(f"{size} B of pages asked, {self.device_free_bytes} B free")
        pad = self._rng.randint(0, self._max_gap_pages) * PAGE
        address = self._va.highest_fit(size, pad)
        self._va.take(address, address + size)
        self._large[address] = size
        self.reserved_bytes += size
        return address

    # --- small blocks: packed into chunks

    def _new_chunk(self) -> int:
        if PAGE > self.device_free_bytes:
            raise OutOfMemory(f"no page free for a new chunk ({self.device_free_bytes} B free)")
        last = self._last_chunk
        if last is not None and self._va.is_free(last + PAGE, last + 2 * PAGE):
            chunk = last + PAGE
        else:
            chunk = self._va.highest_fit(PAGE, 0)
        self._va.take(chunk, chunk + PAGE)
        self.reserved_bytes += PAGE
        self._last_chunk = chunk
        return chunk

    def _malloc_small(self, span: int) -> int:
        i = bisect.bisect_left(self._gaps, (span, -1))
        if i < len(self._gaps):
            size, start = self._gaps.pop(i)
        else:
            start = self._new_chunk()
            size = PAGE
            self._chunk_blocks[start] = []
        if size > span:
            bisect.insort(self._gaps, (size - span, start + span))
        chunk = start - start % PAGE
        bisect.insort(self._chunk_blocks[chunk], start)
        self._small[start] = (chunk, start + span)
        return start

    def _free_small(self, address: int) -> None:
        chunk, end = self._small.pop(address)
        blocks = self._chunk_blocks[chunk]
        i = bisect.bisect_left(blocks, address)
        blocks.pop(i)
        low = self._small[blocks[i - 1]][1] if i else chunk
        high = blocks[i] if i < len(blocks) else chunk + PAGE
        for gap in ((address - low, low), (high - end, end)):
            if gap[0]:
                self._gaps.pop(bisect.bisect_left(self._gaps, gap))
        if blocks:
            bisect.insort(self._gaps, (high - low, low))
        else:
            # The chunk's last block is gone: its page goes back to the device.
            del self._chunk_blocks[chunk]
            self._va.release(chunk)
            self.reserved_bytes -= PAGE


class MemoryPool:
    """A stream-ordered memory pool (``cudaMallocAsync``) on a device's pages.

    It maps pages in steps of ``grow_bytes`` as its blocks need them and keeps them when blocks
    are freed; a synchronization trims it to what its live blocks use (or the release threshold,
    if higher). nsys records, on each of its rows, the pool's address, its size, the bytes in use
    and the release threshold: ``figures`` after the last operation.
    """

    def __init__(
        self,
        driver: DriverPages,
        va_bytes: int,
        grow_bytes: int = 32 << 20,
        release_threshold: int = 0,
    ) -> None:
        self.driver = driver
        self.address = driver._va.highest_fit(va_bytes, 0)
        driver._va.take(self.address, self.address + va_bytes)
        self._va_bytes, self._grow = va_bytes, grow_bytes
        self.release_threshold = release_threshold
        self.size_bytes = 0
        self.used_bytes = 0
        self._blocks: dict[int, int] = {}  # offset -> span

    @property
    def figures(self) -> tuple[int, int, int, int]:
        return self.address, self.size_bytes, self.used_bytes, self.release_threshold

    def _resize(self, size: int) -> None:
        change = size - self.size_bytes
        if change > self.driver.device_free_bytes:
            raise OutOfMemory(f"the pool cannot grow by {change} B")
        self.driver.reserved_bytes += change
        self.size_bytes = size

    def malloc(self, nbytes: int) -> int:
        span = round_up(max(nbytes, 1), STEP)
        offset = 0
        for start in sorted(self._blocks):
            if offset + span <= start:
                break
            offset = max(offset, start + self._blocks[start])
        if offset + span > self._va_bytes:
            raise OutOfMemory("the pool's address range is full")
        needed = round_up(self.used_bytes + span, self._grow)
        if needed > self.size_bytes:
            self._resize(needed)
        self._blocks[offset] = span
        self.used_bytes += span
        return self.address + offset

    def free(self, address: int) -> None:
        self.used_bytes -= self._blocks.pop(address - self.address)

    def trim(self) -> None:
        self._resize(max(self.release_threshold, round_up(self.used_bytes, self._grow)))

"""The segments model's layout: segments, the live blocks inside them and the free blocks
between, with running totals. A free block never crosses a segment boundary (an expandable
segment's contiguous mapped range is one segment)."""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass, replace

from nsysfrag.models.segments.rules import expandable_page
from nsysfrag.models.series import StrandedSegment


@dataclass(slots=True)
class _Seg:
    end: int
    stream: int
    small_pool: bool | None
    expandable: bool
    # Expandable ranges: pages of `page` bytes counted from `origin`, for the releasable bytes.
    page: int = 0
    origin: int = 0


def releasable_in(start: int, end: int, seg_start: int, seg: _Seg | None) -> int:
    """The bytes of free block ``[start, end)`` that could go back to the driver (R, docs/metrics.md):
    a non-expandable segment entirely, if the block is all of it; in an expandable range, the
    whole pages inside the block (a range's pages start at its ``origin``: the start of the
    first map of the range, and unmapping whole pages keeps the grid)."""
    if seg is None:
        return 0
    if not seg.expandable:
        return end - start if start == seg_start and end == seg.end else 0
    first = -((seg.origin - start) // seg.page)  # ceil((start - origin) / page)
    last = (end - seg.origin) // seg.page
    return max(last - first, 0) * seg.page


class SegmentSet:
    """A device's segments: disjoint address ranges, by start."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.seg: dict[int, _Seg] = {}

    def find(self, address: int) -> int | None:
        """The start of the segment containing ``address``."""
        i = bisect_right(self.starts, address) - 1
        if i >= 0 and address < self.seg[self.starts[i]].end:
            return self.starts[i]
        return None

    def overlaps(self, start: int, end: int) -> bool:
        if self.find(start) is not None:
            return True
        i = bisect_left(self.starts, start)
        return i < len(self.starts) and self.starts[i] < end

    def add(self, start: int, seg: _Seg) -> None:
        insort(self.starts, start)
        self.seg[start] = seg

    def remove(self, start: int) -> _Seg:
        del self.starts[bisect_left(self.starts, start)]
        return self.seg.pop(start)

    def map_range(self, start: int, end: int, stream: int) -> None:
        """Add a mapped range of an expandable segment, joining contiguous ranges of the stream."""
        left = self.find(start - 1)
        if left is not None and self.seg[left].end == start and self._joins(left, stream):
            self.seg[left].end = end
            base = left
        else:
            base = start
            page = expandable_page(None, end - start)
            self.add(start, _Seg(end, stream, None, True, page, start))
        right = self.seg.get(end)
        if right is not None and self._joins(end, stream):
            self.seg[base].end = self.remove(end).end

    def _joins(self, start: int, stream: int) -> bool:
        s = self.seg[start]
        return s.expandable and s.stream == stream

    def unmap_range(self, start: int, end: int) -> bool:
        """Remove ``[start, end)`` from the segment that contains it; False if none does."""
        base = self.find(start)
        if base is None or self.seg[base].end < end:
            return False
        seg = self.remove(base)
        if base < start:
            self.add(base, replace(seg, end=start))
        if end < seg.end:
            self.add(end, replace(seg))
        return True

    def ranges(self) -> list[tuple[int, int]]:
        """The covered address ranges, contiguous segments joined."""
        out: list[tuple[int, int]] = []
        for s in self.starts:
            e = self.seg[s].end
            if out and out[-1][1] == s:
                out[-1] = (out[-1][0], e)
            else:
                out.append((s, e))
        return out


@dataclass(slots=True)
class _Block:
    address: int
    size: int
    requested: int
    point: int  # timeline index of its allocation
    placed: bool  # False when it fell outside every segment (not modelled)
    live: bool = True
    inferred: bool = False  # live at the window's start, its size not recorded but inferred
    pending: bool = False  # freed by the program, waiting on other streams (still active)


class Layout:
    """Segments, the live blocks in them and the free blocks between, with running totals."""

    def __init__(self, segments: SegmentSet) -> None:
        self.segs = segments
        self.free_starts: list[int] = []
        self.free_end: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []  # (-size, start), stale entries dropped lazily
        self.blocks: dict[int, _Block] = {}
        self.block_starts: list[int] = []
        self.block_ending: dict[int, int] = {}  # end -> start of the live block ending there
        self.reserved = 0
        self.allocated = 0  # every placed live block: PyTorch's active bytes
        self.pending = 0  # of them, the blocks whose free waits on other streams
        self.requested = 0
        self.free_total = 0
        # R (docs/metrics.md), kept incrementally: each free block's share, fixed when it is added.
        self.free_releasable: dict[int, int] = {}
        self.releasable_total = 0
        for start in segments.starts:
            self.reserved += segments.seg[start].end - start
            self._add_free(start, segments.seg[start].end)

    # -- free blocks

    def _add_free(self, start: int, end: int) -> None:
        insort(self.free_starts, start)
        self.free_end[start] = end
        self.free_total += end - start
        heapq.heappush(self._heap, (start - end, start))
        seg_start = self.segs.find(start)
        seg = self.segs.seg[seg_start] if seg_start is not None else None
        share = releasable_in(start, end, seg_start or 0, seg)
        self.free_releasable[start] = share
        self.releasable_total += share

    def _remove_free(self, start: int) -> int:
        del self.free_starts[bisect_left(self.free_starts, start)]
        end = self.free_end.pop(start)
        self.free_total -= end - start
        self.releasable_total -= self.free_releasable.pop(start)
        return end

    def free_containing(self, address: int) -> tuple[int, int] | None:
        i = bisect_right(self.free_starts, address) - 1
        if i >= 0:
            s = self.free_starts[i]
            if address < self.free_end[s]:
                return s, self.free_end[s]
        return None

    def largest_free(self) -> int:
        heap = self._heap
        while heap and self.free_end.get(heap[0][1]) != heap[0][1] - heap[0][0]:
            heapq.heappop(heap)
        if len(heap) > 2 * len(self.free_end) + 64:
            self._heap = [(s - e, s) for s, e in self.free_end.items()]
            heapq.heapify(self._heap)
            heap = self._heap
        return -heap[0][0] if heap else 0

    def stranded(self) -> list[StrandedSegment]:
        """The segments whose free bytes are partly or wholly stranded, by start."""
        stranded: dict[int, int] = {}
        for start, end in self.free_end.items():
            base = self.segs.find(start)
            left = end - start - self.free_releasable.get(start, 0)
            if base is not None and left > 0:
                stranded[base] = stranded.get(base, 0) + left
        points: dict[int, list[int]] = {base: [] for base in stranded}
        for address in self.block_starts:
            base = self.segs.find(address)
            if base in points:
                points[base].append(self.blocks[address].point)
        return [StrandedSegment(b, stranded[b], tuple(points[b])) for b in sorted(stranded)]

    def free_sizes(self) -> list[int]:
        return [e - s for s, e in self.free_end.items()]

    def releasable(self) -> int:
        """Bytes of wholly free cudaMalloc segments: empty_cache() (or the OOM path) would
        give them back to CUDA, so a large request could still be served from them."""
        return sum(
            e - s
            for s, e in self.free_end.items()
            if (seg := self.segs.seg.get(s)) is not None and seg.end == e and not seg.expandable
        )

    def release(self, start: int, end: int) -> tuple[int, int]:
        """Make ``[start, end)`` free, joined with free neighbours in the same segment."""
        if start not in self.segs.seg:  # not a segment boundary: may join the free block below
            i = bisect_left(self.free_starts, start) - 1
            if i >= 0 and self.free_end[self.free_starts[i]] == start:
                start = self.free_starts[i]
                self._remove_free(start)
        if end in self.free_end and end not in self.segs.seg:
            end = self._remove_free(end)
        self._add_free(start, end)
        return start, end

    # -- blocks

    def occupy(self, address: int, size: int) -> None:
        """Carve ``[address, address + size)`` out of the free block that holds it."""
        self.remove_free_range(address, address + size)

    def add_block(self, block: _Block) -> None:
        self.blocks[block.address] = block
        self.requested += block.requested
        if block.placed:
            insort(self.block_starts, block.address)
            self.block_ending[block.address + block.size] = block.address
            self.allocated += block.size
            self.occupy(block.address, block.size)

    def drop_block(self, block: _Block) -> tuple[int, int] | None:
        """Remove a live block; return the free block it joined, if it was placed."""
        del self.blocks[block.address]
        block.live = False
        self.requested -= block.requested
        if not block.placed:
            return None
        del self.block_starts[bisect_left(self.block_starts, block.address)]
        del self.block_ending[block.address + block.size]
        self.allocated -= block.size
        if block.pending:
            block.pending = False
            self.pending -= block.size
        return self.release(block.address, block.address + block.size)

    def request_free(self, block: _Block) -> None:
        """The program freed ``block``; other streams still use it: active, not allocated."""
        if block.placed and not block.pending:
            block.pending = True
            self.pending += block.size

    def blocks_in(self, start: int, end: int) -> list[_Block]:
        """Placed live blocks overlapping ``[start, end)``."""
        i = bisect_right(self.block_starts, start) - 1
        if i >= 0:
            b = self.blocks[self.block_starts[i]]
            if b.address + b.size <= start:
                i += 1
        else:
            i = 0
        out = []
        while i < len(self.block_starts) and self.block_starts[i] < end:
            out.append(self.blocks[self.block_starts[i]])
            i += 1
        return out

    # -- segments

    def add_segment(self, start: int, size: int, seg: _Seg) -> None:
        self.segs.add(start, seg)
        self.reserved += size
        self.release(start, start + size)

    def map_range(self, start: int, size: int, stream: int) -> None:
        self.segs.map_range(start, start + size, stream)
        self.reserved += size
        self.release(start, start + size)

    def remove_free_range(self, start: int, end: int) -> None:
        """``[start, end)`` must be free: take it out of the free blocks."""
        span = self.free_containing(start)
        if span is None:
            return
        s, e = span
        self._remove_free(s)
        if s < start:
            self._add_free(s, start)
        if end < e:
            self._add_free(end, e)

"""The ``pytorch-segments`` model: PyTorch caching-allocator blocks inside their segments.

A snapshot's trace is a ring buffer: it covers a window that ends at the snapshot, and the
snapshot's ``segments`` are the layout at that end. As PyTorch's own viewer does
(``MemoryViz.js``, ``process_alloc_data``/``simulate_memory``), the layout at the *start* of
the window is rebuilt by walking the trace backwards from the final state and undoing every
action; the replay then runs forwards from that layout, so frees of blocks allocated before the
window are ordinary frees, not anomalies.

Free memory is the inactive ranges inside reserved segments; a free block never crosses a
segment boundary (an expandable segment's contiguous mapped range is one segment). After every
event the model reports ``F`` = reserved − allocated, ``L`` the largest free block, ``N`` the
number of free blocks and ``U`` the requested bytes of live blocks, plus reserved, allocated
and requested bytes. A block stays allocated until ``free_completed``: a block freed by the
program but still in use on another stream (``free_requested``) cannot be reused yet.

Block sizes: a block live at the snapshot has its recorded size. Otherwise the trace gives only
the requested bytes, so the block takes ``round_size(requested)`` (ALLOCATORS.md §1.2), or the
whole free block it was carved from when PyTorch would not split that (§1.5 ``should_split``).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nsysfrag.inputs.nsys.records import I64, BoolArray
from nsysfrag.inputs.torch_snapshot.reader import NO_STACK, Segment, Snapshot, TraceEntry
from nsysfrag.models.observed.kernel import (
    ALLOCATED,
    FREED,
    NO_BLOCK,
    UNMATCHED_FREE,
    ZERO_SIZE_ALLOC,
)

MODEL_NAME = "pytorch-segments"

# Timeline event codes beyond the replay outcomes (analysis.EVENT_NAMES names them).
SEGMENT_ALLOC = 4
SEGMENT_FREE = 5
SEGMENT_MAP = 6
SEGMENT_UNMAP = 7
OOM = 8
_SEGMENT_CODES = {
    "segment_alloc": SEGMENT_ALLOC,
    "segment_free": SEGMENT_FREE,
    "segment_map": SEGMENT_MAP,
    "segment_unmap": SEGMENT_UNMAP,
}

# CUDACachingAllocator constants (ALLOCATORS.md §1.1).
MIN_BLOCK_BYTES = 512
SMALL_BUFFER_BYTES = 2 << 20
SMALL_SIZE_BYTES = 1 << 20


def round_size(size: int, divisions: dict[int, int] | None = None) -> int:
    """PyTorch's ``round_size``: at least 512 B, a multiple of 512 B, or the next of
    ``roundup_power2_divisions`` steps between powers of two where that is configured."""
    if size < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    d = _divisions_for(size, divisions) if divisions else 0
    if d > 1 and size > MIN_BLOCK_BYTES * d:
        if size & (size - 1) == 0:
            return size
        p = 1 << (size.bit_length() - 1)
        step = p // d
        if step == 0:
            return 2 * p
        floor = size & ~(step - 1)
        return size if floor == size else floor + step
    return -(-size // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def _divisions_for(size: int, divisions: dict[int, int]) -> int:
    # Interval i covers [2**i MiB, 2**(i+1) MiB), clamped to [0, 15]; keys are interval starts.
    idx = min(max(size.bit_length() - 1 - 20, 0), 15)
    return divisions.get(1 << idx, 0)


@dataclass(slots=True)
class _Seg:
    end: int
    stream: int
    small_pool: bool | None
    expandable: bool


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
            self.add(start, _Seg(end, stream, None, True))
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
            self.add(base, _Seg(start, seg.stream, seg.small_pool, seg.expandable))
        if end < seg.end:
            self.add(end, _Seg(seg.end, seg.stream, seg.small_pool, seg.expandable))
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


# ---------------------------------------------------------------- the window's start


@dataclass(slots=True)
class _Recreated:
    size: int | None  # known only for blocks still live at the snapshot
    requested: int
    pending: bool
    site: str


@dataclass
class WindowStart:
    """The layout at the first trace entry, and what the backward walk learnt on the way."""

    segments: SegmentSet
    blocks: dict[int, _Recreated]  # address -> block live at the start of the window
    known_sizes: dict[int, int]  # trace index of an alloc -> its block's size, where known
    conflicts: int  # entries the final state contradicts (e.g. an alloc of no live block)


def _final_segments(segments: Sequence[Segment]) -> tuple[SegmentSet, dict[int, _Recreated]]:
    segs = SegmentSet()
    blocks: dict[int, _Recreated] = {}
    for s in segments:
        if s.size <= 0 or segs.overlaps(s.address, s.address + s.size):
            continue
        segs.add(s.address, _Seg(s.address + s.size, s.stream, s.small_pool, s.expandable))
        for b in s.blocks:
            blocks[b.address] = _Recreated(b.size, b.requested_bytes, b.pending_free, b.site)
    return segs, blocks


def window_start(segments: Sequence[Segment], trace: Sequence[TraceEntry]) -> WindowStart:
    """Undo ``trace`` (newest first) from the final ``segments`` of one device."""
    segs, blocks = _final_segments(segments)
    known: dict[int, int] = {}
    conflicts = 0
    for j in range(len(trace) - 1, -1, -1):
        e = trace[j]
        a = e.action
        if a == "alloc":
            if e.size == 0:
                continue
            b = blocks.pop(e.address, None)
            if b is None:
                conflicts += 1
            elif b.size is not None:
                known[j] = b.size
        elif a in ("free_completed", "free"):
            if e.address in blocks:
                conflicts += 1
            else:
                blocks[e.address] = _Recreated(None, e.size, a == "free_completed", e.site)
        elif a == "free_requested":
            b = blocks.get(e.address)
            if b is None:
                conflicts += 1
            else:
                b.pending = False
        elif a == "segment_alloc":
            seg = segs.seg.get(e.address)
            if seg is None or seg.end != e.address + e.size:
                conflicts += 1
            else:
                segs.remove(e.address)
        elif a == "segment_free":
            if segs.overlaps(e.address, e.address + e.size) or e.size == 0:
                conflicts += 1
            else:
                small = e.size == SMALL_BUFFER_BYTES
                segs.add(e.address, _Seg(e.address + e.size, e.stream, small, False))
        elif a == "segment_map":
            if not segs.unmap_range(e.address, e.address + e.size):
                conflicts += 1
        elif a == "segment_unmap":
            if segs.overlaps(e.address, e.address + e.size) or e.size == 0:
                conflicts += 1
            else:
                segs.map_range(e.address, e.address + e.size, e.stream)
    return WindowStart(segs, blocks, known, conflicts)


# ---------------------------------------------------------------- the forward replay


@dataclass(slots=True)
class _Block:
    address: int
    size: int
    requested: int
    point: int  # timeline index of its allocation
    placed: bool  # False when it fell outside every segment (not modelled)
    live: bool = True


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
        self.allocated = 0
        self.requested = 0
        self.free_total = 0
        for start in segments.starts:
            self.reserved += segments.seg[start].end - start
            self._add_free(start, segments.seg[start].end)

    # -- free blocks

    def _add_free(self, start: int, end: int) -> None:
        insort(self.free_starts, start)
        self.free_end[start] = end
        self.free_total += end - start
        heapq.heappush(self._heap, (start - end, start))

    def _remove_free(self, start: int) -> int:
        del self.free_starts[bisect_left(self.free_starts, start)]
        end = self.free_end.pop(start)
        self.free_total -= end - start
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
        span = self.free_containing(address)
        if span is None:
            return
        start, end = span
        self._remove_free(start)
        if start < address:
            self._add_free(start, address)
        if address + size < end:
            self._add_free(address + size, end)

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
        return self.release(block.address, block.address + block.size)

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


@dataclass(frozen=True)
class OomEvent:
    time_ns: int
    device_free_bytes: int | None
    requested_bytes: int  # rounded, as the allocator recorded it
    largest_free_bytes: int
    free_bytes: int
    reserved_bytes: int
    allocated_bytes: int
    stream: int
    site: str


@dataclass
class DeviceReplay:
    """One device's timeline in the pytorch-segments model, one point per modelled event."""

    time_ns: I64
    event: np.ndarray  # replay outcome codes, plus SEGMENT_* and OOM
    address: np.ndarray  # uint64
    bytes: I64
    free_bytes: I64
    largest_free_bytes: I64
    free_blocks: I64
    live_bytes: I64
    reserved_bytes: I64
    allocated_bytes: I64
    out_of_order: BoolArray
    hole: BoolArray
    freed_alloc: I64
    pin_left: I64
    pin_right: I64
    removed_at: I64
    overlap: BoolArray
    site: I64
    site_names: list[str]
    initial_blocks: int
    initial_reserved_bytes: int
    trace_entries: int
    timestamps: bool  # False: times are entry numbers
    conflicts: int  # the backward walk, plus frees of no live block found going forwards
    final_mismatches: int  # segments or blocks the replay's end differs from the snapshot in
    base_address: int
    end_address: int
    peak_allocated: tuple[int, int]  # (allocated, requested) at the first maximum of allocated
    max_reserved_bytes: int
    max_allocated_bytes: int
    max_requested_bytes: int
    ooms: list[OomEvent] = field(default_factory=list)


class _Sites:
    def __init__(self) -> None:
        self.names = [NO_STACK]
        self.codes = {NO_STACK: 0}

    def code(self, name: str) -> int:
        c = self.codes.get(name)
        if c is None:
            c = self.codes[name] = len(self.names)
            self.names.append(name)
        return c


def replay_device(snapshot: Snapshot, device: int) -> DeviceReplay:
    """Replay one device's trace from the window's start."""
    return _replayer(snapshot, device).run()


@dataclass(frozen=True)
class FreeBlocks:
    sizes: list[int]
    releasable_bytes: int  # wholly free (non-expandable) segments among them


def free_blocks_after(snapshot: Snapshot, device: int, point: int) -> FreeBlocks:
    """The free blocks right after timeline point ``point`` (replaying only that far)."""
    return _replayer(snapshot, device).free_blocks_after(point)


def _replayer(snapshot: Snapshot, device: int) -> _Replayer:
    final = [s for s in snapshot.segments if s.device == device]
    trace = snapshot.traces.get(device, [])
    return _Replayer(snapshot, final, trace, window_start(final, trace))


class _Replayer:
    def __init__(
        self,
        snapshot: Snapshot,
        final: list[Segment],
        trace: Sequence[TraceEntry],
        start: WindowStart,
    ) -> None:
        self.snapshot = snapshot
        self.final = final
        self.trace = trace
        self.start = start
        self.sites = _Sites()
        self.cols: dict[str, list[int]] = {k: [] for k in _COLUMNS}
        self.stack: list[_Block] = []
        self.removed: list[tuple[int, int]] = []  # (allocation point, point that removed it)
        self.ooms: list[OomEvent] = []
        self.conflicts = start.conflicts
        self.max_reserved = 0
        self.max_allocated = 0
        self.max_requested = 0
        self.peak_allocated = (0, 0)
        self.low: int | None = min(start.segments.starts, default=None)
        self.high = max((start.segments.seg[s].end for s in start.segments.starts), default=0)

    def run(self) -> DeviceReplay:
        times, timestamps, fold, initial, initial_reserved = self._begin()
        for j, e in enumerate(self.trace):
            self._apply(j, e, times[j], fold[j])
            self._track()
        return self._result(initial, initial_reserved, timestamps)

    def free_blocks_after(self, point: int) -> FreeBlocks:
        times, _, fold, _, _ = self._begin()
        for j, e in enumerate(self.trace):
            if len(self.cols["time"]) > point:
                break
            self._apply(j, e, times[j], fold[j])
        return FreeBlocks(self.layout.free_sizes(), self.layout.releasable())

    def _begin(self) -> tuple[list[int], bool, list[bool], int, int]:
        """The layout at the window's start, and its points; the entries' times and folds."""
        segs = self.start.segments
        layout = self.layout = Layout(segs)
        times, timestamps = _times(self.trace, self.snapshot.time_origin_us or 0)
        t0 = times[0] if times else 0
        initial_reserved = layout.reserved
        initial = self._place_initial_blocks()
        self._track()
        for b, site in initial:
            b.point = len(self.cols["time"])
            self._point(t0, ALLOCATED, b.address, b.requested or b.size, site=site)
            self.stack.append(b)
        fold = _folded(self.trace)
        has_points = bool(initial) or any(
            e.action in ("alloc", "free_completed", "free", "oom")
            or (e.action in _SEGMENT_CODES and not fold[j])
            for j, e in enumerate(self.trace)
        )
        if not has_points:  # a state-only snapshot with no live block: its segments, once
            for s in segs.starts:
                self._point(t0, SEGMENT_ALLOC, s, segs.seg[s].end - s)
        return times, timestamps, fold, len(initial), initial_reserved

    # -- the initial layout

    def _place_initial_blocks(self) -> list[tuple[_Block, int]]:
        """The blocks live at the window's start, by address, with their site codes."""
        layout = self.layout
        out = []
        items = sorted(self.start.blocks.items())
        for k, (address, r) in enumerate(items):
            size = r.size
            if size is None:
                size = round_size(max(r.requested, 1), self.snapshot.roundup_power2_divisions)
            seg_start = layout.segs.find(address)
            if seg_start is not None:
                limit = layout.segs.seg[seg_start].end
                if k + 1 < len(items):
                    limit = min(limit, max(items[k + 1][0], address))
                size = max(min(size, limit - address), 0)
            span = layout.free_containing(address)
            placed = (
                seg_start is not None
                and size > 0
                and span is not None
                and span[1] >= address + size
            )
            if not placed:
                self.conflicts += 1
            b = _Block(address, size, r.requested, NO_BLOCK, placed)
            layout.add_block(b)
            out.append((b, self.sites.code(r.site)))
        return out

    # -- one trace entry

    def _apply(self, j: int, e: TraceEntry, t: int, folded: bool) -> None:
        layout = self.layout
        a = e.action
        if a == "alloc":
            if e.size == 0:
                self._point(t, ZERO_SIZE_ALLOC, e.address, 0)
                return
            self._alloc(j, e, t)
        elif a in ("free_completed", "free"):
            self._free(e, t)
        elif a == "segment_alloc" or a == "segment_map":
            if not layout.segs.overlaps(e.address, e.address + e.size) and e.size > 0:
                if a == "segment_alloc":
                    small = e.size == SMALL_BUFFER_BYTES
                    layout.add_segment(
                        e.address, e.size, _Seg(e.address + e.size, e.stream, small, False)
                    )
                else:
                    layout.map_range(e.address, e.size, e.stream)
                self._extend(e.address, e.address + e.size)
            else:
                self.conflicts += 1
            if not folded:
                self._point(t, _SEGMENT_CODES[a], e.address, e.size)
        elif a == "segment_free" or a == "segment_unmap":
            end = e.address + e.size
            for b in layout.blocks_in(e.address, end):  # the trace missed their frees
                self.conflicts += 1
                self._drop(b, len(self.cols["time"]))
            base = layout.segs.find(e.address)
            if base is None or layout.segs.seg[base].end < end:
                self.conflicts += 1
            else:
                layout.remove_free_range(e.address, end)
                if a == "segment_free":
                    if base != e.address or layout.segs.seg[base].end != end:
                        self.conflicts += 1
                    layout.segs.unmap_range(e.address, end)
                else:
                    layout.segs.unmap_range(e.address, end)
                layout.reserved -= e.size
            self._point(t, _SEGMENT_CODES[a], e.address, e.size)
        elif a == "oom":
            self.ooms.append(
                OomEvent(
                    time_ns=t,
                    device_free_bytes=e.device_free,
                    requested_bytes=e.size,
                    largest_free_bytes=layout.largest_free(),
                    free_bytes=layout.free_total,
                    reserved_bytes=layout.reserved,
                    allocated_bytes=layout.allocated,
                    stream=e.stream,
                    site=e.site,
                )
            )
            self._point(t, OOM, 0, e.size)
        elif a == "free_requested":
            pass  # the block stays allocated until free_completed
        # "snapshot" entries change nothing

    def _alloc(self, j: int, e: TraceEntry, t: int) -> None:
        layout = self.layout
        point = len(self.cols["time"])
        overlap = False
        if e.address in layout.blocks:  # a second alloc of a live block: its free went missing
            overlap = True
            self._drop(layout.blocks[e.address], point)
        size = self.start.known_sizes.get(j)
        seg_start = layout.segs.find(e.address)
        placed = False
        if seg_start is not None:
            seg = layout.segs.seg[seg_start]
            if size is None:
                size = self._block_size(e, seg, seg_start)
            size = max(min(size, seg.end - e.address), 1)
            span = layout.free_containing(e.address)
            if span is None or span[1] < e.address + size:
                overlap = True
                for b in layout.blocks_in(e.address, e.address + size):
                    self._drop(b, point)
                span = layout.free_containing(e.address)
            placed = span is not None and span[1] >= e.address + size
        if size is None:
            size = round_size(e.size, self.snapshot.roundup_power2_divisions)
        if not placed:  # outside every segment: counted, live, but not in the layout
            overlap = True
            self.conflicts += 1
        b = _Block(e.address, size, e.size, point, placed)
        layout.add_block(b)
        self.stack.append(b)
        self._point(t, ALLOCATED, e.address, e.size, site=self.sites.code(e.site), overlap=overlap)

    def _block_size(self, e: TraceEntry, seg: _Seg, seg_start: int) -> int:
        """The block PyTorch carved: rounded, or the whole free block when it would not split."""
        size = round_size(e.size, self.snapshot.roundup_power2_divisions)
        span = self.layout.free_containing(e.address)
        if span is None:
            return size
        available = span[1] - e.address
        if available <= size:
            return size
        remaining = available - size
        small = seg.small_pool
        if small is None:
            small = not seg.expandable and seg.end - seg_start == SMALL_BUFFER_BYTES
        if small or seg.expandable or self.snapshot.expandable_segments:
            split = remaining >= MIN_BLOCK_BYTES
        else:
            max_split = self.snapshot.max_split_size
            split = (max_split is None or size < max_split) and remaining > SMALL_SIZE_BYTES
        return size if split else available

    def _free(self, e: TraceEntry, t: int) -> None:
        layout = self.layout
        b = layout.blocks.get(e.address)
        if b is None:
            self.conflicts += 1
            self._point(t, UNMATCHED_FREE, e.address, e.size)
            return
        i = len(self.cols["time"])
        stack = self.stack
        while stack and not stack[-1].live:
            stack.pop()
        in_order = bool(stack) and stack[-1] is b
        joined = self._drop(b, i)
        hole, left, right = False, NO_BLOCK, NO_BLOCK
        if joined is not None:
            s, end = joined
            base = layout.segs.find(s)
            if base is not None and s > base and end < layout.segs.seg[base].end:
                # A hole: live blocks of the same segment bound the free block on both sides.
                lb = layout.blocks.get(layout.block_ending.get(s, -1))
                rb = layout.blocks.get(end)
                if lb is not None and rb is not None:
                    hole, left, right = True, lb.point, rb.point
        self._point(
            t,
            FREED,
            e.address,
            e.size,
            out_of_order=not in_order,
            hole=hole,
            freed=b.point,
            left=left,
            right=right,
        )

    def _drop(self, b: _Block, at_point: int) -> tuple[int, int] | None:
        self.removed.append((b.point, at_point))
        return self.layout.drop_block(b)

    def _extend(self, start: int, end: int) -> None:
        self.low = start if self.low is None else min(self.low, start)
        self.high = max(self.high, end)

    def _track(self) -> None:
        layout = self.layout
        self.max_reserved = max(self.max_reserved, layout.reserved)
        self.max_requested = max(self.max_requested, layout.requested)
        if layout.allocated > self.max_allocated:
            self.max_allocated = layout.allocated
            self.peak_allocated = (layout.allocated, layout.requested)

    def _point(
        self,
        t: int,
        code: int,
        address: int,
        nbytes: int,
        *,
        site: int = 0,
        overlap: bool = False,
        out_of_order: bool = False,
        hole: bool = False,
        freed: int = NO_BLOCK,
        left: int = NO_BLOCK,
        right: int = NO_BLOCK,
    ) -> None:
        layout = self.layout
        c = self.cols
        c["time"].append(t)
        c["event"].append(code)
        c["address"].append(address)
        c["bytes"].append(nbytes)
        c["free"].append(layout.free_total)
        c["largest"].append(layout.largest_free())
        c["blocks"].append(len(layout.free_end))
        c["live"].append(layout.requested)
        c["reserved"].append(layout.reserved)
        c["allocated"].append(layout.allocated)
        c["site"].append(site)
        c["overlap"].append(overlap)
        c["out_of_order"].append(out_of_order)
        c["hole"].append(hole)
        c["freed"].append(freed)
        c["left"].append(left)
        c["right"].append(right)

    def _result(self, initial: int, initial_reserved: int, timestamps: bool) -> DeviceReplay:
        c = self.cols
        n = len(c["time"])
        removed_at = np.full(n, NO_BLOCK, dtype=np.int64)
        for alloc_point, at in self.removed:
            if 0 <= alloc_point < n:
                removed_at[alloc_point] = min(at, n - 1)

        def i64(k: str) -> I64:
            return np.asarray(c[k], dtype=np.int64)

        def flag(k: str) -> BoolArray:
            return np.asarray(c[k], dtype=np.bool_)

        low = self.low if self.low is not None else 0
        return DeviceReplay(
            time_ns=i64("time"),
            event=np.asarray(c["event"], dtype=np.int8),
            address=np.asarray(c["address"], dtype=np.uint64),
            bytes=i64("bytes"),
            free_bytes=i64("free"),
            largest_free_bytes=i64("largest"),
            free_blocks=i64("blocks"),
            live_bytes=i64("live"),
            reserved_bytes=i64("reserved"),
            allocated_bytes=i64("allocated"),
            out_of_order=flag("out_of_order"),
            hole=flag("hole"),
            freed_alloc=i64("freed"),
            pin_left=i64("left"),
            pin_right=i64("right"),
            removed_at=removed_at,
            overlap=flag("overlap"),
            site=i64("site"),
            site_names=self.sites.names,
            initial_blocks=initial,
            initial_reserved_bytes=initial_reserved,
            trace_entries=len(self.trace),
            timestamps=timestamps,
            conflicts=self.conflicts,
            final_mismatches=self._final_mismatches(),
            base_address=low,
            end_address=max(self.high, low),
            peak_allocated=self.peak_allocated,
            max_reserved_bytes=self.max_reserved,
            max_allocated_bytes=self.max_allocated,
            max_requested_bytes=self.max_requested,
            ooms=self.ooms,
        )

    def _final_mismatches(self) -> int:
        """How far the replay's end is from the snapshot: differing ranges and blocks."""
        final_segs, final_blocks = _final_segments(self.final)
        want_ranges = set(final_segs.ranges())
        got_ranges = set(self.layout.segs.ranges())
        want_blocks = {(a, b.size) for a, b in final_blocks.items()}
        got_blocks = {(a, b.size) for a, b in self.layout.blocks.items() if b.placed}
        return len(want_ranges ^ got_ranges) + len(want_blocks ^ got_blocks)


_COLUMNS = (
    "time", "event", "address", "bytes", "free", "largest", "blocks", "live", "reserved",
    "allocated", "site", "overlap", "out_of_order", "hole", "freed", "left", "right",
)  # fmt: skip


def _times(trace: Sequence[TraceEntry], origin_us: int) -> tuple[list[int], bool]:
    """ns since ``origin_us`` per entry, never decreasing (an entry without a time takes the
    one before it); entry numbers when the trace has no timestamps at all."""
    if not any(e.time_us is not None for e in trace):
        return list(range(len(trace))), False
    out = []
    last = next(e.time_us for e in trace if e.time_us is not None) - origin_us
    for e in trace:
        if e.time_us is not None:
            last = max(last, e.time_us - origin_us)
        out.append(last * 1000)
    return out, True


def _folded(trace: Sequence[TraceEntry]) -> list[bool]:
    """A segment_alloc/segment_map that an alloc follows is part of that malloc: its state
    (a new, still empty segment) lasts no time, so it is not a timeline point of its own."""
    out = [False] * len(trace)
    next_is_alloc = False
    for j in range(len(trace) - 1, -1, -1):
        a = trace[j].action
        if a in ("segment_alloc", "segment_map"):
            out[j] = next_is_alloc
        else:
            next_is_alloc = a == "alloc"
    return out

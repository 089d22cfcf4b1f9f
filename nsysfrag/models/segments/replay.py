"""The ``pytorch-segments`` model: PyTorch caching-allocator blocks inside their segments.

The replay runs forwards from the layout at the start of the snapshot's window (``window``),
so frees of blocks allocated before the window are ordinary frees, not anomalies.

Free memory is the inactive ranges inside reserved segments (``layout``). After every event the
model reports ``F`` = reserved − active, ``L`` the largest free block, ``N`` the number of
free blocks and ``U`` the requested bytes of live blocks, plus reserved, active, pending and
requested bytes. A block stays active until ``free_completed``: a block freed by the program
but still in use on another stream (``free_requested``) cannot be reused yet; it is no longer
*allocated* in PyTorch's sense (``memory_stats()["allocated_bytes"]`` drops at the request), so
allocated = active − pending.

Block sizes: a block live at the snapshot has its recorded size. Otherwise the history gives
only the requested bytes, so the block takes ``round_size(requested)`` (``rules``), or the whole
free block it was carved from when PyTorch would not split that (its ``should_split``). A block
live at the window's start and freed in it was carved from the free range up to the next block
live at the start (or its segment's end), by the same rule; and when an allocation lands past a
free gap that starts where such a block ends, the block reached that far (PyTorch carves from
the low end of a free block, so it leaves no gap there): the replay is run again with that size
(``repairs``), until no allocation says so.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nsysfrag.events import AllocationEvents, NameCodes
from nsysfrag.models.segments.device_replay import DeviceReplay, OomEvent
from nsysfrag.models.segments.layout import Layout, _Block, _Seg
from nsysfrag.models.segments.rules import (
    K_SMALL_BUFFER,
    AllocatorSettings,
    round_size,
    should_split,
)
from nsysfrag.models.segments.window import WindowStart, _final_segments, window_start
from nsysfrag.models.series import (
    ALLOCATED,
    FREED,
    NO_BLOCK,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    UNMATCHED_FREE,
    WINDOW_START,
    ZERO_SIZE_ALLOC,
    FreeBlocks,
    StrandedSegment,
)
from nsysfrag.models.snapshot_entries import ACTION_KINDS, NO_STACK, HistoryEntry, Segment

_SEGMENT_CODES = {
    "segment_alloc": SEGMENT_ALLOC,
    "segment_free": SEGMENT_FREE,
    "segment_map": SEGMENT_MAP,
    "segment_unmap": SEGMENT_UNMAP,
}


# How often the replay is repeated with repaired sizes at most: each round repairs every block
# an allocation shows too short, so a second round settles any snapshot seen so far.
MAX_REPAIR_ROUNDS = 8


def replay_device(
    events: AllocationEvents,
    final: Sequence[Segment],
    settings: AllocatorSettings,
    timestamps: bool = True,
) -> DeviceReplay:
    """Replay one device's events from the window's start; ``final`` are its segments at the
    window's end."""
    repairs: dict[int, int] = {}
    for _ in range(MAX_REPAIR_ROUNDS):
        replayer = _replayer(events, final, settings, timestamps, repairs)
        result = replayer.run()
        if not replayer.repairs:
            break
        repairs = {**repairs, **replayer.repairs}
    result.repairs = repairs
    return result


def free_blocks_after(
    events: AllocationEvents,
    final: Sequence[Segment],
    settings: AllocatorSettings,
    point: int,
    repairs: dict[int, int] | None = None,
) -> FreeBlocks:
    """The free blocks right after timeline point ``point`` (replaying only that far); with
    the bytes of wholly free (non-expandable) segments among them. ``repairs``: a full replay's
    (found by one when not given)."""
    if repairs is None:
        repairs = replay_device(events, final, settings).repairs
    return _replayer(events, final, settings, True, repairs).free_blocks_after(point)


_ACTIONS = {kind: action for action, kind in ACTION_KINDS.items()}


def _entries(events: AllocationEvents) -> list[HistoryEntry]:
    """The events as the history entries this replay walks (the entries' own times are not
    needed: the events carry them)."""
    n = len(events)
    codes, names = events.sites.codes(np.arange(n, dtype=np.int64))
    none = np.full(n, -1, dtype=np.int64)
    stream = events.stream if events.stream is not None else np.zeros(n, dtype=np.int64)
    free = events.device_free_bytes if events.device_free_bytes is not None else none
    return [
        HistoryEntry(_ACTIONS[k], a, b, st, None, names[c], f if f >= 0 else None)
        for k, a, b, st, c, f in zip(
            events.kind.tolist(), events.address.tolist(), events.bytes.tolist(),
            stream.tolist(), codes.tolist(), free.tolist(), strict=True,
        )
    ]  # fmt: skip


def stranded_after(
    events: AllocationEvents,
    final: Sequence[Segment],
    settings: AllocatorSettings,
    point: int,
    repairs: dict[int, int],
) -> list[StrandedSegment]:
    """The segments holding stranded memory right after timeline point ``point``."""
    return _replayer(events, final, settings, True, repairs).stranded_after(point)


def _replayer(
    events: AllocationEvents,
    final: Sequence[Segment],
    settings: AllocatorSettings,
    timestamps: bool,
    repairs: dict[int, int] | None = None,
) -> _Replayer:
    entries = _entries(events)
    start = window_start(final, entries)
    return _Replayer(
        settings, final, entries, events.time_ns.tolist(), timestamps, start, repairs or {}
    )


class _Replayer:
    def __init__(
        self,
        settings: AllocatorSettings,
        final: Sequence[Segment],
        entries: Sequence[HistoryEntry],
        times: list[int],
        timestamps: bool,
        start: WindowStart,
        known_initial: dict[int, int] | None = None,
    ) -> None:
        self.settings = settings
        self.known_initial = known_initial or {}  # repaired sizes of blocks live at the start
        self.repairs: dict[int, int] = {}  # what this run found too short
        self.final = final
        self.entries = entries
        self.times = times
        self.timestamps = timestamps
        self.start = start
        self.sites = NameCodes([NO_STACK])
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
        pending = self.cols["pending_bytes"]
        start_points = len(pending)  # one moment: the layout at the window's start
        for j, e in enumerate(self.entries):
            self._apply(j, e, times[j], fold[j])
            self._track()
        if pending:  # the end of the trace is the last point's state: a free_requested after it
            # counts; where no entry made a point, the last is the start, all of its points
            first = 0 if len(pending) <= start_points else len(pending) - 1
            pending[first:] = [self.layout.pending] * (len(pending) - first)
        return self._result(initial, initial_reserved, timestamps)

    def free_blocks_after(self, point: int) -> FreeBlocks:
        self._run_to(point)
        return FreeBlocks(
            np.asarray(self.layout.free_sizes(), dtype=np.int64), self.layout.releasable()
        )

    def stranded_after(self, point: int) -> list[StrandedSegment]:
        self._run_to(point)
        return self.layout.stranded()

    def _run_to(self, point: int) -> None:
        """The layout right after timeline point ``point`` (replaying only that far)."""
        times, _, fold, _, _ = self._begin()
        for j, e in enumerate(self.entries):
            if len(self.cols["time_ns"]) > point:
                break
            self._apply(j, e, times[j], fold[j])

    def _begin(self) -> tuple[list[int], bool, list[bool], int, int]:
        """The layout at the window's start, and its points; the entries' times and folds."""
        segs = self.start.segments
        layout = self.layout = Layout(segs)
        times, timestamps = self.times, self.timestamps
        t0 = times[0] if times else 0
        initial_reserved = layout.reserved
        initial = self._place_initial_blocks()
        self._track()
        for b, site in initial:
            b.point = len(self.cols["time_ns"])
            self._point(t0, ALLOCATED, b.address, b.requested or b.size, site=site)
            self.stack.append(b)
        fold = _folded(self.entries)
        if not initial:  # the start of the window is a moment all the same: its segments, ...
            for s in segs.starts:
                self._point(t0, SEGMENT_ALLOC, s, segs.seg[s].end - s)
            has_points = any(
                e.action in ("alloc", "free_completed", "free", "oom")
                or (e.action in _SEGMENT_CODES and not fold[j])
                for j, e in enumerate(self.entries)
            )
            if not segs.starts and has_points:  # ... or the empty device
                self._point(t0, WINDOW_START, 0, 0)
        return times, timestamps, fold, len(initial), initial_reserved

    # -- the initial layout

    def _place_initial_blocks(self) -> list[tuple[_Block, int]]:
        """The blocks live at the window's start, by address, with their site codes."""
        layout = self.layout
        out = []
        items = sorted(self.start.blocks.items())
        for k, (address, r) in enumerate(items):
            size = r.size
            seg_start = layout.segs.find(address)
            if seg_start is not None:
                seg = layout.segs.seg[seg_start]
                limit = seg.end
                if k + 1 < len(items):
                    limit = min(limit, max(items[k + 1][0], address))
                if size is None:  # carved from the free range up to the next such block
                    size = self.known_initial.get(address)
                    if size is None:
                        size = self._carve(max(r.requested, 1), limit - address, seg, seg_start)
                if size > limit - address:  # it would reach into the next block or past its
                    self.conflicts += 1  # segment's end: the trace does not fit its segments
                size = max(min(size, limit - address), 0)
            elif size is None:
                size = round_size(max(r.requested, 1), self.settings.roundup_power2_divisions)
            span = layout.free_containing(address)
            placed = (
                seg_start is not None
                and size > 0
                and span is not None
                and span[1] >= address + size
            )
            if not placed:
                self.conflicts += 1
            b = _Block(address, size, r.requested, NO_BLOCK, placed, inferred=r.size is None)
            layout.add_block(b)
            if r.pending:
                layout.request_free(b)
            out.append((b, self.sites.code(r.site)))
        return out

    # -- one history entry

    def _apply(self, j: int, e: HistoryEntry, t: int, folded: bool) -> None:
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
                    small = e.size == K_SMALL_BUFFER
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
                self._drop(b, len(self.cols["time_ns"]))
            base = layout.segs.find(e.address)
            if base is None or layout.segs.seg[base].end < end:
                self.conflicts += 1
            else:
                if a == "segment_free" and (base != e.address or layout.segs.seg[base].end != end):
                    self.conflicts += 1
                # The segments first: what is left of the free block belongs to the new ones.
                layout.segs.unmap_range(e.address, end)
                layout.remove_free_range(e.address, end)
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
                    allocated_bytes=layout.allocated - layout.pending,
                    stream=e.stream,
                    site=e.site,
                )
            )
            self._point(t, OOM, 0, e.size)
        elif a == "free_requested":
            # PyTorch's allocated bytes drop now; the block stays active (not reusable) until
            # free_completed. No point of its own: the next point shows it.
            freed = layout.blocks.get(e.address)
            if freed is not None:
                layout.request_free(freed)
        # "snapshot" entries change nothing

    def _alloc(self, j: int, e: HistoryEntry, t: int) -> None:
        layout = self.layout
        point = len(self.cols["time_ns"])
        overlap = False
        if e.address in layout.blocks:  # a second alloc of a live block: its free went missing
            overlap = True
            self._drop(layout.blocks[e.address], point)
        size = self.start.known_sizes.get(j)
        seg_start = layout.segs.find(e.address)
        placed = False
        if seg_start is not None:
            seg = layout.segs.seg[seg_start]
            span = layout.free_containing(e.address)
            if span is not None and span[0] < e.address:
                self._repair(span[0], e.address)
            if size is None:
                size = self._block_size(e, seg, seg_start)
            if size > seg.end - e.address:  # the block would cross its segment's end: the
                self.conflicts += 1  # trace does not fit (e.g. its segment_map came later)
            size = max(min(size, seg.end - e.address), 1)
            span = layout.free_containing(e.address)
            if span is None or span[1] < e.address + size:
                overlap = True
                for b in layout.blocks_in(e.address, e.address + size):
                    self._drop(b, point)
                span = layout.free_containing(e.address)
            placed = span is not None and span[1] >= e.address + size
        if size is None:
            size = round_size(e.size, self.settings.roundup_power2_divisions)
        if not placed:  # outside every segment: counted, live, but not in the layout
            overlap = True
            self.conflicts += 1
        b = _Block(e.address, size, e.size, point, placed)
        layout.add_block(b)
        self.stack.append(b)
        self._point(t, ALLOCATED, e.address, e.size, site=self.sites.code(e.site), overlap=overlap)

    def _repair(self, gap_start: int, address: int) -> None:
        """An allocation at ``address`` inside a free gap from ``gap_start``: PyTorch carves
        from the low end of a free block, so a block live at the window's start that ends at
        ``gap_start`` and whose size was inferred reached ``address``."""
        below = self.layout.blocks.get(self.layout.block_ending.get(gap_start, -1))
        if below is not None and below.inferred:
            self.repairs[below.address] = address - below.address

    def _block_size(self, e: HistoryEntry, seg: _Seg, seg_start: int) -> int:
        """The block PyTorch carved: rounded, or the whole free block when it would not split."""
        span = self.layout.free_containing(e.address)
        if span is None:
            return round_size(e.size, self.settings.roundup_power2_divisions)
        return self._carve(e.size, span[1] - e.address, seg, seg_start)

    def _carve(self, requested: int, available: int, seg: _Seg, seg_start: int) -> int:
        """The block PyTorch carves for ``requested`` bytes from the low end of a free range of
        ``available`` bytes in segment ``seg``: rounded, or all of it when it would not split."""
        size = round_size(requested, self.settings.roundup_power2_divisions)
        if available <= size:
            return size
        remaining = available - size
        small = seg.small_pool
        if small is None:
            small = not seg.expandable and seg.end - seg_start == K_SMALL_BUFFER
        expandable = seg.expandable or self.settings.expandable_segments
        split = should_split(remaining, size, small, expandable, self.settings.max_split_size)
        return size if split else available

    def _free(self, e: HistoryEntry, t: int) -> None:
        layout = self.layout
        b = layout.blocks.get(e.address)
        if b is None:
            self.conflicts += 1
            self._point(t, UNMATCHED_FREE, e.address, e.size)
            return
        i = len(self.cols["time_ns"])
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
        c["time_ns"].append(t)
        c["event"].append(code)
        c["address"].append(address)
        c["bytes"].append(nbytes)
        c["free_bytes"].append(layout.free_total)
        c["largest_free_bytes"].append(layout.largest_free())
        c["free_blocks"].append(len(layout.free_end))
        c["live_bytes"].append(layout.requested)
        c["reserved_bytes"].append(layout.reserved)
        c["active_bytes"].append(layout.allocated)
        c["pending_bytes"].append(layout.pending)
        c["releasable_bytes"].append(layout.releasable_total)
        c["site"].append(site)
        c["overlap"].append(overlap)
        c["out_of_order"].append(out_of_order)
        c["hole"].append(hole)
        c["freed_alloc"].append(freed)
        c["pin_left"].append(left)
        c["pin_right"].append(right)

    def _result(self, initial: int, initial_reserved: int, timestamps: bool) -> DeviceReplay:
        c = self.cols
        n = len(c["time_ns"])
        removed_at = np.full(n, NO_BLOCK, dtype=np.int64)
        for alloc_point, at in self.removed:
            if 0 <= alloc_point < n:
                removed_at[alloc_point] = min(at, n - 1)
        columns: dict[str, Any] = {
            k: np.asarray(v, dtype=_DTYPES.get(k, np.int64)) for k, v in c.items()
        }
        low = self.low if self.low is not None else 0
        return DeviceReplay(
            **columns,
            removed_at=removed_at,
            site_names=self.sites.names,
            initial_blocks=initial,
            initial_reserved_bytes=initial_reserved,
            trace_entries=len(self.entries),
            timestamps=timestamps,
            conflicts=self.conflicts,
            final_mismatches=self._final_mismatches(),
            base_address=low,
            end_address=max(self.high, low),
            peak_allocated=self.peak_allocated,
            max_reserved_bytes=self.max_reserved,
            max_active_bytes=self.max_allocated,
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


# The columns of each point, named as DeviceReplay's fields; int64 unless _DTYPES says.
_COLUMNS = (
    "time_ns", "event", "address", "bytes", "free_bytes", "largest_free_bytes", "free_blocks",
    "live_bytes", "reserved_bytes", "active_bytes", "pending_bytes", "releasable_bytes", "site",
    "overlap",
    "out_of_order", "hole", "freed_alloc", "pin_left", "pin_right",
)  # fmt: skip
_DTYPES = {
    "event": np.int8, "address": np.uint64, "overlap": np.bool_, "out_of_order": np.bool_,
    "hole": np.bool_,
}  # fmt: skip


def _folded(entries: Sequence[HistoryEntry]) -> list[bool]:
    """A segment_alloc/segment_map that an alloc follows is part of that malloc: its state
    (a new, still empty segment) lasts no time, so it is not a timeline point of its own."""
    out = [False] * len(entries)
    next_is_alloc = False
    for j in range(len(entries) - 1, -1, -1):
        a = entries[j].action
        if a in ("segment_alloc", "segment_map"):
            out[j] = next_is_alloc
        else:
            next_is_alloc = a == "alloc"
    return out

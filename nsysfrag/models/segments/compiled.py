"""One device of a snapshot through the compiled pytorch-segments replay (``kernel``).

This module turns a device's events (the one event model) and its final segments into the
kernel's arrays (the ranked addresses, the final segments and blocks, which segment entries
fold into the alloc after them) and the kernel's output into the same
:class:`~nsysfrag.models.segments.replay.DeviceReplay` the pure-Python replay returns, so the
two can be compared column for column.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from nsysfrag import interpreted
from nsysfrag.events import (
    ALLOC,
    FAILED_ALLOC,
    FREE,
    FREE_COMPLETED,
    I64,
    MARK,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    AllocationEvents,
    ProgressCallback,
)
from nsysfrag.models.segments.device_replay import DeviceReplay, OomEvent
from nsysfrag.models.segments.kernel import (
    F_HOLE,
    F_OUT_OF_ORDER,
    F_OVERLAP,
    O_ADDRESS,
    O_ALLOCATED,
    O_BLOCKS,
    O_BYTES,
    O_FREE,
    O_FREED,
    O_LARGEST,
    O_LEFT,
    O_LIVE,
    O_PENDING,
    O_RELEASABLE,
    O_REMOVED,
    O_RESERVED,
    O_RIGHT,
    O_SITE,
    O_TIME,
    OUTPUT_ROWS,
    R_FOUND,
    R_KNOWN,
    R_ON,
    R_REQ,
    R_SITE,
    R_SIZE,
    START_COLUMNS,
    rebuild_window,
    replay_forward,
)
from nsysfrag.models.segments.kernel_layout import (
    B_LIVE,
    B_PLACED,
    B_POINT,
    B_SIZE,
    S_END,
    S_EXP,
    S_ON,
    S_SMALL,
    S_STREAM,
    T_CONFLICTS,
    T_HIGH,
    T_LEAVES,
    T_LOW,
    T_MAX_ALLOCATED,
    T_MAX_REQUESTED,
    T_MAX_RESERVED,
    T_NSEG,
    T_PEAK_ALLOC,
    T_PEAK_REQ,
    new_layout,
)
from nsysfrag.models.segments.replay import MAX_REPAIR_ROUNDS
from nsysfrag.models.segments.rules import AllocatorSettings
from nsysfrag.models.segments.window import _final_segments
from nsysfrag.models.series import FreeBlocks, StrandedSegment
from nsysfrag.models.snapshot_entries import NO_STACK, Segment

_SEGMENT_ACTIONS = np.array([SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP], np.int8)
_NO_ADDRESS = np.array([FAILED_ALLOC, MARK], np.int8)


@dataclass(frozen=True)
class WindowLayout:
    """A device's layout at its first history entry, rebuilt from the final state (arrays)."""

    segment_start: I64
    segment_end: I64
    segment_stream: I64
    segment_small_pool: I64  # 1 small, 0 large, -1 not recorded
    segment_expandable: npt.NDArray[np.bool_]
    block_address: I64  # the blocks live at the window's start, by address
    block_size: I64  # -1 where only the final state could have said (it was freed in the window)
    block_requested: I64
    block_site: I64  # code into the CompiledDevice's site_names
    known_size: (
        I64  # per trace entry: the size of an alloc's block where the final state has it, else -1
    )
    conflicts: int  # entries the final state contradicts


@dataclass
class _Run:
    """The layout of one run of the kernels, from the window's start on."""

    layout: tuple[np.ndarray, ...]
    rb: I64  # the blocks live at the window's start, per slot
    known: I64  # per entry: the size of an alloc's block where the final state has it
    initial: int  # how many blocks are live at the window's start

    @property
    def seg(self) -> I64:
        return self.layout[1]

    @property
    def blk(self) -> I64:
        return self.layout[3]

    @property
    def tot(self) -> I64:
        return self.layout[7]


class CompiledDevice:
    """One device of a snapshot, ready for the compiled kernels: every address ranked, the
    entries' slots, times and folds, the final segments and blocks. Each query runs the
    kernels afresh on these inputs (the window's start is rebuilt in one cheap pass)."""

    def __init__(
        self,
        events: AllocationEvents,
        final: Sequence[Segment],
        settings: AllocatorSettings,
        timestamps: bool = True,
    ) -> None:
        n = len(events)
        self.events = events
        self.final = list(final)
        self.settings = settings
        self.timestamps = timestamps
        act = events.kind
        address = events.address.view(np.int64)  # a snapshot's addresses are below 2**62
        size = events.bytes
        codes, names = events.sites.codes(np.arange(n, dtype=np.int64))
        self.site_codes = codes
        names = self.site_names = list(names)
        code_of = {name: code for code, name in enumerate(names)}
        has_address = ~np.isin(act, _NO_ADDRESS)
        is_segment = np.isin(act, _SEGMENT_ACTIONS)
        blocks = [b for s in self.final for b in s.blocks]
        keys = self.keys = np.unique(np.concatenate([
            np.fromiter((s.address for s in self.final), np.int64, len(self.final)),
            np.fromiter((b.address for b in blocks), np.int64, len(blocks)),
            address[has_address],
            address[is_segment] + size[is_segment],
        ]))  # fmt: skip
        slot_e = np.where(is_segment, np.searchsorted(keys, address + size), 0)
        stream = events.stream if events.stream is not None else np.zeros(n, dtype=np.int64)
        self.entries = (
            act, np.searchsorted(keys, address), slot_e, address, size, stream, codes,
        )  # fmt: skip
        self.final_segments = (
            np.searchsorted(keys, [s.address for s in self.final]).astype(np.int64),
            np.asarray([s.address + s.size for s in self.final], dtype=np.int64),
            np.asarray([s.stream for s in self.final], dtype=np.int64),
            np.asarray([-1 if s.small_pool is None else int(s.small_pool) for s in self.final],
                       dtype=np.int64),
            np.asarray([int(s.expandable) for s in self.final], dtype=np.int64),
        )  # fmt: skip
        for b in blocks:
            if b.site not in code_of:
                code_of[b.site] = len(names)
                names.append(b.site)
        self.final_blocks = (
            np.asarray([i for i, s in enumerate(self.final) for _ in s.blocks], dtype=np.int64),
            np.searchsorted(keys, [b.address for b in blocks]).astype(np.int64),
            np.asarray([b.size for b in blocks], dtype=np.int64),
            np.asarray([b.requested_bytes for b in blocks], dtype=np.int64),
            np.asarray([code_of[b.site] for b in blocks], dtype=np.int64),
            np.asarray([int(b.pending_free) for b in blocks], dtype=np.int64),
        )
        self.fold = self._folded()
        # Sizes of blocks live at the window's start that an allocation showed too short (slot
        # -> size), and whether the replay has settled them (``replay`` docs the repairs).
        self.repairs: dict[int, int] = {}
        self.settled = False

    def _rebuild(self) -> _Run:
        """A fresh layout, at the window's start."""
        layout = new_layout(self.keys)
        rb = np.zeros((len(self.keys), START_COLUMNS), dtype=np.int64)
        known = np.full(len(self.events), -1, dtype=np.int64)
        initial = interpreted.chosen(rebuild_window, len(self.events))(
            layout, self.entries, self.final_segments, self.final_blocks, rb, known
        )
        rb[:, R_KNOWN] = rb[:, R_FOUND] = -1
        for slot, size in self.repairs.items():
            rb[slot, R_KNOWN] = size
        return _Run(layout, rb, known, int(initial))

    def window_start(self) -> WindowLayout:
        run = self._rebuild()
        seg, rb = run.seg, run.rb
        on = np.flatnonzero(seg[:, S_ON] == 1)
        live = np.flatnonzero(rb[:, R_ON] == 1)
        return WindowLayout(
            segment_start=self.keys[on],
            segment_end=seg[on, S_END].copy(),
            segment_stream=seg[on, S_STREAM].copy(),
            segment_small_pool=seg[on, S_SMALL].copy(),
            segment_expandable=seg[on, S_EXP] == 1,
            block_address=self.keys[live],
            block_size=rb[live, R_SIZE].copy(),
            block_requested=rb[live, R_REQ].copy(),
            block_site=rb[live, R_SITE].copy(),
            known_size=run.known,
            conflicts=int(run.tot[T_CONFLICTS]),
        )

    def _folded(self) -> npt.NDArray[np.bool_]:
        """A segment_alloc/segment_map that an alloc follows is part of that malloc: its state
        (a new, still empty segment) lasts no time, so it is not a timeline point of its own."""
        act = self.events.kind
        grows = (act == SEGMENT_ALLOC) | (act == SEGMENT_MAP)
        others = np.flatnonzero(~grows)
        if len(others) == 0:  # nothing but segment allocations: no alloc follows any of them
            return np.zeros(len(act), dtype=np.bool_)
        nxt = np.searchsorted(others, np.arange(len(act)))
        after = np.where(nxt < len(others), act[others[np.minimum(nxt, len(others) - 1)]], -1)
        return np.asarray(grows & (after == ALLOC))

    def _run(
        self, stop: int = -1, progress: ProgressCallback | None = None
    ) -> tuple[_Run, tuple[np.ndarray, ...]]:
        """The forward replay; with ``stop`` >= 0, only up to that point and nothing recorded."""
        run = self._rebuild()
        act = self.events.kind
        t_ns = self.events.time_ns
        t0 = int(t_ns[0]) if len(t_ns) else 0
        grows = ((act == SEGMENT_ALLOC) | (act == SEGMENT_MAP)) & ~self.fold
        entry_points = int(
            np.isin(act, [ALLOC, FREE_COMPLETED, FREE, FAILED_ALLOC, SEGMENT_FREE, SEGMENT_UNMAP]).sum()
            + grows.sum()
        )
        has_points = entry_points > 0
        # The window's start: its live blocks, else its segments, else the empty device.
        start_points = run.initial or int(run.tot[T_NSEG]) or int(has_points)
        n_points = start_points + entry_points
        record = stop < 0
        width = n_points if record else 0
        out_i64 = np.zeros((OUTPUT_ROWS, width), dtype=np.int64)
        out_i64[O_REMOVED] = -1
        out_flags = np.zeros((3, width), dtype=np.bool_)
        out_event = np.zeros(width, dtype=np.int8)
        ooms = np.zeros((5, int((act == FAILED_ALLOC).sum()) if record else 0), dtype=np.int64)
        rules = np.zeros(6 + 16, dtype=np.int64)
        settings = self.settings
        rules[:6] = (
            t0, has_points, settings.max_split_size or -1, settings.expandable_segments, stop,
            record,
        )  # fmt: skip
        for key, count in settings.roundup_power2_divisions.items():
            if key & (key - 1) == 0 and key <= 1 << 15:  # the start of interval i is 2**i MiB
                rules[6 + key.bit_length() - 1] = count
        shown = np.zeros(1, dtype=np.int64)
        out = (out_i64, out_flags, out_event)
        args = (run.layout, self.entries, run.known, self.fold, t_ns, run.rb, rules, out, ooms,
                shown)  # fmt: skip
        result = _run_reporting(args, progress, shown, len(act))
        self.initial_reserved = int(result[1])
        return run, (out_i64, out_flags, out_event, ooms)

    def free_blocks_at(self, point: int) -> FreeBlocks:
        """The free blocks right after timeline point ``point`` (replaying only that far)."""
        if not self.settled:
            self.replay()
        run, _ = self._run(stop=point)
        leaves = int(run.tot[T_LEAVES])
        gaps = run.layout[5][leaves : leaves + 2 * len(self.keys)]
        sizes = gaps[gaps > 0]
        opening = gaps[0::2]
        seg = run.seg
        on = seg[:, S_ON] == 1
        whole = on & (seg[:, S_EXP] == 0) & (opening == seg[:, S_END] - self.keys)
        return FreeBlocks(sizes.copy(), int(opening[whole & (opening > 0)].sum()))

    def stranded_at(self, point: int) -> list[StrandedSegment]:
        """The segments holding stranded memory right after timeline point ``point``: their
        free gaps' bytes beyond the releasable ones, and the points of their live blocks."""
        if not self.settled:
            self.replay()
        run, _ = self._run(stop=point)
        keys, seg, blk = self.keys, run.seg, run.blk
        n = len(keys)
        leaves = int(run.tot[T_LEAVES])
        stranded = run.layout[5][leaves : leaves + 2 * n] - run.layout[6][: 2 * n]
        on = np.flatnonzero(seg[:, S_ON] == 1)
        starts = keys[on]

        def segment_of(slots: I64) -> I64:  # the row in ``on`` of the segment holding each slot
            return np.searchsorted(starts, keys[slots], side="right") - 1

        owner = np.empty(2 * n, dtype=np.int64)  # leaf 2k opens segment k, 2k+1 follows block k
        owner[0::2] = np.where(seg[:, S_ON] == 1, np.searchsorted(starts, keys), -1)
        owner[1::2] = segment_of(np.arange(n))
        has = (stranded > 0) & (owner >= 0)
        per_segment = np.bincount(owner[has], weights=stranded[has], minlength=len(on))
        live = np.flatnonzero((blk[:, B_LIVE] == 1) & (blk[:, B_PLACED] == 1))
        holder = segment_of(live)
        out = []
        for row in np.flatnonzero(per_segment > 0).tolist():
            points = blk[live[holder == row], B_POINT]
            out.append(StrandedSegment(int(starts[row]), int(per_segment[row]), tuple(points.tolist())))
        return out

    def _final_mismatches(self, run: _Run) -> int:
        """How far the replay's end is from the snapshot: differing ranges and blocks."""
        final_segs, final_blocks = _final_segments(self.final)
        seg, blk = run.seg, run.blk
        on = np.flatnonzero(seg[:, S_ON] == 1)
        got_ranges: list[tuple[int, int]] = []
        for start, end in zip(self.keys[on].tolist(), seg[on, S_END].tolist(), strict=True):
            if got_ranges and got_ranges[-1][1] == start:
                got_ranges[-1] = (got_ranges[-1][0], end)
            else:
                got_ranges.append((start, end))
        placed = np.flatnonzero((blk[:, B_LIVE] == 1) & (blk[:, B_PLACED] == 1))
        got_blocks = set(zip(self.keys[placed].tolist(), blk[placed, B_SIZE].tolist(), strict=True))
        want_blocks = {(a, b.size) for a, b in final_blocks.items()}
        return len(set(final_segs.ranges()) ^ set(got_ranges)) + len(want_blocks ^ got_blocks)

    def replay(self, progress: ProgressCallback | None = None) -> DeviceReplay:
        """Replay the device's trace from the window's start; again, with the repaired sizes,
        while an allocation shows a block live at the start to be longer than inferred."""
        for _ in range(MAX_REPAIR_ROUNDS):
            run, (out_i64, out_flags, out_event, ooms) = self._run(progress=progress)
            found = np.flatnonzero(run.rb[:, R_FOUND] >= 0)
            if len(found) == 0:
                break
            self.repairs.update(zip(found.tolist(), run.rb[found, R_FOUND].tolist(), strict=True))
        self.settled = True
        site, site_names = _local_sites(out_i64[O_SITE], out_event, self.site_names)
        events = self.events
        tot = run.tot
        device_free = events.device_free_bytes
        stream = self.entries[5]
        oom_events = []
        for j, largest, free, reserved, allocated in ooms.T.tolist():
            recorded = int(device_free[j]) if device_free is not None else -1
            oom_events.append(OomEvent(
                time_ns=int(events.time_ns[j]),
                device_free_bytes=recorded if recorded >= 0 else None,
                requested_bytes=int(events.bytes[j]),
                largest_free_bytes=largest,
                free_bytes=free,
                reserved_bytes=reserved,
                allocated_bytes=allocated,
                stream=int(stream[j]),
                site=self.site_names[int(self.site_codes[j])],
            ))  # fmt: skip
        low = int(tot[T_LOW]) if tot[T_LOW] >= 0 else 0
        return DeviceReplay(
            time_ns=out_i64[O_TIME],
            event=out_event,
            address=out_i64[O_ADDRESS].view(np.uint64),
            bytes=out_i64[O_BYTES],
            free_bytes=out_i64[O_FREE],
            largest_free_bytes=out_i64[O_LARGEST],
            free_blocks=out_i64[O_BLOCKS],
            live_bytes=out_i64[O_LIVE],
            reserved_bytes=out_i64[O_RESERVED],
            active_bytes=out_i64[O_ALLOCATED],
            pending_bytes=out_i64[O_PENDING],
            releasable_bytes=out_i64[O_RELEASABLE],
            out_of_order=out_flags[F_OUT_OF_ORDER],
            hole=out_flags[F_HOLE],
            freed_alloc=out_i64[O_FREED],
            pin_left=out_i64[O_LEFT],
            pin_right=out_i64[O_RIGHT],
            removed_at=out_i64[O_REMOVED],
            overlap=out_flags[F_OVERLAP],
            site=site,
            site_names=site_names,
            initial_blocks=run.initial,
            initial_reserved_bytes=self.initial_reserved,
            trace_entries=len(events),
            timestamps=self.timestamps,
            conflicts=int(tot[T_CONFLICTS]),
            final_mismatches=self._final_mismatches(run),
            base_address=low,
            end_address=max(int(tot[T_HIGH]), low),
            peak_allocated=(int(tot[T_PEAK_ALLOC]), int(tot[T_PEAK_REQ])),
            max_reserved_bytes=int(tot[T_MAX_RESERVED]),
            max_active_bytes=int(tot[T_MAX_ALLOCATED]),
            max_requested_bytes=int(tot[T_MAX_REQUESTED]),
            ooms=oom_events,
            repairs={int(self.keys[k]): size for k, size in sorted(self.repairs.items())},
        )


def _run_reporting(
    args: tuple[object, ...], progress: ProgressCallback | None, shown: I64, total: int
) -> tuple[int, int]:
    """The kernel, on a thread (it runs without the GIL) while this one reports progress."""
    kernel = interpreted.chosen(replay_forward, total)
    if progress is None or total < 1 << 18:
        return kernel(*args)  # type: ignore[no-any-return]
    result: list[tuple[int, int]] = []
    worker = threading.Thread(target=lambda: result.append(kernel(*args)), daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
        progress("replaying", int(shown[0]), total)
    progress("replaying", total, total)
    if not result:
        raise RuntimeError("the compiled replay stopped without a result")
    return result[0]


def _local_sites(site: I64, event: npt.NDArray[np.int8], names: list[str]) -> tuple[I64, list[str]]:
    """Site codes numbered as the Python replay numbers them: by first allocation."""
    allocated = site[event == 0]
    found, first = np.unique(allocated, return_index=True)
    order = found[np.argsort(first, kind="stable")]
    order = order[order != 0]
    lut = np.zeros(max(len(names), 1), dtype=np.int64)
    lut[order] = np.arange(1, len(order) + 1)
    return lut[site], [NO_STACK, *(names[c] for c in order.tolist())]


def replay_device(
    events: AllocationEvents,
    final: Sequence[Segment],
    settings: AllocatorSettings,
    timestamps: bool = True,
    progress: ProgressCallback | None = None,
) -> DeviceReplay:
    """Replay one device's events from the window's start, compiled."""
    return CompiledDevice(events, final, settings, timestamps).replay(progress)


def free_blocks_at(
    events: AllocationEvents, final: Sequence[Segment], settings: AllocatorSettings, point: int
) -> FreeBlocks:
    """The free blocks right after timeline point ``point`` (replaying only that far)."""
    return CompiledDevice(events, final, settings).free_blocks_at(point)


def window_start(
    events: AllocationEvents, final: Sequence[Segment], settings: AllocatorSettings
) -> WindowLayout:
    """The layout at the start of the device's history window, rebuilt from the final state."""
    return CompiledDevice(events, final, settings).window_start()

"""The pytorch-segments model (SPEC §9) from a PyTorch memory snapshot, done the slow, plain way.

Per device: the layout at the start of the trace window is rebuilt by undoing the trace
backwards from the final ``segments`` (ALLOCATORS.md §2.6), then the trace is replayed forwards.
A block born in the window gets the size PyTorch gives it: ``round_size(requested)``, or the
whole free block it is carved from when PyTorch would not split that block (ALLOCATORS.md §1.2,
§1.5). A block live at the window's start keeps its recorded size when it is still live at the
snapshot; otherwise the same rule is applied to the free range up to the next live block.

Written from SPEC 1.1, ALLOCATORS.md and the project's README only; it shares no code with
nsysfrag. Where those are silent the choice is in QUESTIONS.md (the Q numbers below).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .summary import Moment, summarize
from .unpickle import load_plain

MiB = 1 << 20
MIN_BLOCK = 512
SMALL_SIZE = 1 * MiB
PAGE = {"small": 2 * MiB, "large": 20 * MiB}  # expandable-segment pages
UNLIMITED = 1 << 62

STATE_KEYS = (
    "time_ns", "global_frag", "local_frag", "free_blocks", "largest_free_bytes", "free_bytes",
    "live_bytes", "reserved_bytes", "allocated_bytes", "active_bytes", "releasable_bytes",
    "stranded_bytes", "device_free_bytes", "largest_block_bytes",
)  # fmt: skip
# Trace actions after which the state is a moment (README: "a point per alloc, free_completed,
# segment_free/segment_unmap and oom"; QUESTIONS.md Q9).
MOMENT_ACTIONS = {"alloc", "free_completed", "free", "segment_free", "segment_unmap", "oom"}


@dataclass
class Settings:
    expandable: bool = False
    max_split: int = UNLIMITED
    divisions: dict[int, int] = field(default_factory=dict)  # interval index -> divisions
    recorded: bool = False  # the snapshot recorded allocator_settings

    @classmethod
    def from_snapshot(cls, raw: Any) -> Settings:
        if not isinstance(raw, dict):
            return cls()
        mss = raw.get("max_split_size", -1)
        mss = UNLIMITED if not isinstance(mss, int) or mss <= 0 or mss >= UNLIMITED else mss
        divisions = {}
        for key, value in (raw.get("roundup_power2_divisions") or {}).items():
            idx = int(key).bit_length() - 1  # keys are the interval starts in MiB: 1, 2, 4, ...
            divisions[min(max(idx, 0), 15)] = int(value)
        return cls(bool(raw.get("expandable_segments", False)), mss, divisions, recorded=True)

    def round_size(self, size: int) -> int:
        """ALLOCATORS.md §1.2, transcribed here on purpose: the reference must not call the
        nsysfrag code it checks (so ``duplicates`` finds nsysfrag's own transcription)."""
        if size < MIN_BLOCK:
            return MIN_BLOCK
        idx = min(max(size.bit_length() - 1 - 20, 0), 15)
        d = self.divisions.get(idx, 0)
        if d > 1 and size > MIN_BLOCK * d:
            if size & (size - 1) == 0:
                return size
            p = 1 << (size.bit_length() - 1)
            step = p // d
            if step == 0:
                return 2 * p
            f = size & ~(step - 1)
            return size if f == size else f + step
        return -(-size // MIN_BLOCK) * MIN_BLOCK

    def block_size(self, requested: int, room: int, expandable_segment: bool) -> int:
        """The size of a block carved for ``requested`` bytes at the low end of a free range of
        ``room`` bytes (ALLOCATORS.md §1.5 should_split)."""
        size = self.round_size(requested)
        remaining = room - size
        if remaining < 0:
            return size
        if size <= SMALL_SIZE or self.expandable or expandable_segment:
            split = remaining >= MIN_BLOCK
        else:
            split = size < self.max_split and remaining > SMALL_SIZE
        return size if split else room


@dataclass
class Segment:
    address: int
    size: int
    expandable: bool
    pool: str | None  # "small" / "large"; None when not yet known (a range mapped in the window)

    @property
    def end(self) -> int:
        return self.address + self.size


@dataclass
class Block:
    size: int | None  # None: live at the window's start, freed in it, size not yet known
    requested: int
    inferred: bool = False  # its size came from _size_initial_blocks, not from the record
    # SPEC 1.2 §9: freed by the program, its free pending on other streams (free_requested, or
    # state active_pending_free): active, not allocated.
    pending: bool = False


class Layout:
    """Segments and live blocks of one device; free ranges are what segments hold beyond blocks."""

    def __init__(self) -> None:
        self.segments: dict[int, Segment] = {}
        self.seg_starts: list[int] = []
        self.live: dict[int, Block] = {}
        self.live_starts: list[int] = []
        self.conflicts = 0
        self.reserved = 0
        # Inferred initial blocks that an allocation shows to be longer: address -> true size.
        self.repairs: dict[int, int] = {}
        # Per-segment figures, recomputed only for segments that changed since the last moment
        # (the one concession to speed: the real snapshots have up to 22,000 events).
        self.cache: dict[int, tuple[int, ...]] = {}
        self.dirty: set[int] = set()

    def touch(self, addr: int) -> None:
        seg = self.segment_at(addr)
        if seg is not None:
            self.dirty.add(seg.address)

    # -- segments
    def add_segment(self, seg: Segment) -> None:
        self.segments[seg.address] = seg
        bisect.insort(self.seg_starts, seg.address)
        self.reserved += seg.size
        self.dirty.add(seg.address)

    def drop_segment(self, seg: Segment) -> None:
        del self.segments[seg.address]
        self.seg_starts.remove(seg.address)
        self.reserved -= seg.size
        self.cache.pop(seg.address, None)
        self.dirty.discard(seg.address)

    def segment_at(self, addr: int) -> Segment | None:
        i = bisect.bisect_right(self.seg_starts, addr) - 1
        if i >= 0:
            seg = self.segments[self.seg_starts[i]]
            if addr < seg.end:
                return seg
        return None

    def blocks_in(self, lo: int, hi: int) -> list[int]:
        i = bisect.bisect_left(self.live_starts, lo)
        j = bisect.bisect_left(self.live_starts, hi)
        return self.live_starts[i:j]

    # -- blocks
    def add_block(self, addr: int, block: Block) -> None:
        self.live[addr] = block
        bisect.insort(self.live_starts, addr)
        self.touch(addr)

    def drop_block(self, addr: int) -> Block:
        self.live_starts.remove(addr)
        self.touch(addr)
        return self.live.pop(addr)

    # -- expandable ranges
    def map_range(self, addr: int, size: int, pool: str | None) -> None:
        """Add a mapped range, joined with the expandable segments it touches."""
        lo, hi = addr, addr + size
        before = self.segment_at(addr - 1)
        after = self.segments.get(hi)
        for seg in (before, after):
            if seg is not None and seg.expandable:
                self.drop_segment(seg)
                lo, hi = min(lo, seg.address), max(hi, seg.end)
                pool = pool or seg.pool
        if self.segment_at(addr) is not None or self.blocks_in(addr, addr + size):
            self.conflicts += 1
        self.add_segment(Segment(lo, hi - lo, True, pool))

    def unmap_range(self, addr: int, size: int) -> None:
        seg = self.segment_at(addr)
        if seg is None or addr + size > seg.end:
            self.conflicts += 1
            return
        for a in self.blocks_in(addr, addr + size):
            self.conflicts += 1
            self.drop_block(a)
        self.drop_segment(seg)
        if addr > seg.address:
            self.add_segment(Segment(seg.address, addr - seg.address, True, seg.pool))
        if addr + size < seg.end:
            self.add_segment(Segment(addr + size, seg.end - addr - size, True, seg.pool))

    # -- free ranges of one segment
    def gaps(self, seg: Segment) -> list[tuple[int, int]]:
        out = []
        cursor = seg.address
        for a in self.blocks_in(seg.address, seg.end):
            size = self.live[a].size
            if a > cursor:
                out.append((cursor, a))
            cursor = max(cursor, a + (size or 0))
        if seg.end > cursor:
            out.append((cursor, seg.end))
        return out


def _pool_of(seg: Segment, layout: Layout, settings: Settings) -> str:
    if seg.pool is not None:
        return seg.pool
    for a in layout.blocks_in(seg.address, seg.end):
        return "small" if settings.round_size(layout.live[a].requested) <= SMALL_SIZE else "large"
    return "large" if seg.size % PAGE["large"] == 0 else "small"  # QUESTIONS.md Q13


def _segment_figures(seg: Segment, layout: Layout, settings: Settings) -> tuple[int, ...]:
    """(active, requested, releasable, largest free, free blocks, pending) of one segment."""
    allocated = requested = releasable = largest = pending = 0
    inside = layout.blocks_in(seg.address, seg.end)
    for a in inside:
        allocated += layout.live[a].size or 0
        requested += layout.live[a].requested
        pending += (layout.live[a].size or 0) if layout.live[a].pending else 0
    gaps = layout.gaps(seg)
    for lo, hi in gaps:
        largest = max(largest, hi - lo)
    if seg.expandable:
        page = PAGE[_pool_of(seg, layout, settings)]
        for lo, hi in gaps:  # whole pages, counted from the mapped range's start
            first = seg.address + -(-(lo - seg.address) // page) * page
            last = seg.address + (hi - seg.address) // page * page
            releasable += max(0, last - first)
    elif not inside:
        releasable = seg.size
    return allocated, requested, releasable, largest, len(gaps), pending


def _raw_state(layout: Layout, settings: Settings) -> dict[str, int]:
    """Everything of SPEC §9 that does not depend on the capacity."""
    for addr in layout.dirty:
        layout.cache[addr] = _segment_figures(layout.segments[addr], layout, settings)
    layout.dirty.clear()
    figures = layout.cache.values()
    return {
        "reserved": layout.reserved,
        "active": sum(f[0] for f in figures),
        "allocated": sum(f[0] - f[5] for f in figures),
        "requested": sum(f[1] for f in figures),
        "releasable": sum(f[2] for f in figures),
        "largest": max((f[3] for f in figures), default=0),
        "n_free": sum(f[4] for f in figures),
    }


def _derive(raw: dict[str, int], cap: int) -> dict[str, Any]:
    free_in_segments = raw["reserved"] - raw["active"]  # F
    device_free = max(cap - raw["reserved"], 0)  # D
    l_eff = max(raw["largest"], device_free + raw["releasable"])
    free = device_free + free_in_segments
    return {
        "global_frag": min(1.0, (free - l_eff) / cap) if cap else 0.0,
        "local_frag": 0.0 if free == 0 else 1 - l_eff / free,
        "free_blocks": raw["n_free"] + (1 if device_free > 0 else 0),
        "largest_free_bytes": l_eff,
        "free_bytes": free,
        "live_bytes": raw["requested"],
        "reserved_bytes": raw["reserved"],
        "allocated_bytes": raw["allocated"],
        "active_bytes": raw["active"],
        "releasable_bytes": raw["releasable"],
        "stranded_bytes": free_in_segments - raw["releasable"],
        "device_free_bytes": device_free,
        "largest_block_bytes": raw["largest"],
        "material": free >= 0.05 * cap,
    }


# ---------------------------------------------------------------------------- reading


def _final_layout(segments: list[dict[str, Any]]) -> Layout:
    layout = Layout()
    for s in segments:
        expandable = bool(s.get("is_expandable", False))
        layout.add_segment(Segment(s["address"], s["total_size"], expandable, s.get("segment_type")))
        addr = s["address"]
        for b in s.get("blocks", []):
            addr = b.get("address", addr)
            if b["state"] != "inactive":
                pending = b["state"] in ("active_pending_free", "active_awaiting_free")
                layout.add_block(addr, Block(b["size"], _requested(b), pending=pending))
            addr += b["size"]
    return layout


def _requested(block: dict[str, Any]) -> int:
    history = block.get("history")
    if history:  # PyTorch 2.0: as _memory_viz._block_extra_legacy does
        return int(history[0].get("real_size", block["size"]))
    return int(block.get("requested_size", block["size"]))


def _undo(layout: Layout, trace: list[dict[str, Any]]) -> None:
    """Walk the trace backwards from the final layout: the layout at the window's start."""
    for e in reversed(trace):
        action = e["action"]
        addr = e.get("addr")
        if action == "alloc":
            if addr in layout.live:
                layout.drop_block(addr)
            else:
                layout.conflicts += 1
        elif action in ("free_completed", "free"):
            if addr in layout.live:
                layout.conflicts += 1
            else:  # a free_completed ends a requested free: pending until then
                layout.add_block(addr, Block(None, e["size"], pending=action == "free_completed"))
        elif action == "free_requested":
            if addr in layout.live:
                layout.live[addr].pending = False
                layout.touch(addr)
        elif action == "segment_alloc":
            seg = layout.segments.get(addr)
            if seg is None or layout.blocks_in(seg.address, seg.end):
                layout.conflicts += 1
            if seg is not None:
                layout.drop_segment(seg)
        elif action == "segment_free":
            pool = "small" if e["size"] == PAGE["small"] else "large"
            layout.add_segment(Segment(addr, e["size"], False, pool))
        elif action == "segment_map":
            layout.unmap_range(addr, e["size"])
        elif action == "segment_unmap":
            layout.map_range(addr, e["size"], None)


def _size_initial_blocks(layout: Layout, settings: Settings, known: dict[int, int]) -> None:
    """Blocks live at the start and freed in the window: sized by PyTorch's split rule over the
    free range up to the next live block, unless a later allocation showed the block to be
    longer (``known``; QUESTIONS.md Q10)."""
    for a in list(layout.live_starts):
        block = layout.live[a]
        if block.size is not None:
            continue
        block.inferred = True
        if a in known:
            block.size = known[a]
            continue
        seg = layout.segment_at(a)
        if seg is None:
            layout.conflicts += 1
            block.size = settings.round_size(block.requested)
            continue
        i = bisect.bisect_right(layout.live_starts, a)
        nxt = layout.live_starts[i] if i < len(layout.live_starts) else seg.end
        room = min(nxt, seg.end) - a
        block.size = settings.block_size(block.requested, room, seg.expandable)


@dataclass
class DeviceResult:
    raw: list[tuple[int, dict[str, int]]]  # (time_ns, raw state) per moment
    ooms: list[tuple[int, dict[str, Any], dict[str, int]]]  # (time_ns, entry, raw state)
    counts: dict[str, int]
    peak_reserved: int
    conflicts: int
    final_mismatches: int
    initial_blocks: int
    retry_capacity: int | None = None  # what the allocator's OOM retries imply (Q11b)


def _retry_capacity(
    trace: list[dict[str, Any]], initial: int, peak: int, settings: Settings | None = None
) -> int | None:
    """QUESTIONS.md Q11b: a run of segment_free/segment_unmap right before a new segment whose
    size, added to the reserved memory before the run, exceeds the peak is the allocator's OOM
    retry: the device refused that much, so C is just below it (2 MiB: a segment's granularity),
    at least the peak. Expandable segments (the run unmaps) record no refused size: C is the
    peak. None: no retry. A run that released a segment the next request could have taken from
    the cache is the program's own release, never a retry (Q11c)."""
    releases, new_segments = ("segment_free", "segment_unmap"), ("segment_alloc", "segment_map")
    program_runs = _program_releases(trace, settings or Settings())
    reserved, i, refused, expandable = initial, 0, [], False
    while i < len(trace):
        if trace[i]["action"] not in releases:
            step = trace[i]["size"] if trace[i]["action"] in new_segments else 0
            reserved, i = reserved + step, i + 1
            continue
        before, unmapped, run_start = reserved, trace[i]["action"] == "segment_unmap", i
        while i < len(trace) and trace[i]["action"] in releases:
            reserved, i = reserved - trace[i]["size"], i + 1
        new = trace[i]["size"] if i < len(trace) and trace[i]["action"] in new_segments else 0
        if new > 0 and before + new > peak and run_start not in program_runs:
            if unmapped:
                expandable = True
            else:
                refused.append(before + new)
    if expandable:
        return peak
    return max(peak, min(refused) - (2 << 20)) if refused else None


def _program_releases(trace: list[dict[str, Any]], settings: Settings) -> set[int]:
    """QUESTIONS.md Q11c: the first entry of each run of releases whose released segment the
    next request could have taken from the cache. The rule is the project's own, beyond the
    SPEC, and is taken from nsysfrag.releases — the one place this reference calls the code it
    checks (tests/test_snapshot_requests.py holds that rule to a plain-Python transcription)."""
    import numpy as np

    from nsysfrag.inputs.torch_snapshot.reader import ACTION_KINDS
    from nsysfrag.events import MARK
    from nsysfrag.releases import UNLIMITED_SPLIT, served_from_cache

    def column(key: str) -> Any:  # as 64-bit words (an address may lie above 2^63)
        words = [int(e.get(key) or 0) & 0xFFFF_FFFF_FFFF_FFFF for e in trace]
        return np.asarray(words, dtype=np.uint64).view(np.int64)

    action = np.asarray([ACTION_KINDS.get(e["action"], MARK) for e in trace], dtype=np.int8)
    shrinks = np.isin(action, (ACTION_KINDS["segment_free"], ACTION_KINDS["segment_unmap"]))
    grows = np.isin(action, (ACTION_KINDS["segment_alloc"], ACTION_KINDS["segment_map"]))
    n = len(action)
    if not shrinks.any():
        return set()
    size = column("size")
    edges = np.diff(np.concatenate([[0], shrinks.astype(np.int8), [0]]))
    first, past = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    others = np.append(np.flatnonzero(~grows), n)
    then_at = others[np.searchsorted(others, past)]
    new_segment = np.where(then_at > past, np.append(size, 0)[past], 0)
    max_split = settings.max_split if settings.max_split < UNLIMITED else UNLIMITED_SPLIT
    # Exact 512 B rounding unless the run set roundup_power2_divisions: a snapshot without
    # allocator_settings is replayed with the default rules, so its evidence is too (Q11c).
    divisions = any(settings.divisions.values())
    served = served_from_cache(
        action, size, column("stream"), column("addr"), first.astype(np.int64),
        past.astype(np.int64), then_at.astype(np.int64), new_segment.astype(np.int64),
        min(max_split, UNLIMITED_SPLIT), divisions,
    )  # fmt: skip
    return {int(f) for f, s in zip(first, served) if s}


def _replay(
    segments: list[dict[str, Any]], trace: list[dict[str, Any]], times: list[int], settings: Settings
) -> DeviceResult:
    """Replay until no allocation shows an initial block to be longer than inferred."""
    known: dict[int, int] = {}
    for _attempt in range(20):
        result, repairs = _replay_once(segments, trace, times, settings, known)
        if not repairs:
            break
        known.update(repairs)
    return result


def _replay_once(
    segments: list[dict[str, Any]],
    trace: list[dict[str, Any]],
    times: list[int],
    settings: Settings,
    known: dict[int, int],
) -> tuple[DeviceResult, dict[int, int]]:
    final = _final_layout(segments)
    recorded = _recorded_sizes(final, trace)
    layout = _final_layout(segments)
    _undo(layout, trace)
    _size_initial_blocks(layout, settings, known)
    initial_blocks = len(layout.live)
    counts = dict.fromkeys(
        ("allocations", "frees", "unmatched_frees", "overlaps", "zero_size_allocs",
         "failed_allocations", "other_kind_events"), 0)  # fmt: skip
    peak_reserved = initial_reserved = layout.reserved
    # The rebuilt start of the window is a state the device was in: one moment, at the time of
    # the first entry (0 without a trace); its partial layouts while rebuilding are not
    # (QUESTIONS.md Q8).
    raw_moments = [(times[0] if times else 0, _raw_state(layout, settings))]
    ooms = []
    # README: a segment_alloc/segment_map "is part of the allocation that follows it"; one that
    # no allocation follows (the next entry that maps nothing is not an alloc) is a moment of
    # its own (QUESTIONS.md Q9).
    unfollowed: set[int] = set()
    next_is_alloc = False
    for i in range(len(trace) - 1, -1, -1):
        if trace[i]["action"] in ("segment_alloc", "segment_map"):
            if not next_is_alloc:
                unfollowed.add(i)
        else:
            next_is_alloc = trace[i]["action"] == "alloc"
    for i, (e, t) in enumerate(zip(trace, times)):
        action = e["action"]
        addr = e.get("addr")
        if action == "alloc":
            _apply_alloc(layout, settings, addr, e["size"], counts, recorded.get(i))
        elif action in ("free_completed", "free"):
            if addr in layout.live:
                layout.drop_block(addr)
                counts["frees"] += 1
            else:
                counts["unmatched_frees"] += 1
        elif action == "free_requested":  # allocated drops, active stays (SPEC 1.2 §9)
            if addr in layout.live:
                layout.live[addr].pending = True
                layout.touch(addr)
        elif action == "segment_alloc":
            if layout.segment_at(addr) is not None:
                layout.conflicts += 1
            layout.add_segment(Segment(addr, e["size"], False, None))
        elif action == "segment_free":
            seg = layout.segments.get(addr)
            if seg is None:
                layout.conflicts += 1
            else:
                for a in layout.blocks_in(seg.address, seg.end):
                    layout.conflicts += 1
                    layout.drop_block(a)
                layout.drop_segment(seg)
        elif action == "segment_map":
            layout.map_range(addr, e["size"], None)
        elif action == "segment_unmap":
            layout.unmap_range(addr, e["size"])
        elif action == "oom":
            counts["failed_allocations"] += 1
        peak_reserved = max(peak_reserved, layout.reserved)
        if action in MOMENT_ACTIONS or i in unfollowed:
            raw = _raw_state(layout, settings)
            raw_moments.append((t, raw))
            if action == "oom":
                ooms.append((t, e, raw))
    if raw_moments:  # the end of the trace is the last moment: a free_requested after it counts
        layout.dirty.update(layout.segments)  # (it changes allocated bytes only)
        raw_moments[-1] = (raw_moments[-1][0], _raw_state(layout, settings))
    mismatches = _compare_final(layout, final)
    result = DeviceResult(
        raw_moments, ooms, counts, peak_reserved, layout.conflicts, mismatches, initial_blocks,
        _retry_capacity(trace, initial_reserved, peak_reserved, settings),
    )  # fmt: skip
    return result, layout.repairs


def _recorded_sizes(final: Layout, trace: list[dict[str, Any]]) -> dict[int, int]:
    """README: "a block still live at the snapshot has its recorded size". For each ``alloc``
    entry whose block is still live at the snapshot (no later entry frees or allocates that
    address, and the final segments hold a block there): entry index -> the recorded size."""
    out: dict[int, int] = {}
    settled: set[int] = set()
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        addr = e.get("addr")
        if e["action"] not in ("alloc", "free_completed", "free") or addr in settled:
            continue
        settled.add(addr)
        block = final.live.get(addr)
        if e["action"] == "alloc" and block is not None and block.size is not None:
            out[i] = block.size
    return out


def _apply_alloc(
    layout: Layout,
    settings: Settings,
    addr: int,
    requested: int,
    counts: dict[str, int],
    recorded: int | None = None,
) -> None:
    if requested == 0:
        counts["zero_size_allocs"] += 1
        return
    counts["allocations"] += 1
    seg = layout.segment_at(addr)
    if seg is None:
        counts["overlaps"] += 1  # outside every segment (README: an overlap)
        layout.conflicts += 1
        return
    if seg.pool is None:
        seg.pool = "small" if settings.round_size(requested) <= SMALL_SIZE else "large"
    room_end = seg.end
    for lo, hi in layout.gaps(seg):
        if lo <= addr < hi:
            if lo != addr:  # PyTorch carves from the low end of a free block, so ...
                before = [a for a in layout.blocks_in(seg.address, lo) if a + (layout.live[a].size or 0) == lo]
                if before and layout.live[before[-1]].inferred:  # ... that block reached addr
                    layout.repairs[before[-1]] = addr - before[-1]
                else:
                    layout.conflicts += 1
            room_end = hi
            break
    else:  # inside a live block
        counts["overlaps"] += 1
        layout.conflicts += 1
    size = recorded or settings.block_size(requested, room_end - addr, seg.expandable)
    for a in layout.blocks_in(seg.address, addr + size):
        b = layout.live[a]
        if a + (b.size or 0) > addr:
            layout.drop_block(a)
    layout.add_block(addr, Block(size, requested))


def _compare_final(replayed: Layout, recorded: Layout) -> int:
    def segs(lay: Layout) -> set[tuple[int, int]]:
        return {(s.address, s.size) for s in lay.segments.values()}

    def blocks(lay: Layout) -> set[tuple[int, int | None]]:
        return {(a, b.size) for a, b in lay.live.items()}

    return len(segs(replayed) ^ segs(recorded)) + len(blocks(replayed) ^ blocks(recorded))


# ---------------------------------------------------------------------------- the analysis


def analyze_snapshot(path: str | Path, capacity: int | None = None) -> dict[str, Any]:
    data = load_plain(path)
    if isinstance(data, list):  # torch.cuda.memory_snapshot(): the bare segment list
        data = {"segments": data, "device_traces": []}
    settings = Settings.from_snapshot(data.get("allocator_settings"))
    segments = data.get("segments") or []
    traces = data.get("device_traces") or []
    devices = sorted({s["device"] for s in segments} | {d for d, t in enumerate(traces) if t})
    stamps = [e["time_us"] for t in traces for e in t if "time_us" in e]
    origin = min(stamps) if stamps else None
    spaces = []
    for device in devices:
        trace = traces[device] if device < len(traces) else []
        if origin is not None:
            times = [(e["time_us"] - origin) * 1000 for e in trace]
            for i in range(1, len(times)):  # never backwards (QUESTIONS.md Q21)
                times[i] = max(times[i], times[i - 1])
        else:  # no times (before PyTorch 2.1): entries 1 ns apart (QUESTIONS.md Q14)
            times = list(range(len(trace)))
        result = _replay([s for s in segments if s["device"] == device], trace, times, settings)
        spaces.append(_space(device, result, capacity))
    return {"spaces": spaces}


def _space(device: int, result: DeviceResult, capacity: int | None) -> dict[str, Any]:
    if capacity is not None:
        cap, source = capacity, "--capacity"
    elif result.ooms:  # the device's oom entries (QUESTIONS.md Q11)
        reachable = [raw["reserved"] + entry["device_free"] for _t, entry, raw in result.ooms]
        cap, source = max(*reachable, result.peak_reserved), "oom"
    elif result.retry_capacity is not None:  # the allocator's OOM retries (Q11b)
        cap, source = result.retry_capacity, "oom_retries"
    else:
        cap, source = result.peak_reserved, "reserved_peak"
    moments: list[Moment] = [{"time_ns": t, **_derive(raw, cap)} for t, raw in result.raw]
    ooms = []
    for t, entry, raw in result.ooms:
        state = _derive(raw, cap)
        r, d = entry["size"], entry["device_free"]
        verdict = "capacity" if r > d + state["stranded_bytes"] + state["releasable_bytes"] else "fragmentation"
        ooms.append(
            {
                "time_ns": t,
                "requested_bytes": r,
                "recorded_device_free_bytes": d,
                **{k: state[k] for k in STATE_KEYS if k != "time_ns"},
                "verdict": verdict,
            }
        )
    allocs, failed = result.counts["allocations"], result.counts["failed_allocations"]
    # The project's own snapshot keys (README "Extra JSON keys"), which SPEC 1.1 leaves alone.
    last = result.raw[-1][1]
    extras = {
        "reserved_bytes_peak": result.peak_reserved,
        "allocated_bytes_peak": max(raw["allocated"] for _t, raw in result.raw),
        "active_bytes_peak": max(raw["active"] for _t, raw in result.raw),
        "requested_bytes_peak": max(raw["requested"] for _t, raw in result.raw),
        "reserved_bytes_final": last["reserved"],
        "allocated_bytes_final": last["allocated"],
        "active_bytes_final": last["active"],
        "requested_bytes_final": last["requested"],
        "oom_events": [
            {
                "time_ns": t,
                "device_free_bytes": entry["device_free"],
                "requested_bytes": entry["size"],
                "largest_free_bytes": raw["largest"],
                "free_bytes": raw["reserved"] - raw["active"],
                "reserved_bytes": raw["reserved"],
                "allocated_bytes": raw["allocated"],
            }
            for t, entry, raw in result.ooms
        ],
        "window": {
            "initial_blocks": result.initial_blocks,
            "final_mismatches": result.final_mismatches,
        },
    }
    return {
        "pid": 0,
        "device": device,
        "capacity_bytes": cap,
        "capacity_source": source,
        "counts": result.counts,
        "alloc_failure_rate": failed / (failed + allocs) if failed + allocs else 0.0,
        **summarize(moments, STATE_KEYS),
        "ooms": ooms,
        "snapshot_keys": extras,
        "window": {
            "conflicts": result.conflicts,
            "final_mismatches": result.final_mismatches,
            "initial_blocks": result.initial_blocks,
        },
    }

"""A deliberately simple re-implementation of SPEC 1.2 §2–§4 (the observed model on the device's
pages), for property tests only.

It keeps one flag per byte of the space (a numpy array) and recomputes everything from those
flags after every event (O(bytes) per event), so it is easy to check by eye against the SPEC text; the engine must
agree with it exactly. Streams stay on a small grid of addresses, so the flags stay few.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RefEvent:
    is_free: bool
    address: int
    bytes: int


@dataclass
class RefState:
    reserved_bytes: int
    allocated_bytes: int
    device_free_bytes: int
    largest_block_bytes: int  # L
    free_bytes: int  # D + S
    largest_free_bytes: int  # L_eff
    free_blocks: int
    live_bytes: int
    footprint_bytes: int  # every live footprint counted whole


@dataclass
class RefResult:
    base: int
    states: list[RefState] = field(default_factory=list)
    outcome: list[str] = field(default_factory=list)
    overlap: list[bool] = field(default_factory=list)
    out_of_order: list[bool] = field(default_factory=list)
    hole: list[bool] = field(default_factory=list)
    hole_bytes: list[int] = field(default_factory=list)
    freed_alloc: list[int] = field(default_factory=list)
    pins: list[tuple[int | None, int | None]] = field(default_factory=list)
    runs_after: list[list[int]] = field(default_factory=list)  # free runs' sizes, sorted
    removed_at: dict[int, int] = field(default_factory=dict)  # allocation index -> event index


def reference_replay(
    events: list[RefEvent], capacity: int, granularity: int = 512, page: int = 2 << 20
) -> RefResult:
    def fp(n: int) -> int:
        return -(-n // granularity) * granularity

    allocs = [e for e in events if not e.is_free and e.bytes > 0]
    base = min(e.address for e in allocs) if allocs else min(e.address for e in events)
    origin = base - base % page  # the flags start at B's page
    top = max([e.address + fp(e.bytes) for e in allocs] + [base + 1])
    size = -(-(top - origin) // page) * page
    res = RefResult(base=base)
    live: dict[int, tuple[int, int, int, int]] = {}  # start -> (footprint end, bytes, seq, alloc)
    seq = 0

    def covered() -> np.ndarray:
        """One flag per byte of the space: True where a live footprint lies."""
        flags = np.zeros(size, dtype=bool)
        for start, (end, _n, _s, _i) in live.items():
            flags[start - origin : end - origin] = True
        return flags

    def resident(flags: np.ndarray) -> np.ndarray:
        """One flag per byte: True where the byte's page holds a live footprint."""
        return np.repeat(flags.reshape(-1, page).any(axis=1), page)

    def runs(flags: np.ndarray, res_flags: np.ndarray) -> list[tuple[int, int]]:
        """Maximal ranges of free bytes inside resident pages (offsets from the origin)."""
        free = np.concatenate([[False], res_flags & ~flags, [False]]).astype(np.int8)
        edges = np.flatnonzero(np.diff(free))
        return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]

    for i, e in enumerate(events):
        overlap = ooo = hole = False
        freed, pins, stranded_by_free = -1, (None, None), 0
        if e.is_free:
            if e.address in live:
                outcome = "free"
                newest = max(live, key=lambda s: live[s][2])
                ooo = newest != e.address
                b_end, _, _, freed = live.pop(e.address)
                res.removed_at[freed] = i
                flags = covered()
                res_flags = resident(flags)
                mine = range(e.address - origin, b_end - origin)
                stranded_by_free = int((res_flags[mine.start : mine.stop] & ~flags[mine.start : mine.stop]).sum())
                if stranded_by_free:
                    hole = True
                    left = right = None
                    for lo, hi in runs(flags, res_flags):
                        if hi <= mine.start or lo >= mine.stop:
                            continue
                        # The live blocks bounding the run: one ending where it starts, one
                        # starting where it ends (none where a page boundary bounds it).
                        for start, (end, _n, _s, alloc) in live.items():
                            if end - origin == lo:
                                left = alloc if left is None else left
                            if start - origin == hi:
                                right = alloc
                    pins = (left, right)
            else:
                outcome = "unmatched_free"
        elif e.bytes == 0:
            outcome = "zero_size_alloc"
        else:
            outcome = "alloc"
            a, b = e.address, e.address + e.bytes  # overlaps are judged on bytes
            hit = [s for s, v in live.items() if s < b and s + v[1] > a]
            overlap = bool(hit)
            for s in hit:
                res.removed_at[live.pop(s)[3]] = i
            seq += 1
            live[a] = (a + fp(e.bytes), e.bytes, seq, i)
        flags = covered()
        res_flags = resident(flags)
        reserved = int(res_flags.sum())
        allocated = int(flags.sum())
        device_free = max(0, capacity - reserved)
        free_runs = [hi - lo for lo, hi in runs(flags, res_flags)]
        largest = max(free_runs, default=0)
        res.states.append(
            RefState(
                reserved_bytes=reserved,
                allocated_bytes=allocated,
                device_free_bytes=device_free,
                largest_block_bytes=largest,
                free_bytes=device_free + reserved - allocated,
                largest_free_bytes=max(largest, device_free),
                free_blocks=len(free_runs) + (1 if device_free >= page else 0),
                live_bytes=sum(v[1] for v in live.values()),
                footprint_bytes=sum(v[0] - s for s, v in live.items()),
            )
        )
        res.outcome.append(outcome)
        res.overlap.append(overlap)
        res.out_of_order.append(ooo)
        res.hole.append(hole)
        res.hole_bytes.append(stranded_by_free)
        res.freed_alloc.append(freed)
        res.pins.append(pins)
        res.runs_after.append(sorted(free_runs))
    return res

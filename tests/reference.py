"""A deliberately simple re-implementation of SPEC §2–§4, for property tests only.

It recomputes the free blocks from scratch after every event (O(n) per event, O(n²) overall)
so it is easy to check by eye against the SPEC text; the engine must agree with it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RefEvent:
    is_free: bool
    address: int
    bytes: int


@dataclass
class RefState:
    free_bytes: int
    largest_free_bytes: int
    free_blocks: int
    live_bytes: int
    footprint_bytes: int


@dataclass
class RefResult:
    base: int
    arena_end: int
    states: list[RefState] = field(default_factory=list)
    outcome: list[str] = field(default_factory=list)
    overlap: list[bool] = field(default_factory=list)
    out_of_order: list[bool] = field(default_factory=list)
    hole: list[bool] = field(default_factory=list)
    freed_alloc: list[int] = field(default_factory=list)
    pins: list[tuple[int, int] | None] = field(default_factory=list)
    gaps_after: list[list[int]] = field(default_factory=list)
    removed_at: dict[int, int] = field(default_factory=dict)  # allocation index -> event index


def reference_replay(events: list[RefEvent], capacity: int, granularity: int = 512) -> RefResult:
    def fp(n: int) -> int:
        return -(-n // granularity) * granularity

    allocs = [e for e in events if not e.is_free and e.bytes > 0]
    base = min(e.address for e in allocs) if allocs else min(e.address for e in events)
    end = max([base + capacity] + [e.address + fp(e.bytes) for e in allocs])
    res = RefResult(base=base, arena_end=end)
    live: dict[int, tuple[int, int, int, int]] = {}  # start -> (end, bytes, seq, alloc index)
    seq = 0

    def gaps() -> list[tuple[int, int]]:
        out, cursor = [], base
        for start in sorted(live):
            if start > cursor:
                out.append((cursor, start))
            cursor = max(cursor, live[start][0])
        if end > cursor:
            out.append((cursor, end))
        return out

    for i, e in enumerate(events):
        overlap = ooo = hole = False
        freed, pins = -1, None
        if e.is_free:
            if e.address in live:
                outcome = "free"
                newest = max(live, key=lambda s: live[s][2])
                ooo = newest != e.address
                b_end, _, _, freed = live.pop(e.address)
                res.removed_at[freed] = i
                for lo, hi in gaps():
                    if lo <= e.address and b_end <= hi:
                        hole = lo != base and hi != end
                        if hole:
                            left = max((s for s in live if live[s][0] == lo), default=None)
                            right = hi if hi in live else None
                            assert left is not None and right is not None
                            pins = (live[left][3], live[right][3])
            else:
                outcome = "unmatched_free"
        elif e.bytes == 0:
            outcome = "zero_size_alloc"
        else:
            outcome = "alloc"
            a, b = e.address, e.address + fp(e.bytes)
            hit = [s for s, v in live.items() if s < b and v[0] > a]
            overlap = bool(hit)
            for s in hit:
                res.removed_at[live.pop(s)[3]] = i
            seq += 1
            live[a] = (b, e.bytes, seq, i)
        g = gaps()
        foot = sum(v[0] - s for s, v in live.items())
        res.states.append(
            RefState(
                free_bytes=(end - base) - foot,
                largest_free_bytes=max((hi - lo for lo, hi in g), default=0),
                free_blocks=len(g),
                live_bytes=sum(v[1] for v in live.values()),
                footprint_bytes=foot,
            )
        )
        res.outcome.append(outcome)
        res.overlap.append(overlap)
        res.out_of_order.append(ooo)
        res.hole.append(hole)
        res.freed_alloc.append(freed)
        res.pins.append(pins)
        res.gaps_after.append(sorted(hi - lo for lo, hi in g))
    return res

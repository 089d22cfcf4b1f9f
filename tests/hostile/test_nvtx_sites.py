"""NVTX site resolution (SPEC §4) against the definition, and its bounds on hostile nesting."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysfrag.errors import InputError
from nsysfrag.inputs.nsys import sites
from nsysfrag.inputs.nsys.records import ApiCalls, MemoryEvents, NvtxRanges
from nsysfrag.inputs.nsys.sites import NO_RANGE, SiteResolver
from nsysfrag.testing.nsys_export import ApiRow, Gpu, MemoryRow, NvtxRow, write_export
from tests.conftest import BASE
from tests.hostile.in_process import run_in_process

EXAMPLES = int(os.environ.get("NSYSFRAG_PROPERTY_EXAMPLES", "150"))
Range = tuple[int, int, int, bool, str]  # start, end, tid, push/pop, text


def reference_site(ranges: list[Range], tid: int, t: int) -> str:
    """SPEC §4 read literally: every enclosing range of the thread, sorted, joined."""
    enclosing = [(s, e, i, pp, text) for i, (s, e, th, pp, text) in enumerate(ranges)
                 if th == tid and s <= t < e]
    stack = sorted((r for r in enclosing if r[3]), key=lambda r: (r[0], -r[1], r[2]))
    if stack:
        return "/".join(r[4] for r in stack)
    start_end = [r for r in enclosing if not r[3]]
    return max(start_end, key=lambda r: (r[0], r[2]))[4] if start_end else NO_RANGE


def resolver_for(ranges: list[Range], calls: list[tuple[int, int]]) -> SiteResolver:
    """One process; memory event k is an allocation whose API call (k) ran on ``calls[k]``."""
    n, m = len(calls), len(ranges)

    def ints(values: object) -> np.ndarray:
        return np.asarray(values, dtype=np.int64)

    memory = MemoryEvents(
        start_ns=ints([t for t, _ in calls]), pid=ints([1] * n), device=ints([0] * n),
        address=ints(range(n)).view(np.uint64), bytes=ints([512] * n),
        is_free=np.zeros(n, dtype=np.bool_), modelled=np.ones(n, dtype=np.bool_),
        correlation_id=ints(range(n)),
    )
    api = ApiCalls(
        start_ns=ints([t for t, _ in calls]), pid=ints([1] * n), tid=ints([tid for _, tid in calls]),
        correlation_id=ints(range(n)), is_runtime=np.ones(n, dtype=np.bool_),
        is_failed_allocation=np.zeros(n, dtype=np.bool_),
    )
    nvtx = NvtxRanges(
        start_ns=ints([r[0] for r in ranges]), end_ns=ints([r[1] for r in ranges]),
        pid=ints([1] * m), tid=ints([r[2] for r in ranges]),
        is_push_pop=np.asarray([r[3] for r in ranges], dtype=np.bool_),
        text=[r[4] for r in ranges],
    )
    return SiteResolver(memory, api, nvtx)


@st.composite
def nvtx_cases(draw: st.DrawFn) -> tuple[list[Range], list[tuple[int, int]]]:
    """Ranges on a small time grid (ties, shared ends, crossings), names that collide, and
    calls at every kind of moment."""
    ranges = []
    for _ in range(draw(st.integers(0, 14))):
        start = draw(st.integers(-3, 20))
        ranges.append((start, start + draw(st.integers(1, 12)), draw(st.sampled_from([7, 8])),
                       draw(st.booleans()), draw(st.sampled_from(["a", "b", "c", "a/b", ""]))))
    calls = [(draw(st.integers(-4, 34)), draw(st.sampled_from([7, 8, 9])))
             for _ in range(draw(st.integers(1, 12)))]
    return ranges, calls


@settings(max_examples=EXAMPLES, deadline=None)
@given(nvtx_cases())
def test_sites_follow_the_definition(case: tuple[list[Range], list[tuple[int, int]]]) -> None:
    ranges, calls = case
    got = resolver_for(ranges, calls).sites(np.arange(len(calls)))
    assert got == [reference_site(ranges, tid, t) for t, tid in calls]


def test_nested_ranges_cost_no_rebuilding() -> None:
    depth = 3000
    ranges = [(i, 2 * depth - i, 7, True, f"r{i}") for i in range(depth)]
    resolver = resolver_for(ranges, [(depth - 1, 7), (depth + 5, 7)])
    names = resolver.sites(np.arange(2))
    assert names[0].startswith("r0/r1/") and names[0].endswith("/r2998/r2999")
    assert names[1].endswith("/r2993/r2994")
    assert resolver._crossing_work == 0


def test_crossing_push_pop_ranges_past_the_budget_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A staircase: each range ends while every later one is still open, the worst case for a
    # stack (NVTX never writes it: push/pop ranges nest).
    monkeypatch.setattr(sites, "CROSSING_WORK", 2_000)
    ranges = [(i, 100 + i, 7, True, f"r{i}") for i in range(100)]
    with pytest.raises(InputError, match="cross each other"):
        resolver_for(ranges, [(150, 7)]).sites(np.arange(1))
    path = write_export(
        tmp_path / "stairs.sqlite",
        [MemoryRow(150, 1, 0, BASE, 4096, correlation_id=1)],
        [ApiRow(150, 151, 1, 7, "cudaMalloc_v3020", 1)],
        [NvtxRow(s, e, 1, 7, text) for s, e, _, _, text in ranges],
        [Gpu(0)],
    )
    outcome = run_in_process(["analyze", str(path)], inputs=[path])
    assert outcome.returncode == 2 and "cross each other" in outcome.stderr

"""Property tests: the compiled page replay agrees with the simple reference after every event,
on pages small enough that blocks straddle them, share them and leave whole ones free."""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsysfrag.analysis import EVENT_NAMES, analyze
from nsysfrag.inputs import InputOptions
from nsysfrag.inputs.nsys import read_export
from nsysfrag.testing.nsys_export import FREE, ApiRow, Gpu, MemoryRow, NvtxRow, write_export
from tests.reference import RefEvent, reference_replay
from tests.kernel_modes import both_kernels  # noqa: F401  (every test both ways)

BASE = 0x7F00_0000_0000
SITES = ["fwd", "bwd", "opt", None]
# CI runs the default; set NSYSFRAG_PROPERTY_EXAMPLES=5000 for a deeper local check.
EXAMPLES = int(os.environ.get("NSYSFRAG_PROPERTY_EXAMPLES", "150"))


@st.composite
def streams(draw: st.DrawFn) -> list[tuple[bool, int, int, str | None]]:
    """(is_free, address, bytes, site) tuples on a small address grid, so blocks collide,
    touch and leave holes often; frees mostly target live blocks."""
    n = draw(st.integers(1, 60))
    live: list[tuple[int, int]] = []
    out = []
    for _ in range(n):
        if live and draw(st.integers(0, 9)) < 4:
            j = draw(st.integers(0, len(live) - 1))
            addr, size = live.pop(j)
            out.append((True, addr, size, None))
        elif draw(st.integers(0, 19)) == 0:
            out.append((True, BASE + 256 * draw(st.integers(0, 40)), 512, None))
        else:
            addr = BASE + 256 * draw(st.integers(0, 40))
            size = draw(st.sampled_from([0, 1, 100, 256, 511, 512, 513, 1024, 1500, 2048, 4096]))
            site = draw(st.sampled_from(SITES))
            out.append((False, addr, size, site))
            if size:
                live.append((addr, size))
    return out


def _write(path: Path, stream: list[tuple[bool, int, int, str | None]], capacity: int) -> None:
    memory, api, nvtx = [], [], []
    for i, (is_free, addr, size, site) in enumerate(stream):
        t = 1000 * (i + 1)
        memory.append(MemoryRow(t, 7, 0, addr, size, op=FREE if is_free else 0, correlation_id=i + 1))
        api.append(ApiRow(t - 10, t + 10, 7, 7, "cudaFree_v3020" if is_free else "cudaMalloc_v3020", i + 1))
        if site is not None:
            nvtx.append(NvtxRow(t - 20, t + 20, 7, 7, site))
    write_export(path, memory, api, nvtx, gpus=[Gpu(0, total_memory=capacity)])


PAGES = st.sampled_from([512, 1024, 4096, 2 << 20])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=streams(), capacity=st.sampled_from([4096, 8192, 16384, 65536]), page=PAGES)
def test_engine_matches_reference(tmp_path: Path, stream, capacity: int, page: int) -> None:
    path = tmp_path / "t.sqlite"
    _write(path, stream, capacity)
    space = analyze(read_export(path, InputOptions(page_bytes=page))).spaces[0]
    ref = reference_replay([RefEvent(f, a, b) for f, a, b, _ in stream], capacity, page=page)
    t = space.timeline
    pool = t.pool
    assert pool is not None

    # State after every event.
    assert pool.reserved_bytes.tolist() == [s.reserved_bytes for s in ref.states]
    assert pool.allocated_bytes.tolist() == [s.allocated_bytes for s in ref.states]
    assert pool.device_free_bytes.tolist() == [s.device_free_bytes for s in ref.states]
    assert pool.largest_block_bytes.tolist() == [s.largest_block_bytes for s in ref.states]
    assert t.free_bytes.tolist() == [s.free_bytes for s in ref.states]
    assert t.largest_free_bytes.tolist() == [s.largest_free_bytes for s in ref.states]
    assert t.free_blocks.tolist() == [s.free_blocks for s in ref.states]
    assert t.live_bytes.tolist() == [s.live_bytes for s in ref.states]
    assert [EVENT_NAMES[c] for c in t.event.tolist()] == ref.outcome
    placed = [i for i, o in enumerate(ref.outcome) if o == "alloc"]
    assert [int(t.removed_at[i]) for i in placed] == [ref.removed_at.get(i, -1) for i in placed]
    g = [min(1.0, (s.free_bytes - s.largest_free_bytes) / capacity) for s in ref.states]
    assert np.allclose(t.global_frag, g, rtol=0, atol=1e-15)
    loc = [1 - s.largest_free_bytes / s.free_bytes if s.free_bytes else 0.0 for s in ref.states]
    assert np.allclose(t.local_frag, loc, rtol=0, atol=1e-15)

    # Counts and anomalies.
    c = space.counts
    assert c.allocations == ref.outcome.count("alloc")
    assert c.frees == ref.outcome.count("free")
    assert c.unmatched_frees == ref.outcome.count("unmatched_free")
    assert c.zero_size_allocs == ref.outcome.count("zero_size_alloc")
    assert c.overlaps == sum(ref.overlap)
    assert space.out_of_order_frees == sum(ref.out_of_order)
    assert space.hole_creating_frees == sum(ref.hole)
    assert space.base_address == ref.base
    assert not space.span_mode

    # Worst fragmentation, memory peak, internal fragmentation, histograms.
    peak = int(np.argmax(g))
    assert space.peak_index == peak
    # One event is a space without times (its events all share one start): event numbers.
    assert space.peak.time_ns == (1000 * (peak + 1) if len(stream) > 1 else peak)
    by_memory = [(s.reserved_bytes, s.allocated_bytes) for s in ref.states]
    assert space.memory_peak_index == by_memory.index(max(by_memory))
    fps = [s.footprint_bytes for s in ref.states]
    at = fps.index(max(fps))
    want_internal = (fps[at] - ref.states[at].live_bytes) / fps[at] if fps[at] else 0.0
    assert math.isclose(space.internal_frag, want_internal, abs_tol=1e-15)
    free_hist = Counter(s.bit_length() - 1 for s in ref.runs_after[peak])
    assert {b.lo_bytes.bit_length() - 1: b.count for b in space.free_block_histogram} == dict(free_hist)
    alloc_hist = Counter(b.bit_length() - 1 for f, _, b, _ in stream if not f and b > 0)
    assert {b.lo_bytes.bit_length() - 1: b.count for b in space.size_histogram} == dict(alloc_hist)

    # Hotspots: grouped by (site of the freed block, size class), with pinning sites.
    site = {i: (s or "(no range)") for i, (_, _, _, s) in enumerate(stream)}
    groups: dict[tuple[str, int], list[int]] = {}
    for i, ooo in enumerate(ref.out_of_order):
        if ooo:
            alloc = ref.freed_alloc[i]
            groups.setdefault((site[alloc], stream[alloc][2].bit_length() - 1), []).append(i)
    want = []
    for (s, k), frees in groups.items():
        holes = [i for i in frees if ref.hole[i]]
        pinned: Counter[str] = Counter()
        for i in holes:
            for pin in ref.pins[i]:
                if pin is not None:
                    pinned[site[pin]] += 1
        want.append(
            (s, 1 << k, len(frees), len(holes), sum(ref.hole_bytes[i] for i in holes),
             tuple(p for p, _ in sorted(pinned.items(), key=lambda kv: (-kv[1], kv[0]))))
        )
    want.sort(key=lambda h: (-h[4], -h[2], h[0], h[1]))
    got = [
        (h.site, h.size_lo_bytes, h.out_of_order_frees, h.hole_creating_frees, h.hole_bytes, h.pinned_by)
        for h in space.hotspots
    ]
    assert got == want


@settings(max_examples=max(EXAMPLES // 3, 20), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=streams(), page=PAGES)
def test_invariants(tmp_path: Path, stream, page: int) -> None:
    """device free + stranded + allocated = capacity while the device holds it all; 0 <= ratios
    <= 1; freeing every live block returns every page."""
    path = tmp_path / "t.sqlite"
    live = {}
    for f, a, b, _ in stream:
        if f:
            live.pop(a, None)
        elif b:
            live[a] = b
    # Free what is still live, newest first, so the trace ends empty.
    tail = [(True, a, b, None) for a, b in reversed(list(live.items()))]
    capacity = 1 << 20
    _write(path, stream + tail, capacity)
    space = analyze(read_export(path, InputOptions(page_bytes=page))).spaces[0]
    t = space.timeline
    pool = t.pool
    assert pool is not None
    fits = pool.reserved_bytes <= capacity
    stranded = pool.reserved_bytes - pool.allocated_bytes - pool.releasable_bytes
    assert (stranded >= 0).all()
    assert ((pool.device_free_bytes + stranded + pool.allocated_bytes)[fits] == capacity).all()
    assert (t.free_bytes >= t.largest_free_bytes).all()
    assert (pool.largest_block_bytes <= stranded).all()
    assert ((t.global_frag >= 0) & (t.global_frag <= 1)).all()
    assert ((t.local_frag >= 0) & (t.local_frag <= 1)).all()
    if any(not f and b for f, _, b, _ in stream):
        assert space.final.pool is not None and space.final.pool.reserved_bytes == 0
        assert space.final.free_blocks == (1 if capacity >= page else 0)
        assert space.final.free_bytes == space.capacity_bytes
        assert space.final.live_bytes == 0

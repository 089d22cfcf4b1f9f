"""Programs that give memory back: whose each burst of segment releases was (the program's
``empty_cache()``, the allocator's release before a retry, the garbage collector, unknown), the
counts ``whatif --validate`` reports, every policy giving memory back at the program's moments,
and the torch model reproducing such a program's segments.

The evidence that settles most bursts (``nsysfrag.releases``): the allocator releases cached
segments only after its cache search failed, so a burst that released a segment the next request
could have taken was the program's. The property test holds that evidence to the ground truth of
the sample generator's caching allocator, which knows why it released each segment.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsysfrag.allocators import DEFAULT_POLICIES, parse_policy
from nsysfrag.allocators.base import ALLOC as REQUEST
from nsysfrag.allocators.base import EMPTY_CACHE, FREE, RequestStream
from nsysfrag.capacity import OOM_RETRIES, read_record, snapshot_capacity
from nsysfrag.cli import cli
from nsysfrag.events import (
    ALLOC,
    FAILED_ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
)
from nsysfrag.inputs.torch_snapshot.columns import read_snapshot_columns, snapshot_columns
from nsysfrag.releases import COLLECTED, EMPTY_CACHE as PROGRAM, KIND_NAMES, OOM_RETRY, UNKNOWN
from nsysfrag.whatif import validate_snapshot
from nsysfrag.whatif.capacity import recorded_devices
from nsysfrag.whatif.streams import snapshot_streams
from tests.conftest import SAMPLES
from tests.snapshot_workloads import make_snapshots

MiB, GiB = 1 << 20, 1 << 30
EMPTY_CACHE_SAMPLE = SAMPLES / "empty_cache_snapshot.pickle"
RELEASES = ("segment_free", "segment_unmap")
# CI runs the default; NSYSFRAG_PROPERTY_EXAMPLES=500 for a deeper local check.
EXAMPLES = int(os.environ.get("NSYSFRAG_PROPERTY_EXAMPLES", "25"))


def record(entries: list[tuple[int, int, int, int]], max_split_size: int = 1 << 62):  # type: ignore[no-untyped-def]
    """(kind, size, stream, address) per entry, no oom device-free figure."""
    kind = np.array([e[0] for e in entries], dtype=np.int8)
    size = np.array([e[1] for e in entries], dtype=np.int64)
    stream = np.array([e[2] for e in entries], dtype=np.int64)
    address = np.array([e[3] for e in entries], dtype=np.int64)
    return read_record(kind, size, None, 0, stream, address, max_split_size)


A, B, C, D = 0x1000_0000, 0x2000_0000, 0x3000_0000, 0x4000_0000
# 200 + 300 + 300 MiB reserved; both 300 MiB segments go back, then a 500 MiB segment.
HELD = [(SEGMENT_ALLOC, 200 * MiB, 0, A), (ALLOC, 200 * MiB, 0, A),
        (SEGMENT_ALLOC, 300 * MiB, 0, B), (ALLOC, 300 * MiB, 0, B),
        (SEGMENT_ALLOC, 300 * MiB, 0, C), (ALLOC, 300 * MiB, 0, C),
        (FREE_REQUESTED, 300 * MiB, 0, B), (FREE_COMPLETED, 300 * MiB, 0, B),
        (FREE_REQUESTED, 300 * MiB, 0, C), (FREE_COMPLETED, 300 * MiB, 0, C)]  # fmt: skip
RELEASE = [(SEGMENT_FREE, 300 * MiB, 0, B), (SEGMENT_FREE, 300 * MiB, 0, C)]


def test_a_release_the_next_request_could_have_used_is_the_programs() -> None:
    # GIVEN the same burst followed by a 500 MiB request, which no 300 MiB segment holds: the
    # malloc's OOM retry (the device refused 800 + 500 MiB)
    retry = record(HELD + RELEASE + [(SEGMENT_ALLOC, 500 * MiB, 0, D), (ALLOC, 500 * MiB, 0, D)])
    # AND followed by a 250 MiB request, which either released segment would have held
    reuse = record(HELD + RELEASE + [(SEGMENT_ALLOC, 250 * MiB, 0, D), (ALLOC, 250 * MiB, 0, D)])
    # THEN the first is a retry, and says how large the device is
    assert retry.runs.served is not None and not retry.runs.served.any()
    assert retry.release_kinds(1298 * MiB, 0.0).tolist() == [OOM_RETRY]
    assert snapshot_capacity(retry).source == OOM_RETRIES
    # AND the second was the program's empty_cache(): the allocator would have taken a cached
    # segment rather than release it, whatever the device's size, so it says nothing of C
    assert reuse.runs.served is not None and reuse.runs.served.tolist() == [True]
    for capacity in (800 * MiB, 1 * GiB, 1 << 62):
        assert reuse.release_kinds(capacity, 0.0).tolist() == [PROGRAM]
        assert reuse.program_releases(capacity, 0.0).tolist() == [len(HELD)]
        assert reuse.release_kinds(capacity, 0.3).tolist() == [PROGRAM]  # nor the collector
    assert not snapshot_capacity(reuse).source == OOM_RETRIES
    # AND without the streams and addresses the record cannot tell: a retry, as before
    entries = HELD + RELEASE + [(SEGMENT_ALLOC, 250 * MiB, 0, D), (ALLOC, 250 * MiB, 0, D)]
    kind = np.array([e[0] for e in entries], dtype=np.int8)
    plain = read_record(kind, np.array([e[1] for e in entries], dtype=np.int64), None, 0)
    assert plain.runs.served is None
    assert plain.release_kinds(800 * MiB, 0.0).tolist() == [OOM_RETRY]


def test_a_segment_of_another_stream_or_pool_or_too_small_proves_nothing() -> None:
    after = [(SEGMENT_ALLOC, 250 * MiB, 0, D), (ALLOC, 250 * MiB, 0, D)]
    other_stream = [(k, s, 7, a) for k, s, _, a in RELEASE]
    assert not record(HELD + other_stream + after).runs.served.any()  # type: ignore[union-attr]
    small_request = [(SEGMENT_ALLOC, 2 * MiB, 0, D), (ALLOC, 4096, 0, D)]
    assert not record(HELD + RELEASE + small_request).runs.served.any()  # type: ignore[union-attr]
    bigger = [(SEGMENT_ALLOC, 302 * MiB, 0, D), (ALLOC, 301 * MiB, 0, D)]
    assert not record(HELD + RELEASE + bigger).runs.served.any()  # type: ignore[union-attr]
    # max_split_size 256 MiB: a 250 MiB request never takes a 300 MiB (oversize) block
    assert not record(HELD + RELEASE + after, 256 * MiB).runs.served.any()  # type: ignore[union-attr]
    # a free completed late, right before the burst, may have completed in the OOM path itself
    late = HELD[:-2] + [(FREE_COMPLETED, 300 * MiB, 0, C)]
    assert not record(late + RELEASE + after).runs.served.any()  # type: ignore[union-attr]


def test_each_kind_of_burst_is_told_apart() -> None:
    oom = record(HELD + RELEASE + [(FAILED_ALLOC, 2 * GiB, 0, 0)])
    assert oom.release_kinds(1 << 62, 0.0).tolist() == [OOM_RETRY]
    nothing_asked = record(HELD + RELEASE + [(FREE_REQUESTED, 200 * MiB, 0, A)])
    assert nothing_asked.release_kinds(1 * GiB, 0.0).tolist() == [PROGRAM]
    new = record(HELD + RELEASE + [(SEGMENT_ALLOC, 500 * MiB, 0, D), (ALLOC, 500 * MiB, 0, D)])
    assert new.release_kinds(1 * GiB, 0.0).tolist() == [OOM_RETRY]  # 800 + 500 MiB refused
    assert new.release_kinds(2 * GiB, 0.0).tolist() == [UNKNOWN]  # room: nothing forced it
    assert new.release_kinds(2 * GiB, 0.3).tolist() == [COLLECTED]  # above 0.3 x 2 GiB
    assert new.program_releases(2 * GiB, 0.0).tolist() == [len(HELD)]  # unknown: the program's
    assert KIND_NAMES[PROGRAM] == "empty_cache" and len(KIND_NAMES) == 4


# ------------------------------------------------------------- the empty_cache() program


def test_an_empty_cache_program_is_reproduced() -> None:
    """GIVEN a program that calls empty_cache() after every layer (the sample: a model whose
    layers are copied in from host memory, more than a hundred bursts of about a dozen
    segment frees, each followed by the next layer's segment_alloc) WHEN the torch model
    replays it THEN every burst is the program's, none is taken for an OOM retry (before,
    31 were, and the replay ran on a 1.71 GiB "device": 68.5 % of the segments reproduced),
    and the model reproduces the segments and the peak."""
    v = validate_snapshot(read_snapshot_columns(EMPTY_CACHE_SAMPLE))
    (d,) = v.devices
    counts = d.release_counts
    assert counts["empty_cache"] >= 100 and counts["oom_retry"] == counts["garbage_collection"] == 0
    assert sum(d.release_bursts) == counts["empty_cache"] + counts["unknown"] == d.empty_cache_calls
    assert d.recorded_oom_paths == d.simulated_oom_paths == 0
    assert "unlimited" in d.capacity_source
    assert d.recorded_segment_allocs > 1000
    assert v.segment_alloc_match is not None and v.segment_alloc_match >= 0.95
    assert v.peak_error is not None and abs(v.peak_error) <= 0.01 and v.meets_target


def test_the_counts_are_in_the_validation_output(tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    result = CliRunner().invoke(
        cli, ["whatif", str(EMPTY_CACHE_SAMPLE), "--validate", "--policy", "torch",
              "--json", str(out)], env={"COLUMNS": "100"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (device,) = json.loads(out.read_text())["validation"]["devices"]
    bursts = device["release_bursts"]
    assert set(bursts) == set(KIND_NAMES) and bursts["empty_cache"] >= 100
    text = " ".join(result.output.split())
    assert f"{sum(bursts.values())} burst(s) of segment frees / unmaps:" in text
    assert f"{bursts['empty_cache']} the program's empty_cache()" in text
    assert "0 the allocator's before a retry" in text


def test_the_allocators_own_bursts_keep_their_kinds() -> None:
    # The reader near its device's limit with a collector: retries and collections, no call
    (d,) = validate_snapshot(read_snapshot_columns(SAMPLES / "pressure_gc_snapshot.pickle")).devices
    counts = d.release_counts
    assert counts["empty_cache"] == counts["unknown"] == 0
    assert counts["garbage_collection"] > 100 and counts["oom_retry"] > 0
    assert counts["oom_retry"] + counts["garbage_collection"] == d.recorded_oom_paths


def test_every_policy_gives_memory_back_at_the_programs_calls() -> None:
    """Each policy replays the program's empty_cache() calls, by its own rules: torch returns
    every free segment, cuda-async trims its pool, the heaps and slabs hold nothing free above
    their pages; none holds more after a call than before it, and torch, which caches, holds
    less at the end than the same program without the calls."""
    columns = read_snapshot_columns(EMPTY_CACHE_SAMPLE)
    (source,), _ = snapshot_streams(columns, recorded_devices(columns), None)
    stream = source.stream
    calls = np.flatnonzero(stream.kind == EMPTY_CACHE)
    assert len(calls) >= 100 and calls.min() > 0
    for name in DEFAULT_POLICIES:
        r = parse_policy(name).simulate(stream, source.capacity_bytes)
        assert (r.reserved_bytes[calls] <= r.reserved_bytes[calls - 1]).all(), name
    kept = np.flatnonzero(stream.kind != EMPTY_CACHE)
    without = type(stream)(stream.kind[kept], stream.request[kept], stream.time_ns[kept],
                           stream.size, stream.stream, stream.stream_names)  # fmt: skip
    torch = parse_policy("torch")
    given_back = torch.simulate(stream, source.capacity_bytes)
    cached = torch.simulate(without, source.capacity_bytes)
    assert given_back.reserved_bytes[-1] < cached.reserved_bytes[-1]
    # after each call torch holds only segments with a live block: nothing wholly free
    assert (given_back.reserved_bytes[calls] < given_back.reserved_bytes[calls - 1]).mean() > 0.9


# --------------------------------------------- the evidence against the allocator's truth


class _Tagged:
    """The sample generator's caching allocator, noting why it released each segment."""

    def __init__(self, capacity: int, gc: bool, expandable: bool) -> None:
        ms = make_snapshots()
        pressure = {"memory_fraction": 0.9, "gc_threshold": 0.4} if gc else {}
        self.a = ms.CachingAllocator(capacity, 4 * MiB, expandable=expandable,
                                     va_base=0x7F00_0000_0000, faithful=True, **pressure)  # fmt: skip
        self.oom = ms.OutOfMemory
        self.cause: dict[int, str] = {}  # trace index of each segment_free -> who released it
        grow, collect = self.a._grow, self.a._garbage_collect

        def tag(who: str, fn: Any) -> Any:
            def run(*args: Any) -> Any:
                start = len(self.a.trace)
                try:
                    return fn(*args)
                finally:
                    for i in range(start, len(self.a.trace)):
                        if self.a.trace[i]["action"] in RELEASES:
                            self.cause.setdefault(i, who)

            return run

        self.a._garbage_collect = tag("gc", collect)
        self.a._grow = tag("oom", grow)  # inside it: the collector (tagged first), the release

    def empty_cache(self) -> None:
        start = len(self.a.trace)
        self.a.empty_cache()
        for i in range(start, len(self.a.trace)):
            self.cause[i] = "program"


@st.composite
def layer_programs(draw: st.DrawFn) -> tuple[list[list[int]], list[int], int, bool, int, bool]:
    """Layers of weight shapes (MiB) run in turn, empty_cache() after some, on a small device,
    with the collector or expandable segments (the generator has no collector for those)."""
    shapes = draw(st.lists(st.lists(st.sampled_from([1, 3, 12, 20, 30, 48, 64]), min_size=1,
                                    max_size=6), min_size=1, max_size=4))  # fmt: skip
    order = draw(st.lists(st.integers(0, len(shapes) - 1), min_size=1, max_size=24))
    capacity = draw(st.sampled_from([160, 256, 400, 4096])) * MiB
    expandable = draw(st.booleans())
    gc = not expandable and draw(st.booleans())
    return shapes, order, capacity, gc, draw(st.integers(0, 3)), expandable


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layer_programs())
def test_the_cache_evidence_never_calls_the_allocators_release_the_programs(
    case: tuple[list[list[int]], list[int], int, bool, int, bool],
) -> None:
    shapes, order, capacity, gc, every, expandable = case
    t = _Tagged(capacity, gc, expandable)
    frames: list[dict[str, Any]] = []
    resident = []
    for k, layer in enumerate(order):
        try:
            blocks = [t.a.malloc(n * MiB, frames) for n in shapes[layer]]
        except t.oom:
            continue
        if k % 3 == 0:
            resident.append(blocks.pop())  # some outputs live on, between the layers' segments
        for b in blocks:
            t.a.free(b)
        if every and k % every == 0:
            t.empty_cache()
        t.a.tick(50)
    assert len(t.a.trace) < 8000  # the whole trace: its indices are the tags'
    conf = "garbage_collection_threshold:0.4" if gc else ""
    snap = t.a.snapshot("expandable_segments:True" if expandable else conf)
    columns = snapshot_columns(pickle.loads(pickle.dumps(snap, protocol=4)), "layers")
    for d in recorded_devices(columns):
        runs = d.record.runs
        assert runs.served is not None
        for first, served in zip(runs.first.tolist(), runs.served.tolist(), strict=True):
            if served:  # THEN a burst the evidence gives the program was the program's
                assert t.cause[first] == "program", (first, t.cause[first])
    # AND the model, replaying the program's calls, takes the allocator's own releases itself
    # and reproduces the run: where the record says how large the device is (under a memory
    # fraction an oom entry's free memory is the device's, not the fraction's, a limit of the
    # record that --capacity lifts; docs/whatif.md "Capacity")
    v = validate_snapshot(columns)
    if v.segment_alloc_match is not None and not gc:
        assert v.segment_alloc_match >= 0.95, v
        assert v.peak_error is not None and abs(v.peak_error) <= 0.01, v


@st.composite
def streams_with_calls(draw: st.DrawFn) -> tuple[RequestStream, int]:
    """Random allocations and frees with empty_cache() calls among them, on a small device."""
    kind: list[int] = []
    request: list[int] = []
    sizes: list[int] = []
    live: list[int] = []
    for _ in range(draw(st.integers(1, 60))):
        roll = draw(st.integers(0, 9))
        if roll < 4 and live:
            kind.append(FREE)
            request.append(live.pop(draw(st.integers(0, len(live) - 1))))
        elif roll == 9:
            kind.append(EMPTY_CACHE)
            request.append(0)
        else:
            sizes.append(draw(st.sampled_from([512, 4096, MiB, 3 * MiB, 20 * MiB, 50 * MiB])))
            kind.append(REQUEST)
            request.append(len(sizes) - 1)
            live.append(len(sizes) - 1)
    stream = RequestStream.build(kind, request, np.arange(len(kind)), sizes or [1])
    return stream, draw(st.sampled_from([64, 128, 1 << 14])) * MiB


@settings(max_examples=EXAMPLES * 4, deadline=None)
@given(streams_with_calls())
def test_each_policy_gives_back_what_its_own_rules_hold_free(case: tuple[RequestStream, int]) -> None:
    stream, capacity = case
    calls = np.flatnonzero(stream.kind == EMPTY_CACHE)
    kept = np.flatnonzero(stream.kind != EMPTY_CACHE)
    without = RequestStream.build(stream.kind[kept], stream.request[kept], stream.time_ns[kept],
                                  stream.size, stream.stream)  # fmt: skip
    best = parse_policy("best-fit").simulate(stream, capacity)
    # cuda-async places as best-fit does and keeps its high-water pages; a call trims the pool
    # to the pages in use: best-fit's reserved memory at that moment
    pool = parse_policy("cuda-async").simulate(stream, capacity)
    assert pool.oom_event.tolist() == best.oom_event.tolist()
    assert (pool.reserved_bytes >= best.reserved_bytes).all()
    assert (pool.reserved_bytes[calls] == best.reserved_bytes[calls]).all()
    # the heaps, the buddy system and the slabs return pages as they empty: a call changes
    # nothing, so every figure is that of the same program without the calls
    for name in ("best-fit", "first-fit", "buddy", "slab"):
        policy = parse_policy(name)
        got, plain = policy.simulate(stream, capacity), policy.simulate(without, capacity)
        for figure in ("reserved_bytes", "free_bytes", "largest_free_bytes", "free_blocks"):
            assert getattr(got, figure)[kept].tolist() == getattr(plain, figure).tolist(), name

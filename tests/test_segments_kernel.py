"""The compiled pytorch-segments replay against the pure-Python reference, after every event.

Random allocator workloads from the sample generator (``tests/snapshot_workloads.py``), some of
them corrupted on purpose, every sample and every genuine snapshot in ../shared: both replays
must give the same value in every column at every timeline point, the same scalars, the same
OOM records and the same free blocks wherever asked. The reference's releasable bytes (R),
kept incrementally, are checked against their definition recomputed from scratch.

CI runs a few dozen examples; ``NSYSFRAG_PROPERTY_EXAMPLES=2000`` runs a deeper local check.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from nsysfrag.inputs.torch_snapshot.columns import snapshot_columns
from nsysfrag.inputs.torch_snapshot.reader import Snapshot, parse_snapshot
from nsysfrag.inputs.torch_snapshot.spaces import columns_events, device_events
from nsysfrag.models.segments import compiled as segments_compiled
from nsysfrag.models.segments import replay as segments_model
from nsysfrag.models.segments.device_replay import DeviceReplay
from nsysfrag.models.segments.layout import Layout
from nsysfrag.models.segments.replay import _Replayer
from nsysfrag.models.segments.rules import AllocatorSettings
from tests.conftest import REPO, SAMPLES
from tests.snapshot_workloads import snapshots
from tests.kernel_modes import both_kernels  # noqa: F401  (every test both ways)

EXAMPLES = int(os.environ.get("NSYSFRAG_PROPERTY_EXAMPLES", "40"))
MiB = 1 << 20
REAL_SNAPSHOTS = REPO.parent / "shared" / "real_snapshots"
REAL = (
    sorted(p for p in REAL_SNAPSHOTS.glob("*") if p.suffix in (".pickle", ".pkl"))
    if REAL_SNAPSHOTS.is_dir()
    else []
)
COLUMNS = (
    "time_ns", "event", "address", "bytes", "free_bytes", "largest_free_bytes", "free_blocks",
    "live_bytes", "reserved_bytes", "active_bytes", "pending_bytes", "releasable_bytes", "out_of_order", "hole",
    "freed_alloc", "pin_left", "pin_right", "removed_at", "overlap", "site",
)  # fmt: skip
SCALARS = (
    "site_names", "initial_blocks", "initial_reserved_bytes", "trace_entries", "timestamps",
    "conflicts", "final_mismatches", "base_address", "end_address", "peak_allocated",
    "max_reserved_bytes", "max_active_bytes", "max_requested_bytes", "ooms", "repairs",
)  # fmt: skip


def settings_of(records: Snapshot) -> AllocatorSettings:
    return AllocatorSettings(
        records.roundup_power2_divisions, records.max_split_size, records.expandable_segments
    )


def assert_same_replay(data: Any, name: str = "snapshot") -> None:
    """The Python replay of the record reader's events and the compiled replay of the columnar
    reader's, for every device of ``data``: the same value in every column and scalar, and the
    same free blocks at the first, peak, middle and last points."""
    records = parse_snapshot(data, name)
    columns = snapshot_columns(data, name)
    assert records.devices() == columns.devices()
    rules = settings_of(records)
    for device in records.devices():
        final = [s for s in records.segments if s.device == device]
        entries = records.histories.get(device, [])
        events, timestamps = device_events(entries, records.time_origin_us or 0)
        col_events, col_timestamps = columns_events(columns, device)
        assert timestamps == col_timestamps
        want = segments_model.replay_device(events, final, rules, timestamps)
        got = segments_compiled.replay_device(col_events, final, rules, col_timestamps)
        _compare(want, got, f"{name} device {device}")
        n = len(want.time_ns)
        if n == 0:
            continue
        peak = int(np.argmax(want.free_bytes - want.largest_free_bytes))
        for point in sorted({0, peak, n // 2, n - 1}):
            a = segments_model.free_blocks_after(events, final, rules, point)
            b = segments_compiled.free_blocks_at(col_events, final, rules, point)
            assert sorted(a.sizes.tolist()) == sorted(b.sizes.tolist()), (name, device, point)
            assert a.releasable_bytes == b.releasable_bytes, (name, device, point)


def _compare(want: DeviceReplay, got: DeviceReplay, where: str) -> None:
    for column in COLUMNS:
        a, b = getattr(want, column), getattr(got, column)
        assert a.dtype == b.dtype, (where, column, a.dtype, b.dtype)
        if not np.array_equal(a, b):
            diff = np.flatnonzero(a != b) if len(a) == len(b) else f"lengths {len(a)} {len(b)}"
            raise AssertionError(f"{where}: {column} differs at points {diff[:5]}")
    for scalar in SCALARS:
        assert getattr(want, scalar) == getattr(got, scalar), (where, scalar)


# ---------------------------------------------------------------- random workloads


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(corrupt=False))
def test_compiled_replay_matches_the_reference_on_allocator_workloads(snap: dict[str, Any]) -> None:
    assert_same_replay(snap)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(corrupt=True))
def test_compiled_replay_matches_the_reference_on_corrupted_snapshots(snap: dict[str, Any]) -> None:
    assert_same_replay(snap)


# ---------------------------------------------------------------- R against its definition


class _CheckedReplayer(_Replayer):
    """The reference replay, checking its incremental R against the definition at each point."""

    def _point(self, *args: Any, **kwargs: Any) -> None:
        super()._point(*args, **kwargs)
        assert self.layout.releasable_total == releasable_by_definition(self.layout)


def releasable_by_definition(layout: Layout) -> int:
    """SPEC §9 R: segments holding no allocated block, whole; in expandable ranges, the whole
    pages (of the range's grid) inside free blocks."""
    total = 0
    segs = layout.segs
    for start in segs.starts:
        seg = segs.seg[start]
        if not seg.expandable:
            i = bisect_left(layout.block_starts, start)
            if not (i < len(layout.block_starts) and layout.block_starts[i] < seg.end):
                total += seg.end - start
            continue
        i = bisect_left(layout.free_starts, start)
        while i < len(layout.free_starts) and layout.free_starts[i] < seg.end:
            s = layout.free_starts[i]
            e = layout.free_end[s]
            first = -((seg.origin - s) // seg.page)
            total += max((e - seg.origin) // seg.page - first, 0) * seg.page
            i += 1
    return total


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(corrupt=False))
def test_releasable_bytes_are_kept_as_defined(snap: dict[str, Any]) -> None:
    records = parse_snapshot(snap, "snapshot")
    for device in records.devices():
        final = [s for s in records.segments if s.device == device]
        events, timestamps = device_events(records.histories.get(device, []), 0)
        replayer = segments_model._replayer(events, final, settings_of(records), timestamps)
        checked = _CheckedReplayer(
            replayer.settings, final, replayer.entries, replayer.times, timestamps, replayer.start
        )
        checked.run()


def test_releasable_counts_whole_free_segments_and_free_expandable_pages() -> None:
    # GIVEN an empty 2 MiB small-pool segment and a 20 MiB large one with one 1 MiB block,
    # and a 60 MiB expandable range whose only block covers [20 MiB + 1 MiB, 40 MiB)
    base = 0x7F00_0000_0000
    exp = base + (1 << 30)
    snap = {
        "segments": [
            _segment(base, 2 * MiB, [], "small", False),
            _segment(base + 20 * MiB, 20 * MiB, [(base + 20 * MiB, MiB)], "large", False),
            _segment(exp, 60 * MiB, [(exp + 21 * MiB, 19 * MiB)], "large", True),
        ],
        "device_traces": [[]],
    }
    records = parse_snapshot(snap, "s")
    events, _ = columns_events(snapshot_columns(snap, "s"), 0)
    r = segments_compiled.replay_device(events, records.segments, settings_of(records))
    # THEN R is the free small segment, plus the expandable range's whole free 20 MiB pages:
    # [0, 20 MiB) and [40, 60 MiB); the 1 MiB before the block is part of a page in use
    assert r.releasable_bytes[-1] == 2 * MiB + 40 * MiB
    reference = segments_model.replay_device(events, records.segments, settings_of(records))
    assert reference.releasable_bytes[-1] == 42 * MiB


def _segment(
    address: int, size: int, blocks: list[tuple[int, int]], kind: str, expandable: bool
) -> dict[str, Any]:
    out, at = [], address
    for start, n in blocks:
        if start > at:
            out.append(
                {
                    "address": at,
                    "size": start - at,
                    "requested_size": 0,
                    "state": "inactive",
                    "frames": [],
                }
            )
        out.append(
            {
                "address": start,
                "size": n,
                "requested_size": n,
                "state": "active_allocated",
                "frames": [],
            }
        )
        at = start + n
    if at < address + size:
        out.append(
            {
                "address": at,
                "size": address + size - at,
                "requested_size": 0,
                "state": "inactive",
                "frames": [],
            }
        )
    return {"device": 0, "address": address, "total_size": size, "stream": 0, "segment_type": kind,
            "is_expandable": expandable, "blocks": out}  # fmt: skip


def test_a_history_of_segment_allocations_only() -> None:
    # GIVEN a history that only reserves segments (no alloc follows them: none folds into one)
    seg = 0x7F00_0000_0000
    history = [
        {"action": "segment_alloc", "addr": seg + k * (2 << 20), "size": 2 << 20, "stream": 0}
        for k in range(3)
    ]
    # THEN both replays give the same three segment points
    assert_same_replay({"segments": [], "device_traces": [history]})


# ---------------------------------------------------------------- samples and real snapshots


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.pickle")), ids=lambda p: p.name)
def test_compiled_replay_matches_the_reference_on_the_samples(path: Path) -> None:
    from nsysfrag.inputs.torch_snapshot.reader import load_plain_pickle

    assert_same_replay(load_plain_pickle(path), path.name)


@pytest.mark.skipif(not REAL, reason="../shared/real_snapshots is absent")
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name[:50])
def test_compiled_replay_matches_the_reference_on_real_snapshots(path: Path) -> None:
    from nsysfrag.inputs.torch_snapshot.reader import load_plain_pickle

    assert_same_replay(load_plain_pickle(path), path.name)

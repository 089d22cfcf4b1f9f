"""What ``whatif`` reads from a snapshot's columns, against a plain reference on its records.

``whatif`` builds each device's request stream (``models/segments/requests.py``) and its record
of reserved memory (``whatif/capacity.py``: the reserved bytes after every entry, the runs of
segment releases, the capacity an OOM implies, the program's own ``empty_cache()`` calls) from
the columnar reader, in array code. The reference below does the same from the record reader's
entries and the pure-Python window walk, one entry at a time, as simply as it can be written;
both must agree array for array on every sample, every genuine snapshot in ../shared and random
allocator workloads (some of them corrupted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from nsysfrag.allocators import TorchConfig
from nsysfrag.allocators.base import ALLOC, EMPTY_CACHE, FREE, UNLIMITED
from nsysfrag.inputs.torch_snapshot.columns import snapshot_columns
from nsysfrag.inputs.torch_snapshot.reader import (
    ACTION_KINDS,
    HistoryEntry,
    Snapshot,
    parse_snapshot,
)
from nsysfrag.inputs.torch_snapshot.unpickle import load_plain_pickle
from nsysfrag.models.segments.requests import snapshot_requests
from nsysfrag.models.segments.window import window_start
from nsysfrag.whatif.capacity import recorded_devices, replay_capacity
from nsysfrag.whatif.streams import stream_names
from tests.conftest import SNAPSHOT_INPUTS
from tests.test_segments_kernel import EXAMPLES, snapshots
from tests.kernel_modes import both_kernels  # noqa: F401  (every test both ways)

INPUTS = SNAPSHOT_INPUTS
RELEASES = ("segment_free", "segment_unmap")
NEW_SEGMENTS = ("segment_alloc", "segment_map")
MiB = 1 << 20


# ---------------------------------------------------------------- the reference


@dataclass
class Reference:
    """One device as the reference reads it."""

    kind: list[int] = field(default_factory=list)
    request: list[int] = field(default_factory=list)
    time_ns: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    names: dict[int, int] = field(default_factory=dict)  # raw stream -> index, first seen first
    unmatched: int = 0
    reserved: list[int] = field(default_factory=list)
    runs: list[tuple[int, int, int, str | None]] = field(default_factory=list)
    served: list[bool] = field(default_factory=list)  # per run: a released segment could serve
    oom_capacity: int | None = None

    def alloc(self, size: int, raw: int, t: int) -> int:
        self.size.append(size)
        self.stream.append(self.names.setdefault(raw, len(self.names)))
        self.event(ALLOC, len(self.size) - 1, t)
        return len(self.size) - 1

    def event(self, kind: int, request: int, t: int) -> None:
        self.kind.append(kind)
        self.request.append(request)
        self.time_ns.append(t)


FREES = ("free_requested", "free_completed")


def ordinary(trace: list[HistoryEntry], i: int) -> bool:
    """A free_completed right after its own free_requested."""
    prior = trace[i - 1] if i > 0 else None
    return prior is not None and prior.action == "free_requested" and prior.address == trace[i].address


def reference_served(trace: list[HistoryEntry], first: int, past: int, k: int, new: int,
                     max_split_size: int | None, divisions: bool) -> bool:  # fmt: skip
    """Could the allocation at ``k`` (after the run ``first .. past - 1`` and a new segment
    of ``new`` bytes) have been served by a block the run released? The allocator's cache
    search runs before it releases anything, so then the release was not the allocator's."""
    if k >= len(trace) or trace[k].action != "alloc" or not new or trace[k].size <= 0:
        return False
    i = first - 1
    while i >= 0 and trace[i].action == "free_completed":  # completed late: maybe in the OOM path
        if not ordinary(trace, i):
            return False
        i -= 1
    request = trace[k]
    small = request.size <= MiB
    low = max(512, (request.size + 511) // 512 * 512)
    # round_size is the 512 B steps, or with power-of-two divisions at most the next power of 2
    high = max(low, 1 << (request.size - 1).bit_length()) if divisions else low
    for e in trace[first:past]:
        if e.stream != request.stream:
            continue
        if e.action == "segment_free":
            block_high = min(high, new)  # the new segment holds the rounded request too
            ok = (e.size == 2 * MiB) == small and e.size >= block_high
        else:  # an unmapped range inside a free block, with the blocks freed right before
            start, end = e.address, e.address + e.size
            lo = first
            while lo > 0 and first - lo < 256 and trace[lo - 1].action in FREES:
                lo -= 1
            for i in range(lo, first):
                f = trace[i]
                if f.action == "free_completed" and ordinary(trace, i) and f.address < end \
                        and f.address + f.size > start:  # fmt: skip
                    start, end = min(start, f.address), max(end, f.address + f.size)
            below = [(a.address, j) for j, a in enumerate(trace)
                     if a.action == "alloc" and a.address < end]  # fmt: skip
            if not below or max_split_size is not None:
                continue
            last = trace[max(below)[1]]  # the allocation that starts last below the range's end
            overlaps = last.address + last.size > start
            ok = overlaps and end - start >= high and (last.size <= MiB) == small
            block_high = high
        if ok and max_split_size is not None:
            ok = (block_high < max_split_size and e.size < max_split_size) or (
                low >= max_split_size and e.size < low + 20 * MiB
            )
        if ok:
            return True
    return False


def reference_record(ref: Reference, trace: list[HistoryEntry], initial: int,
                     max_split_size: int | None = None, divisions: bool = False) -> None:  # fmt: skip
    """Reserved bytes after every entry; runs of releases (first entry, reserved before, the new
    segment right after, the action after that; whether a released segment could have served
    what followed); the most reserved + device free at any OOM."""
    r = initial
    for e in trace:
        r += e.size if e.action in NEW_SEGMENTS else -e.size if e.action in RELEASES else 0
        ref.reserved.append(r)
    j = 0
    while j < len(trace):
        if trace[j].action not in RELEASES:
            j += 1
            continue
        first = j
        while j < len(trace) and trace[j].action in RELEASES:
            j += 1
        k = j
        while k < len(trace) and trace[k].action in NEW_SEGMENTS:
            k += 1
        new = trace[j].size if k > j else 0
        before = ref.reserved[first - 1] if first > 0 else initial
        ref.runs.append((first, before, new, trace[k].action if k < len(trace) else None))
        ref.served.append(reference_served(trace, first, j, k, new, max_split_size, divisions))
    for e, reserved in zip(trace, ref.reserved, strict=True):
        if e.action == "oom" and e.device_free is not None:
            reach = reserved + e.device_free
            ref.oom_capacity = max(reach, ref.oom_capacity or reach)


def reference_empty_cache_calls(ref: Reference, capacity: int, gc_threshold: float) -> list[int]:
    """Release runs the allocator would not have made itself on a device of ``capacity``."""
    out = []
    for (first, before, new, then), served in zip(ref.runs, ref.served, strict=True):
        if then == "oom":
            continue
        if then == "alloc" and new and not served:
            refused = before + new > capacity
            collected = gc_threshold > 0 and before > gc_threshold * capacity
            if refused or collected:
                continue
        out.append(first)
    return out


def reference_device(records: Snapshot, device: int, empty_at: list[int] | None,
                     max_split_size: int | None = None, divisions: bool = False) -> Reference:  # fmt: skip
    """The request stream and the record of one device; ``empty_at``: the empty_cache() calls
    to replay (None: the reference's own reading, on the capacity the columns' record implies)."""
    final = [s for s in records.segments if s.device == device]
    trace = records.histories.get(device, [])
    start = window_start(final, trace)
    stamps = [e.time_us for e in trace]
    times = list(range(len(trace)))
    if any(t is not None for t in stamps):
        last = next(t for t in stamps if t is not None) * 1000
        times = [last := max(last, t * 1000) if t is not None else last for t in stamps]
    ref = Reference()
    live: dict[int, int] = {}
    for address, block in sorted(start.blocks.items()):
        size = block.requested or block.size or 0
        if size > 0:
            seg = start.segments.find(address)
            raw = start.segments.seg[seg].stream if seg is not None else 0
            live[address] = ref.alloc(size, raw, times[0] if times else 0)
    initial = sum(start.segments.seg[s].end - s for s in start.segments.starts)
    reference_record(ref, trace, initial, max_split_size, divisions)
    for j, (e, t) in enumerate(zip(trace, times, strict=True)):
        if empty_at is not None and j in empty_at:
            ref.event(EMPTY_CACHE, 0, t)
        if e.action == "alloc" and e.size > 0:
            if e.address in live:  # its free went missing
                ref.event(FREE, live.pop(e.address), t)
            live[e.address] = ref.alloc(e.size, e.stream, t)
        elif e.action in ("free_completed", "free"):
            request = live.pop(e.address, None)
            if request is None:
                ref.unmatched += 1
            else:
                ref.event(FREE, request, t)
        elif e.action == "oom" and e.size > 0:
            ref.event(FREE, ref.alloc(e.size, e.stream, t), t)
    return ref


# ---------------------------------------------------------------- the check


def assert_same_reading(data: Any, name: str = "snapshot") -> None:
    records = parse_snapshot(data, name)
    columns = snapshot_columns(data, name)
    config = TorchConfig.from_settings(
        columns.max_split_size, columns.roundup_power2_divisions, columns.expandable_segments,
        columns.allocator_conf,
    )  # fmt: skip
    divisions = any(columns.roundup_power2_divisions.values())
    for d in recorded_devices(columns):
        where = f"{name} device {d.device}"
        record = d.record
        plain = reference_device(records, d.device, None, columns.max_split_size, divisions)
        assert record.reserved.tolist() == plain.reserved, where
        runs = record.runs
        got_runs = list(zip(runs.first.tolist(), runs.before.tolist(), runs.new_segment.tolist(),
                            runs.then.tolist(), strict=True))  # fmt: skip
        codes: dict[str | None, int] = {None: -1, **ACTION_KINDS}
        assert got_runs == [(f, b, n, codes[t]) for f, b, n, t in plain.runs], where
        assert runs.served is not None and runs.served.tolist() == plain.served, where
        assert record.oom_capacity == plain.oom_capacity, where
        for capacity in (replay_capacity(None, record)[0], 1 << 30, UNLIMITED):
            for gc in (0.0, 0.5):
                assert record.program_releases(capacity, gc).tolist() == (
                    reference_empty_cache_calls(plain, capacity, gc)
                ), (where, capacity, gc)
        capacity, _ = replay_capacity(None, record)
        empty_at = record.program_releases(capacity, config.garbage_collection_threshold)
        ref = reference_device(records, d.device, empty_at.tolist(), columns.max_split_size,
                               divisions)
        got = snapshot_requests(d.history, d.window, empty_at)
        assert got.kind.tolist() == ref.kind, where
        assert got.request.tolist() == ref.request, where
        assert got.time_ns.tolist() == ref.time_ns, where
        assert got.size.tolist() == ref.size, where
        assert got.stream.tolist() == ref.stream, where
        want_names = stream_names(np.array(list(ref.names), dtype=np.int64))
        assert stream_names(got.stream_values) == want_names, where
        assert got.unmatched_frees == ref.unmatched, where
        assert record.peak == max([record.initial, *plain.reserved]), where


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name[:50])
def test_requests_and_record_from_columns_match_the_reference(path: Path) -> None:
    assert_same_reading(load_plain_pickle(path), path.name)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(corrupt=False))
def test_requests_and_record_match_the_reference_on_allocator_workloads(snap: Any) -> None:
    assert_same_reading(snap)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(corrupt=True))
def test_requests_and_record_match_the_reference_on_corrupted_snapshots(snap: Any) -> None:
    assert_same_reading(snap)

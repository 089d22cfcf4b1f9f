"""What a snapshot's record says about the device: how much memory the allocator could get
(the capacity C a replay runs on), and which of its releases of memory the program asked for.

The record never states C. It implies it in two ways: an ``oom`` entry carries the device's
free memory then (C = reserved + free); and a malloc's OOM retry — a run of ``segment_free``
(``segment_unmap``) right before the ``segment_alloc`` (``segment_map``) of an allocation —
shows the device refusing reserved + that segment, so C is below it, while C is at least the
peak the run reached. Without either the run never met the limit.

With expandable segments the retry's map is not what the device refused: PyTorch's first
attempt (``try_allocate_expandable_block``) extends the free block at the end of the mapped
range by the pages the request still lacks; the release then unmaps that block's whole pages
too, and the retry maps them again, more than the first attempt asked for. PyTorch 2.11 on an
H200 (``sample_traces/torch_expandable_snapshot.pickle``): 1040 MiB mapped, 145 MiB free on the
device, a 384 MiB request beside an 80 MiB free end lacks 16 pages (320 MiB): refused; 400 MiB
of free pages unmapped, 400 MiB mapped. Reserved + the retry's map put C at 1438 MiB, where the
first attempt fits, so the replay grew without the OOM path the run took (1 of 2 maps, peak
+31 %). The record states no refused size then, only that the run met the limit, so C is the
lowest capacity the record allows, its peak: every recorded map fits in it, and every refused
attempt exceeded the true C, which is at least the peak.

A release the allocator does not make itself is the program's ``torch.cuda.empty_cache()``:
a run of releases not followed by a new segment and an allocation (or an OOM), or followed by
one the device had room for (reserved + the segment within C) and that no garbage collection
explains (``garbage_collection_threshold``: the collector runs before cudaMalloc once reserved
exceeds the threshold times C).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from nsysfrag.allocators.base import UNLIMITED, GiB, MiB
from nsysfrag.events import (
    ALLOC,
    FAILED_ALLOC,
    I8,
    I64,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
)
from nsysfrag.inputs import check_space_count
from nsysfrag.inputs.torch_snapshot.columns import EMPTY_HISTORY, HistoryColumns, SnapshotColumns
from nsysfrag.inputs.torch_snapshot.reader import segments_by_device
from nsysfrag.inputs.torch_snapshot.spaces import columns_events
from nsysfrag.models.segments.compiled import WindowLayout, window_start
from nsysfrag.models.segments.rules import AllocatorSettings

DEFAULT_SNAPSHOT_CAPACITY = 80 * GiB
PAGE = 2 * MiB
RELEASES = np.array([SEGMENT_FREE, SEGMENT_UNMAP], dtype=np.int8)
NEW_SEGMENTS = np.array([SEGMENT_ALLOC, SEGMENT_MAP], dtype=np.int8)
TRACE_ENDS = -1  # ReleaseRuns.then: nothing follows the run


@dataclass(frozen=True)
class ReleaseRuns:
    """The runs of consecutive segment_free / segment_unmap entries, one element each."""

    first: I64  # trace index of the run's first entry
    before: I64  # reserved bytes just before it
    new_segment: I64  # bytes of the segment_alloc / segment_map right after it, 0 for none
    then: I8  # the action after the run and its new segments (TRACE_ENDS: the trace ends)
    unmapped: npt.NDArray[np.bool_]  # segment_unmap (expandable): the retry maps another size


@dataclass(frozen=True)
class Record:
    """One device's recorded history of reserved memory."""

    initial: int  # reserved bytes at the window's start
    reserved: I64  # after each trace entry
    runs: ReleaseRuns
    oom_capacity: int | None  # reserved + device free at the first oom entry that says

    @property
    def peak(self) -> int:
        return max(self.initial, int(self.reserved.max()) if len(self.reserved) else 0)

    def retries(self) -> npt.NDArray[np.bool_]:
        """Per run: a malloc released cached memory first and then got a new segment that,
        added to the reserved memory before the release, exceeds the peak."""
        asked = self.runs.before + self.runs.new_segment
        return np.asarray((self.runs.new_segment > 0) & (asked > self.peak))

    def refused(self) -> I64:
        """What the device refused the first time at each native retry: reserved + the
        segment, the same size the retry then got."""
        asked = self.runs.before + self.runs.new_segment
        return asked[self.retries() & ~self.runs.unmapped]

    def implied_capacity(self) -> tuple[int, str] | None:
        """The capacity the record implies, with how; None when the run never met a limit."""
        if self.oom_capacity is not None:
            # cudaMemGetInfo's free memory: the device's, even under a memory fraction.
            return self.oom_capacity, (
                "estimated from the recorded OOM: reserved + free device memory then"
            )
        if (self.retries() & self.runs.unmapped).any():
            return self.peak, (
                "estimated from the recorded OOM retries of expandable segments: the recorded"
                " peak reserved (the size the device refused is not recorded)"
            )
        refused = self.refused()
        if len(refused):
            # cudaMalloc refused reserved + the new segment there, and the run held `peak` at most.
            return max(self.peak, int(refused.min()) - PAGE), (
                "estimated from the recorded OOM retries: just below the smallest reserved + new"
                " segment the device refused"
            )
        return None

    def collector_capacity(self, gc_threshold: float) -> tuple[int, str] | None:
        """The allowed maximum A a run with ``garbage_collection_threshold`` and a memory
        fraction implies, with how; None when no release preceded a new segment. Before each
        such segment the collector ran (reserved above threshold x A) or the allocator refused
        itself (reserved + the segment above A): A lies below the larger of the two bounds of
        every run, and at most at an OOM entry's reserved + free device memory."""
        runs = self.runs
        new = (runs.then == ALLOC) & (runs.new_segment > 0)
        if not new.any():
            return None
        asked = runs.before[new] + runs.new_segment[new]
        collected = runs.before[new] / gc_threshold
        capacity = int(np.maximum(asked, collected).min()) - PAGE
        if self.oom_capacity is not None:
            capacity = min(capacity, self.oom_capacity)
        return max(self.peak, capacity), (
            "estimated from the recorded garbage collections and OOM retries: just below the"
            " least reserved memory at which the collector ran or the allocator refused"
        )

    def program_releases(self, capacity: int, gc_threshold: float) -> I64:
        """Trace indices where the program released memory itself (empty_cache()): the
        releases the allocator would not have made on a device of ``capacity``."""
        runs = self.runs
        refused = runs.before + runs.new_segment > capacity
        collected = (runs.before > gc_threshold * capacity) if gc_threshold > 0 else False
        # The failing malloc's own release; the malloc's OOM retry or garbage collection.
        allocator = (runs.then == FAILED_ALLOC) | (
            (runs.then == ALLOC) & (runs.new_segment > 0) & (refused | collected)
        )
        return np.asarray(runs.first[~allocator], dtype=np.int64)


@dataclass(frozen=True)
class RecordedDevice:
    """What one device of a snapshot recorded: its history, the layout at the start of the
    history's window (rebuilt backwards from the final segments), and its reserved memory."""

    device: int
    history: HistoryColumns
    window: WindowLayout
    record: Record

    @property
    def traced(self) -> bool:
        return len(self.history) > 0


def recorded_devices(columns: SnapshotColumns) -> list[RecordedDevice]:
    """Every device of the snapshot, ascending."""
    settings = AllocatorSettings(
        columns.roundup_power2_divisions, columns.max_split_size, columns.expandable_segments
    )
    out = []
    devices = columns.devices()
    check_space_count(columns.path, len(devices), "CUDA devices")
    by_device = segments_by_device(columns.segments)
    for device in devices:
        history = columns.histories.get(device, EMPTY_HISTORY)
        final = by_device.get(device, [])
        window = window_start(columns_events(columns, device)[0], final, settings)
        initial = int((window.segment_end - window.segment_start).sum())
        out.append(RecordedDevice(device, history, window, read_record(history, initial)))
    return out


def read_record(history: HistoryColumns, initial: int) -> Record:
    """The reserved bytes after every entry of ``history`` (from ``initial``), its runs of
    releases, and the capacity its first OOM entry implies."""
    action, size = history.action, history.size
    n = len(action)
    grows = np.isin(action, NEW_SEGMENTS)
    shrinks = np.isin(action, RELEASES)
    change = np.where(grows, size, 0) - np.where(shrinks, size, 0)
    reserved = (initial + np.cumsum(change)).astype(np.int64)
    edges = np.diff(np.concatenate([[0], shrinks.astype(np.int8), [0]]))
    first = np.flatnonzero(edges == 1)  # where each run starts
    past = np.flatnonzero(edges == -1)  # the entry right after each run (n: none)
    # The first entry at or after `past` that is not a new segment: what the run led to.
    others = np.append(np.flatnonzero(~grows), n)
    then_at = others[np.searchsorted(others, past)]
    padded_size = np.append(size, 0)
    padded_action = np.append(action, TRACE_ENDS).astype(np.int8)
    padded_reserved = np.append(reserved, initial)  # index -1: before the first entry
    runs = ReleaseRuns(
        first=first.astype(np.int64),
        before=padded_reserved[first - 1],
        new_segment=np.where(then_at > past, padded_size[past], 0).astype(np.int64),
        then=padded_action[then_at],
        unmapped=action[first] == SEGMENT_UNMAP,
    )
    said = np.flatnonzero(history.oom_device_free >= 0)
    oom = None
    if len(said):
        k = int(said[0])
        oom = int(reserved[history.oom_rows[k]]) + int(history.oom_device_free[k])
    return Record(initial, reserved, runs, oom)


def snapshot_capacity(
    capacity: int | None, record: Record, device_bytes: int | None = None
) -> tuple[int, str]:
    """The device the policies replay on: --capacity; else the device's total memory where
    nsysfrag record wrote it beside the snapshot (``device_bytes``); else what the record
    implies; else an assumed 80 GiB (or the recorded peak, if larger: the run did not run
    out)."""
    if capacity is not None:
        return capacity, "--capacity"
    if device_bytes is not None:
        return device_bytes, "device: its total memory, recorded beside the snapshot"
    implied = record.implied_capacity()
    if implied is not None:
        return implied
    if record.peak > DEFAULT_SNAPSHOT_CAPACITY:
        return record.peak, (
            "assumed: the recorded peak reserved (the snapshot does not record the device's"
            " memory); pass --capacity"
        )
    return DEFAULT_SNAPSHOT_CAPACITY, (
        "assumed: the snapshot does not record the device's memory; pass --capacity"
    )


def replay_capacity(capacity: int | None, record: Record) -> tuple[int, str]:
    """The device a replay of the recorded run itself uses (validation, and which releases
    were the program's): what the record implies; else --capacity; else unlimited (the run
    never met a limit)."""
    implied = record.implied_capacity()
    if implied is not None:
        return implied
    if capacity is not None:
        return capacity, "--capacity"
    return UNLIMITED, "unlimited: the recorded run never met the device's limit"

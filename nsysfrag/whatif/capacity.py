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

from collections.abc import Sequence
from dataclasses import dataclass

from nsysfrag.allocators.base import UNLIMITED, GiB, MiB
from nsysfrag.inputs.torch_snapshot.reader import HistoryEntry

DEFAULT_SNAPSHOT_CAPACITY = 80 * GiB
PAGE = 2 * MiB
_RELEASES = ("segment_free", "segment_unmap")
_NEW_SEGMENTS = ("segment_alloc", "segment_map")
SEGMENT_ACTIONS = _RELEASES + _NEW_SEGMENTS


@dataclass(frozen=True)
class ReleaseRun:
    """Consecutive segment_free / segment_unmap entries."""

    first: int  # trace index of the first
    before: int  # reserved bytes just before it
    new_segment: int  # bytes of the segment_alloc / segment_map right after it, 0 for none
    then: str | None  # the action after the run and any new segments (None: the trace ends)
    unmapped: bool  # segment_unmap (expandable segments), where the retry maps another size


@dataclass(frozen=True)
class Record:
    """One device's recorded history of reserved memory."""

    initial: int  # reserved bytes at the window's start
    reserved: list[int]  # after each trace entry
    runs: list[ReleaseRun]
    oom_capacity: int | None  # reserved + device free at the first oom entry that says

    @property
    def peak(self) -> int:
        return max([self.initial, *self.reserved])

    def retries(self) -> list[ReleaseRun]:
        """The runs where a malloc released cached memory first and then got a new segment
        that, added to the reserved memory before the release, exceeds the peak."""
        peak = self.peak
        return [r for r in self.runs if r.new_segment and r.before + r.new_segment > peak]

    def refused(self) -> list[int]:
        """What the device refused the first time at each native retry: reserved + the
        segment, the same size the retry then got."""
        return [r.before + r.new_segment for r in self.retries() if not r.unmapped]

    def implied_capacity(self) -> tuple[int, str] | None:
        """The capacity the record implies, with how; None when the run never met a limit."""
        if self.oom_capacity is not None:
            # cudaMemGetInfo's free memory: the device's, even under a memory fraction.
            return self.oom_capacity, (
                "estimated from the recorded OOM: reserved + free device memory then"
            )
        if any(r.unmapped for r in self.retries()):
            return self.peak, (
                "estimated from the recorded OOM retries of expandable segments: the recorded"
                " peak reserved (the size the device refused is not recorded)"
            )
        refused = self.refused()
        if refused:
            # cudaMalloc refused reserved + the new segment there, and the run held `peak` at most.
            return max(self.peak, min(refused) - PAGE), (
                "estimated from the recorded OOM retries: just below the smallest reserved + new"
                " segment the device refused"
            )
        return None

    def program_releases(self, capacity: int, gc_threshold: float) -> list[int]:
        """Trace indices where the program released memory itself (empty_cache()): the
        releases the allocator would not have made on a device of ``capacity``."""
        out = []
        for run in self.runs:
            if run.then == "oom":
                continue  # the failing malloc's own release
            if run.then == "alloc" and run.new_segment:
                refused = run.before + run.new_segment > capacity
                collected = gc_threshold > 0 and run.before > gc_threshold * capacity
                if refused or collected:
                    continue  # the malloc's OOM retry or garbage collection
            out.append(run.first)
        return out


def read_record(trace: Sequence[HistoryEntry], initial: int) -> Record:
    reserved, r = [], initial
    for e in trace:
        if e.action in _NEW_SEGMENTS:
            r += e.size
        elif e.action in _RELEASES:
            r -= e.size
        reserved.append(r)
    runs = []
    j, n = 0, len(trace)
    while j < n:
        if trace[j].action not in _RELEASES:
            j += 1
            continue
        first = j
        while j < n and trace[j].action in _RELEASES:
            j += 1
        k = j
        while k < n and trace[k].action in _NEW_SEGMENTS:
            k += 1
        new = trace[j].size if k > j else 0
        before = reserved[first - 1] if first > 0 else initial
        then = trace[k].action if k < n else None
        unmapped = trace[first].action == "segment_unmap"
        runs.append(ReleaseRun(first, before, new, then, unmapped))
    oom = next(
        (r + e.device_free for e, r in zip(trace, reserved, strict=True)
         if e.action == "oom" and e.device_free is not None),
        None,
    )  # fmt: skip
    return Record(initial, reserved, runs, oom)


def snapshot_capacity(capacity: int | None, record: Record) -> tuple[int, str]:
    """The device the policies replay on: --capacity; else what the record implies; else an
    assumed 80 GiB (or the recorded peak, if larger: the run did not run out)."""
    if capacity is not None:
        return capacity, "--capacity"
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

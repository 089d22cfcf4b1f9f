"""The device's memory C, and what says so: one estimate for every command.

``analyze``, ``whatif``, a job's ranks and the history all rate a space against the same C, so
one input gets one C whatever reads it. An nsys export records the device (``TARGET_INFO_GPU``);
a PyTorch snapshot does not, and C comes from the best evidence it has, in this order:

1. ``--capacity``;
2. the device's memory, where `nsysfrag record` wrote it beside the snapshot (X.device.json;
   :data:`DEVICE`; the input hands it over as ``device_bytes``): its total, or under
   ``torch.cuda.set_per_process_memory_fraction`` the allowed maximum (fraction x total: the
   allocator refuses beyond it, and PyTorch's OOM observer is handed that figure); but where
   the snapshot holds an OOM that recorded the device's free memory, reserved + free then is
   what the process could reach, and it wins when smaller: other processes on the GPU, NCCL's
   buffers and the CUDA context hold the rest (:data:`OOM`, saying so);
3. the snapshot's ``oom`` entries: the memory the process could reach then, reserved +
   ``device_free`` (the largest over the entries, at least the peak reserved; other processes
   and the CUDA context are not in it, so it is a lower bound);
4. the allocator's own release of cached memory before a retry (an OOM retry, a run of
   ``segment_free`` right before the ``segment_alloc`` of an allocation): the device refused
   reserved + that segment, so C is just below it (and at least the peak the run reached);
5. else the peak reserved memory, an assumption every report states (``capacity_source``
   ``reserved_peak``): the device is taken to have been full at the peak.

With expandable segments the retry's map is not what the device refused: PyTorch's first
attempt (``try_allocate_expandable_block``) extends the free block at the end of the mapped
range by the pages the request still lacks; the release then unmaps that block's whole pages
too, and the retry maps them again, more than the first attempt asked for. PyTorch 2.11 on an
H200 (``sample_traces/torch_expandable_snapshot.pickle``): 1040 MiB mapped, 145 MiB free on the
device, a 384 MiB request beside an 80 MiB free end lacks 16 pages (320 MiB): refused; 400 MiB
of free pages unmapped, 400 MiB mapped. Reserved + the retry's map put C at 1438 MiB, where the
first attempt fits, so a replay grew without the OOM path the run took (1 of 2 maps, peak
+31 %). The record states no refused size then, only that the run met the limit, so C is the
lowest capacity the record allows, its peak: every recorded map fits in it, and every refused
attempt exceeded the true C, which is at least the peak.

A release the allocator does not make itself is the program's ``torch.cuda.empty_cache()``:
a run of releases not followed by a new segment and an allocation (or an OOM), or followed by
one the device had room for (reserved + the segment within C) and that no garbage collection
explains (``garbage_collection_threshold``: the collector runs before cudaMalloc once reserved
exceeds the threshold times C), or one whose request a released segment could have served
(:mod:`nsysfrag.releases`: the allocator releases only after its cache search failed, so such a
run is the program's wherever it lies, and says nothing about C).

Pure array code over a device's history (the event kinds of :mod:`nsysfrag.events`); no model
is run, so ``analyze`` and ``whatif`` read the same record the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

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
from nsysfrag.releases import (
    COLLECTED,
    EMPTY_CACHE,
    OOM_RETRY,
    UNKNOWN,
    UNLIMITED_SPLIT,
    served_from_cache,
)
from nsysfrag.units import format_bytes

# Where C came from (JSON ``capacity_source``), strongest evidence first.
OVERRIDE = "--capacity"
DEVICE = "device"  # the device's own figure: an nsys export's TARGET_INFO_GPU, or one recorded beside a snapshot
OOM = "oom"
OOM_RETRIES = "oom_retries"
RESERVED_PEAK = "reserved_peak"  # an assumption: the snapshot does not say
SOURCES = (OVERRIDE, DEVICE, OOM, OOM_RETRIES, RESERVED_PEAK)

PAGE = 2 << 20  # the granularity of a cudaMalloc'd segment
RELEASES = np.array([SEGMENT_FREE, SEGMENT_UNMAP], dtype=np.int8)
NEW_SEGMENTS = np.array([SEGMENT_ALLOC, SEGMENT_MAP], dtype=np.int8)
TRACE_ENDS = -1  # ReleaseRuns.then: nothing follows the run


class DeviceBytes(int):
    """The device's memory as a record wrote it beside a snapshot: the bytes, and the memory
    fraction that made them the allowed maximum rather than the total (None: the total)."""

    fraction: float | None

    def __new__(cls, value: int, fraction: float | None = None) -> DeviceBytes:
        made = super().__new__(cls, value)
        made.fraction = fraction
        return made


@dataclass(frozen=True, slots=True)
class Capacity:
    """C, where it came from (one of :data:`SOURCES`) and that in words."""

    bytes: int
    source: str
    basis: str  # for the reports: "estimated from the recorded OOM: …"

    @property
    def assumed(self) -> bool:
        """Nothing in the input says how large the device is."""
        return self.source == RESERVED_PEAK

    @property
    def note(self) -> str:
        """Where C came from in a few words, for a heading beside C ('' for the device's own
        figure, which needs none)."""
        return _NOTES[self.source]

    def heading(self) -> str:
        """``15.50 GiB (from the recorded OOM)``: C and, unless the device said it, whence."""
        return format_bytes(self.bytes) + (f" ({self.note})" if self.note else "")


_NOTES = {
    OVERRIDE: "--capacity",
    DEVICE: "",
    OOM: "from the recorded OOM",
    OOM_RETRIES: "from the allocator's OOM retries",
    RESERVED_PEAK: "assumed: the peak reserved; pass --capacity",
}


def source_words(source: str) -> str:
    """Where a document's ``capacity_source`` says C came from, in a few words."""
    return _NOTES.get(source) or ("the device's own figure" if source == DEVICE else source)


def given(capacity: int) -> Capacity:
    return Capacity(capacity, OVERRIDE, "--capacity")


def device_memory(capacity: int, what: str = "the device's memory, as the input records it") -> Capacity:
    """The device's own figure (``what`` names where it was read)."""
    return Capacity(capacity, DEVICE, what)


def stated(capacity: int, source: str) -> Capacity:
    """C as an input that states it gives it: ``--capacity``, or the device's own figure."""
    return given(capacity) if source == OVERRIDE else device_memory(capacity)


@dataclass(frozen=True)
class ReleaseRuns:
    """The runs of consecutive segment_free / segment_unmap entries, one element each."""

    first: I64  # trace index of the run's first entry
    before: I64  # reserved bytes just before it
    new_segment: I64  # bytes of the segment_alloc / segment_map right after it, 0 for none
    then: I8  # the action after the run and its new segments (TRACE_ENDS: the trace ends)
    unmapped: npt.NDArray[np.bool_]  # segment_unmap (expandable): the retry maps another size
    # A released segment could have served the allocation that followed: not the allocator's.
    served: npt.NDArray[np.bool_] | None = None

    @property
    def allocators(self) -> npt.NDArray[np.bool_]:
        """Per run: the allocator may have made it (no released segment fits what followed)."""
        return np.ones(len(self.first), np.bool_) if self.served is None else ~self.served


@dataclass(frozen=True)
class Record:
    """One device's recorded history of reserved memory."""

    initial: int  # reserved bytes at the window's start
    reserved: I64  # after each trace entry
    runs: ReleaseRuns
    oom_capacities: I64  # per oom entry that records device_free: reserved + device free then

    @property
    def peak(self) -> int:
        return max(self.initial, int(self.reserved.max()) if len(self.reserved) else 0)

    @property
    def oom_capacity(self) -> int | None:
        """What the oom entries imply: the most the process could reach at any of them."""
        return int(self.oom_capacities.max()) if len(self.oom_capacities) else None

    def retries(self) -> npt.NDArray[np.bool_]:
        """Per run: a malloc released cached memory first and then got a new segment that,
        added to the reserved memory before the release, exceeds the peak."""
        asked = self.runs.before + self.runs.new_segment
        return np.asarray((self.runs.new_segment > 0) & (asked > self.peak) & self.runs.allocators)

    def refused(self) -> I64:
        """What the device refused the first time at each native retry: reserved + the
        segment, the same size the retry then got."""
        asked = self.runs.before + self.runs.new_segment
        return asked[self.retries() & ~self.runs.unmapped]

    def collector_capacity(self, gc_threshold: float) -> tuple[int, str] | None:
        """The allowed maximum A a run with ``garbage_collection_threshold`` and a memory
        fraction implies, with how; None when no release preceded a new segment. Before each
        such segment the collector ran (reserved above threshold x A) or the allocator refused
        itself (reserved + the segment above A): A lies below the larger of the two bounds of
        every run, and at most at an OOM entry's reserved + free device memory."""
        runs = self.runs
        new = (runs.then == ALLOC) & (runs.new_segment > 0) & runs.allocators
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

    def release_kinds(self, capacity: int, gc_threshold: float) -> I8:
        """Per run, whose release it was on a device of ``capacity`` (:mod:`nsysfrag.releases`
        codes): the failing malloc's before its oom, or its OOM retry; the collector's; the
        program's empty_cache() where nothing needed the release or the cache could have
        served what came next; else unknown (a new segment the device had room for)."""
        runs = self.runs
        new = (runs.then == ALLOC) & (runs.new_segment > 0) & runs.allocators
        refused = new & (runs.before + runs.new_segment > capacity)
        collected = new & (runs.before > gc_threshold * capacity) if gc_threshold > 0 else False
        kinds = np.where(new, UNKNOWN, EMPTY_CACHE)
        kinds = np.where(collected, COLLECTED, kinds)
        kinds = np.where(refused | (runs.then == FAILED_ALLOC), OOM_RETRY, kinds)
        return kinds.astype(np.int8)

    def program_releases(self, capacity: int, gc_threshold: float) -> I64:
        """Trace indices where the program released memory itself (empty_cache()): the
        releases the allocator would not have made on a device of ``capacity``."""
        kinds = self.release_kinds(capacity, gc_threshold)
        program = (kinds == EMPTY_CACHE) | (kinds == UNKNOWN)
        return np.asarray(self.runs.first[program], dtype=np.int64)


def read_record(
    action: I8, size: I64, device_free: I64 | None, initial: int,
    stream: I64 | None = None, address: I64 | None = None,
    max_split_size: int = UNLIMITED_SPLIT, divisions: bool = True,
) -> Record:  # fmt: skip
    """The reserved bytes after every entry of a device's history (its event kinds ``action``
    and ``size``s, from ``initial``), its runs of releases, and what its oom entries imply
    (``device_free``: per entry, what the oom recorded free on the device, -1 for none).
    With each entry's ``stream`` and ``address`` (and the run's ``max_split_size``; whether it
    set roundup_power2_divisions), which runs released a segment the next allocation could have
    taken (:mod:`nsysfrag.releases`)."""
    if device_free is None:
        device_free = np.full(len(action), -1, dtype=np.int64)
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
        served=None if stream is None or address is None else served_from_cache(
            action, size, stream, address.view(np.int64), first, past, then_at,
            np.where(then_at > past, padded_size[past], 0), max_split_size, divisions,
        ),
    )  # fmt: skip
    said = np.flatnonzero((action == FAILED_ALLOC) & (device_free >= 0))
    implied = (reserved[said] + device_free[said]).astype(np.int64)
    return Record(initial, reserved, runs, implied)


def recorded_capacity(record: Record, device_bytes: int | None = None) -> Capacity | None:
    """The capacity the input itself implies (steps 2 to 4), or None when it says nothing:
    the run never met the device's limit and nothing beside it recorded the device.
    ``device_bytes``: the device's total memory where `nsysfrag record` wrote it beside the
    snapshot (X.device.json)."""
    if device_bytes is not None:
        return _recorded_device(record, device_bytes)
    if record.oom_capacity is not None:
        # cudaMemGetInfo's free memory: the device's, even under a memory fraction.
        below = (
            "; below the peak reserved, so the device's free memory changed during the run: the"
            " peak"
            if record.oom_capacity < record.peak
            else ""
        )
        return Capacity(
            max(record.oom_capacity, record.peak, 1),
            OOM,
            "estimated from the recorded OOM: reserved + free device memory then (a lower bound:"
            f" other processes and the CUDA context are not in it){below}",
        )
    if (record.retries() & record.runs.unmapped).any():
        return Capacity(
            max(record.peak, 1),
            OOM_RETRIES,
            "estimated from the allocator's OOM retries of expandable segments: the recorded peak"
            " reserved (the size the device refused is not recorded)",
        )
    refused = record.refused()
    if len(refused):
        # cudaMalloc refused reserved + the new segment there, and the run held `peak` at most.
        return Capacity(
            max(record.peak, int(refused.min()) - PAGE, 1),
            OOM_RETRIES,
            "estimated from the allocator's OOM retries: just below the smallest reserved + new"
            " segment the device refused",
        )
    return None


def _recorded_device(record: Record, device_bytes: int) -> Capacity:
    """C from the device's memory recorded beside the snapshot, unless an OOM of the snapshot
    shows that less was reachable."""
    fraction = getattr(device_bytes, "fraction", None)
    limit = (
        f"the allowed maximum under set_per_process_memory_fraction({fraction:g}), recorded"
        " beside the snapshot"
        if fraction is not None
        else "the device's total memory, recorded beside the snapshot"
    )
    reachable = record.oom_capacity
    if reachable is not None and max(reachable, record.peak) < device_bytes:
        return Capacity(
            max(reachable, record.peak, 1),
            OOM,
            "reserved + free device memory at the recorded OOM: what this process could reach"
            f" then, less than {limit} ({device_bytes} bytes; other processes, NCCL's buffers and"
            " the CUDA context held the rest)",
        )
    return device_memory(int(device_bytes), limit)


def snapshot_capacity(
    record: Record, override: int | None = None, device_bytes: int | None = None
) -> Capacity:
    """C for one device of a snapshot: the first of the evidence above that it has."""
    if override is not None:
        return given(override)
    found = recorded_capacity(record, device_bytes)
    if found is not None:
        return found
    return Capacity(
        max(record.peak, 1),
        RESERVED_PEAK,
        "assumed: the peak reserved memory, since the snapshot does not record the device's;"
        " the device is taken to have been full at the peak; pass --capacity",
    )

"""A PyTorch memory snapshot as a recording: one space per CUDA device, in the
``pytorch-segments`` model.

The events are the device's history entries; a block's site is the innermost Python frame of
its allocation outside torch/ (``reader``). PyTorch rounds blocks to 512 B itself, so the
granularity option does not apply.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nsysfrag.errors import InputError
from nsysfrag.events import AllocationEvents, InputCounts, KnownSites, SourceInfo
from nsysfrag.inputs.recording import InputOptions, Recording, check_space_count
from nsysfrag.inputs.torch_snapshot.columns import EMPTY_HISTORY, SnapshotColumns
from nsysfrag.inputs.torch_snapshot.reader import (
    ACTION_KINDS,
    NO_STACK,
    HistoryEntry,
    Snapshot,
    describe_actions,
    segments_by_device,
)
from nsysfrag.inputs.torch_snapshot.stacks import program_stack
from nsysfrag.inputs.torch_snapshot.words import WORDS
from nsysfrag.models.section import SnapshotFacts
from nsysfrag.models.segments import MODEL_NAME, SegmentsModel
from nsysfrag.models.segments.rules import K_MIN_BLOCK, AllocatorSettings
from nsysfrag.models.snapshot_entries import history_times
from nsysfrag.models.space import RecordedSpace

__all__ = ["history_times"]  # defined beside the model that replays it; read from here too

SNAPSHOT_PID = 0  # a snapshot names no process
DEFAULT_GRANULARITY = 512
DEFAULT_PAGE_BYTES = InputOptions().page_bytes  # the observed model's, which a snapshot does not use


def recording_of(
    snapshot: Snapshot | SnapshotColumns,
    options: InputOptions,
    device_bytes: dict[int, int] | None = None,
) -> Recording:
    """One space per CUDA device of ``snapshot`` (its records, or its columns).

    ``options.capacity_bytes`` is C for every device; without it the model estimates C as
    every command does (:mod:`nsysfrag.capacity`): from a device's total memory where
    ``device_bytes`` has it (the facts a record wrote beside the snapshot), else from the
    device's record (its OOM entries, its OOM retries), else the peak reserved memory.
    """
    if options.capacity_bytes is not None and options.capacity_bytes < 1:
        raise InputError("--capacity must be a positive number of bytes")
    warnings: list[str] = []
    if options.granularity_bytes != DEFAULT_GRANULARITY:
        warnings.append(
            f"--granularity {options.granularity_bytes} is ignored for a PyTorch snapshot: block"
            f" sizes are recorded (the caching allocator rounds to {K_MIN_BLOCK} B itself)"
        )
    if options.page_bytes != DEFAULT_PAGE_BYTES:
        warnings.append(
            f"--page-size {options.page_bytes} is ignored for a PyTorch snapshot: its blocks live"
            " in the caching allocator's segments, not directly in the driver's pages"
        )
    if snapshot.unknown_actions:
        n = sum(snapshot.unknown_actions.values())
        warnings.append(
            f"{n} trace entr{'y' if n == 1 else 'ies'} with an unknown action were skipped"
            f" ({describe_actions(snapshot.unknown_actions)}); a newer PyTorch may have written"
            " this snapshot"
        )
    if snapshot.skipped_entries:
        warnings.append(
            f"{snapshot.skipped_entries} trace entr{'y' if snapshot.skipped_entries == 1 else 'ies'}"
            " had no valid address or size for their action and were skipped"
        )
    devices = snapshot.devices()
    if not devices:
        raise InputError(
            f"{snapshot.path}: the snapshot has no segments and no trace entries, so there is"
            " nothing to analyze; call torch.cuda.memory._record_memory_history() before the"
            " workload and dump the snapshot while memory is in use"
        )
    if not any(snapshot.histories.get(d) for d in devices):
        warnings.append(
            "the snapshot has no trace entries (segments only): every figure is the state at the"
            " moment of the snapshot; record history with"
            " torch.cuda.memory._record_memory_history() to see how it got there"
        )
    warnings.extend(snapshot.warnings)
    settings = AllocatorSettings(
        roundup_power2_divisions=snapshot.roundup_power2_divisions,
        max_split_size=snapshot.max_split_size,
        expandable_segments=snapshot.expandable_segments,
    )
    facts = SnapshotFacts(
        layout=snapshot.layout,
        allocator_conf=snapshot.allocator_conf,
        expandable_segments=snapshot.expandable_segments,
        time_origin_unix_us=snapshot.time_origin_us,
    )
    check_space_count(snapshot.path, len(devices), "CUDA devices")
    final_segments = segments_by_device(snapshot.segments)
    spaces = []
    for device in devices:
        if isinstance(snapshot, SnapshotColumns):
            events, timestamps = columns_events(snapshot, device)
        else:
            entries = snapshot.histories.get(device, [])
            events, timestamps = device_events(entries, snapshot.time_origin_us or 0)
        final = tuple(final_segments.get(device, ()))
        spaces.append(
            RecordedSpace(
                pid=SNAPSHOT_PID,
                device=device,
                device_name=f"cuda:{device}",
                process_name=None,
                events=events,
                model=SegmentsModel(
                    final,
                    settings,
                    facts,
                    progress=options.progress,
                    device_bytes=(device_bytes or {}).get(device),
                ),
                capacity_bytes=options.capacity_bytes,
                timestamps=timestamps,
            )
        )
    return Recording(
        source=SourceInfo(kind="torch-snapshot", path=snapshot.path, version=None, words=WORDS),
        model=MODEL_NAME,
        granularity_bytes=K_MIN_BLOCK,
        spaces=spaces,
        warnings=warnings,
        counts=InputCounts(skipped_rows=snapshot.skipped_entries),
        nothing_to_analyze=(
            "no device has a segment, an allocation or an OOM in this snapshot; there is"
            " nothing to analyze"
        ),
    )


def columns_events(columns: SnapshotColumns, device: int) -> tuple[AllocationEvents, bool]:
    """A device's history columns as events (the columns' action codes are the event kinds);
    False when the history has no timestamps."""
    history = columns.histories.get(device, EMPTY_HISTORY)
    time_ns, timestamps = history_times(history.time_us, columns.time_origin_us or 0)
    device_free = np.full(len(history), -1, dtype=np.int64)
    device_free[history.oom_rows] = history.oom_device_free
    events = AllocationEvents(
        time_ns=time_ns,
        kind=history.action,
        address=history.address.view(np.uint64),
        bytes=history.size,
        sites=KnownSites(columns.stack_site[history.stack], columns.site_names),
        stream=history.stream,
        device_free_bytes=device_free,
        failure_stacks=tuple(map(program_stack, history.oom_frames)),
    )
    return events, timestamps


def device_events(entries: Sequence[HistoryEntry], origin_us: int) -> tuple[AllocationEvents, bool]:
    """A device's history entries as events; False when the history has no timestamps."""
    times, timestamps = _times(entries, origin_us)
    names = [NO_STACK]
    codes = {NO_STACK: 0}
    site = []
    for e in entries:
        code = codes.get(e.site)
        if code is None:
            code = codes[e.site] = len(names)
            names.append(e.site)
        site.append(code)
    events = AllocationEvents(
        time_ns=np.asarray(times, dtype=np.int64),
        kind=np.asarray([ACTION_KINDS[e.action] for e in entries], dtype=np.int8),
        address=np.asarray([e.address for e in entries], dtype=np.uint64),
        bytes=np.asarray([e.size for e in entries], dtype=np.int64),
        sites=KnownSites(np.asarray(site, dtype=np.int64), names),
        stream=np.asarray([e.stream for e in entries], dtype=np.int64),
        device_free_bytes=np.asarray(
            [-1 if e.device_free is None else e.device_free for e in entries], dtype=np.int64
        ),
    )
    return events, timestamps


def _times(entries: Sequence[HistoryEntry], origin_us: int) -> tuple[list[int], bool]:
    """ns since ``origin_us`` per entry, never decreasing (an entry without a time takes the
    one before it); entry numbers when the history has no timestamps at all."""
    if not any(e.time_us is not None for e in entries):
        return list(range(len(entries))), False
    out = []
    last = next(e.time_us for e in entries if e.time_us is not None) - origin_us
    for e in entries:
        if e.time_us is not None:
            last = max(last, e.time_us - origin_us)
        out.append(last * 1000)
    return out, True

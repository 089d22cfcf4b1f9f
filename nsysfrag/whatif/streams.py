"""Request streams: what every policy replays, built from a PyTorch memory snapshot (one per
device) or an nsys export (one per process and device).

A snapshot gives tensor-level requests (:func:`~nsysfrag.models.segments.requests.
snapshot_requests`, from the snapshot's columns): its ``alloc`` and ``free_completed`` entries
with their streams; the blocks live at the start of the window (rebuilt by the compiled
backward walk) are allocated first, in address order; an ``oom`` entry is a request that is
freed at once; the program's own ``empty_cache()`` calls (``capacity``) are events too. An nsys
export gives the driver-level allocations of each space with the observed model's lifetimes
(docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nsysfrag.allocators import Policy, TorchConfig, parse_policy
from nsysfrag.allocators.base import ALLOC, FREE, I64, RequestStream
from nsysfrag.allocators.driver import NAME as DRIVER
from nsysfrag.allocators.torch import split_options
from nsysfrag.analysis.results import Counts
from nsysfrag.events import ALLOC as ENTRY_ALLOC
from nsysfrag.events import FAILED_ALLOC, FREE_COMPLETED
from nsysfrag.events import FREE as ENTRY_FREE
from nsysfrag.inputs.torch_snapshot.columns import SnapshotColumns
from nsysfrag.inputs.torch_snapshot.spaces import history_times
from nsysfrag.models.segments.requests import SnapshotRequests, snapshot_requests
from nsysfrag.models.series import ALLOCATED
from nsysfrag.models.tried_settings import (
    RunSettings,
    Setting,
    recorded_requests,
    tried_settings,
)
from nsysfrag.whatif.capacity import RecordedDevice, replay_capacity
from nsysfrag.whatif.driver import (
    PROGRAM_DRIVER,
    PROGRAM_PYTORCH,
    PROGRAM_SEGMENTS,
    Recorded,
    recorded_baseline,
)
from nsysfrag.whatif.recommend import STATE, TRACE


@dataclass(frozen=True)
class RequestSource:
    """One request stream and what is known about where it came from."""

    label: str
    pid: int | None
    device: int
    stream: RequestStream
    capacity_bytes: int
    capacity_source: str  # nsysfrag.capacity.SOURCES
    capacity_basis: str  # the source in words
    baseline: Policy
    recorded_peak_reserved_bytes: int | None
    warnings: list[str]
    segments_suspected: bool = False
    error_basis: str = TRACE  # how the baseline is checked against the record (recommend.py)
    timestamps: bool = True  # False: times are trace entry numbers (snapshots before 2.1)
    # The torch settings a whatif without --policy tries on top of the baseline's.
    tried: tuple[Setting, ...] = ()
    # What analyze says of the same space: its counts, the most bytes requested at once (the
    # recorded run's, whatever capacity the policies replay on) and the origin of its clock
    # (the input's first event; the stream's times are on that clock).
    counts: Counts = Counts()
    peak_requested_bytes: int = 0
    origin_ns: int = 0
    program: str = PROGRAM_PYTORCH  # which kind of program recorded it (whatif.driver)
    recorded: Recorded | None = None  # nsys: the baseline is the recorded run, not a replay


def stream_names(values: I64) -> tuple[str, ...]:
    """The names of raw cudaStream_t values, in order ("default" for stream 0)."""
    names = tuple("default" if v == 0 else hex(v) for v in values.tolist())
    return names or ("default",)


def snapshot_config(columns: SnapshotColumns) -> TorchConfig:
    """The allocator settings the snapshot's run used."""
    return TorchConfig.from_settings(
        columns.max_split_size, columns.roundup_power2_divisions, columns.expandable_segments,
        columns.allocator_conf,
    )  # fmt: skip


def snapshot_streams(
    columns: SnapshotColumns,
    devices: Sequence[RecordedDevice],
    capacity: int | None,
    device_bytes: dict[int, int] | None = None,
) -> tuple[list[RequestSource], list[str]]:
    """One request stream per device of a PyTorch snapshot (``device_bytes``: each device's
    total memory, where a record wrote it beside the snapshot)."""
    config = snapshot_config(columns)
    as_run = as_run_policy(config)
    run = RunSettings.of(
        columns.allocator_conf, columns.expandable_segments, columns.max_split_size,
        columns.roundup_power2_divisions,
    )  # fmt: skip
    notes = [columns.layout]
    if not any(d.traced for d in devices):
        notes.append(
            "the snapshot has no trace (state only): the request stream is its live blocks,"
            " allocated once in address order"
        )
    sources = []
    origin_us = columns.time_origin_us or 0
    for d in devices:
        replay_cap, _ = replay_capacity(capacity, d.record)
        empty_at = d.record.program_releases(replay_cap, config.garbage_collection_threshold)
        req = snapshot_requests(d.history, d.window, empty_at, origin_us=origin_us)
        if not len(req.kind):
            continue
        warnings = []
        if req.unmatched_frees:
            warnings.append(
                f"{req.unmatched_frees} free(s) of blocks the snapshot never shows were skipped"
            )
        cap = d.capacity(capacity, (device_bytes or {}).get(d.device))
        names = stream_names(req.stream_values)
        live = (b.requested_bytes for seg in columns.segments if seg.device == d.device
                for b in seg.blocks)  # fmt: skip
        requests = recorded_requests(d.history.action, d.history.size, live)
        sources.append(
            RequestSource(
                label=f"device {d.device}",
                pid=None,
                device=d.device,
                stream=RequestStream.build(
                    req.kind, req.request, req.time_ns, req.size, req.stream, names
                ),
                capacity_bytes=cap.bytes,
                capacity_source=cap.source,
                capacity_basis=cap.basis,
                baseline=as_run,
                recorded_peak_reserved_bytes=d.record.peak,
                warnings=warnings,
                timestamps=req.timestamps,
                error_basis=TRACE if d.traced else STATE,
                tried=tried_settings(run, requests),
                counts=recorded_counts(req, d.history.action),
                peak_requested_bytes=peak_requested(req, d.history.action),
                origin_ns=first_event_ns(columns, devices),
            )
        )
    return sources, notes


def first_event_ns(columns: SnapshotColumns, devices: Sequence[RecordedDevice]) -> int:
    """The origin of analyze's clock on this snapshot: its first history entry over all devices
    (0 for entry numbers: a device without timestamps counts its own entries)."""
    firsts = []
    for d in devices:
        if d.traced:
            times, timestamps = history_times(d.history.time_us, columns.time_origin_us or 0)
            firsts.append(int(times[0]) if timestamps else 0)
    return min(firsts, default=0)


def _entry_actions(req: SnapshotRequests, action: I64) -> I64:
    """Per event of ``req``: the action of the trace entry behind it, -1 for none."""
    if not len(action):
        return np.full(len(req.entry), -1, dtype=np.int64)
    behind: I64 = np.where(req.entry >= 0, action[np.maximum(req.entry, 0)], -1)
    return behind


def recorded_counts(req: SnapshotRequests, action: I64) -> Counts:
    """analyze's counts of the trace: the allocations and frees it recorded (not the blocks live
    at the window's start, nor the free whatif adds after a failed request) and its OOMs."""
    behind = _entry_actions(req, action)
    return Counts(
        allocations=int(((req.kind == ALLOC) & (behind == ENTRY_ALLOC)).sum()),
        frees=int(((req.kind == FREE) & np.isin(behind, (ENTRY_FREE, FREE_COMPLETED))).sum()),
        failed_allocations=int((action == FAILED_ALLOC).sum()),
    )


def peak_requested(req: SnapshotRequests, action: I64) -> int:
    """The most bytes the recorded run had requested at once: the stream's live requests,
    except those the run failed to place (analyze's largest live bytes)."""
    if not len(req.size):
        return 0
    behind = _entry_actions(req, action)
    counted = np.ones(len(req.size), dtype=np.bool_)
    counted[req.request[(req.kind == ALLOC) & (behind == FAILED_ALLOC)]] = False
    sign = np.select([req.kind == ALLOC, req.kind == FREE], [1, -1], 0)
    step = np.where(counted[req.request], sign * req.size[req.request], 0)
    return int(np.cumsum(step).max(initial=0))


def tried_policy(baseline: Policy, setting: Setting) -> Policy:
    """The baseline's torch settings with ``setting`` added: one knob changed."""
    base = baseline.options if isinstance(baseline.options, TorchConfig) else TorchConfig()
    conf = ",".join(filter(None, (base.conf_string(), str(setting))))
    return as_run_policy(TorchConfig.parse(conf))


def as_run_policy(config: TorchConfig) -> Policy:
    """The torch policy the snapshot's run used (PyTorch's defaults when it set nothing)."""
    conf = config.conf_string()
    if not conf:
        return Policy("torch")
    items = [item.replace(":", "=", 1) for item in split_options(conf)]
    return Policy("torch", config, label="torch:" + ",".join(items))


def nsys_streams(path: Path, capacity: int | None) -> tuple[list[RequestSource], list[str]]:
    """One request stream per (process, device) of an nsys export: its driver-level
    allocations and frees (the observed model's lifetimes: a free, or an overlapping
    allocation), with the recorded run as its baseline (``driver``)."""
    from nsysfrag.analysis import analyze
    from nsysfrag.inputs import InputOptions
    from nsysfrag.inputs.nsys import read_export

    analysis = analyze(read_export(path, InputOptions(capacity_bytes=capacity)))
    notes = [
        (
            "the request stream is the driver-level allocations nsys recorded (cudaMalloc,"
            " cuMemAlloc, …), and the baseline is what the driver did with them, as analyze"
            " reports it; nsys memory events carry no CUDA stream here, so all requests share"
            " one stream"
        ),
        *analysis.warnings,
    ]
    baseline = parse_policy(DRIVER)
    sources = []
    for s in analysis.spaces:
        tl = s.timeline
        allocs = np.flatnonzero(tl.event == ALLOCATED)
        if len(allocs) == 0:
            continue
        removed = tl.removed_at[allocs]
        freed = removed >= 0
        # A removal happens at an event index; a free sorts before an allocation there.
        position = np.concatenate([allocs, removed[freed]])
        order_key = np.concatenate([np.ones(len(allocs)), np.zeros(int(freed.sum()))])
        req = np.concatenate([np.arange(len(allocs)), np.flatnonzero(freed)])
        kind = np.concatenate([np.full(len(allocs), ALLOC), np.full(int(freed.sum()), FREE)])
        order = np.lexsort((order_key, position))
        points = position[order]
        stream = RequestStream.build(
            kind[order], req[order], tl.time_ns[points], tl.bytes[allocs],
            stream_names=("driver",),
        )  # fmt: skip
        warnings = []
        if s.caching_allocator_suspected:
            warnings.append(
                "every allocation is a multiple of 2 MiB and at least 2 MiB: these look like a"
                " caching allocator's segments (a PyTorch program), not tensors, so a what-if"
                " of other allocators is meaningless here; take a PyTorch memory snapshot"
                " (nsysfrag record -- python train.py) and run whatif on it, or record with"
                " PYTORCH_NO_CUDA_MEMORY_CACHING=1 (nsysfrag profile --torch-tensors)"
            )
        process = f" ({s.process_name})" if s.process_name else ""
        sources.append(
            RequestSource(
                label=f"process {s.pid}{process} · device {s.device}",
                pid=s.pid,
                device=s.device,
                stream=stream,
                capacity_bytes=s.capacity_bytes,
                capacity_source=s.capacity_source,
                capacity_basis=s.capacity_basis,
                baseline=baseline,
                # the baseline is the record: the driver's pages at the memory peak
                recorded_peak_reserved_bytes=(
                    s.memory_peak.pool.reserved_bytes
                    if s.memory_peak is not None and s.memory_peak.pool is not None
                    else None
                ),
                warnings=warnings,
                segments_suspected=s.caching_allocator_suspected,
                counts=s.counts,
                peak_requested_bytes=s.max_live_bytes,
                origin_ns=analysis.source.first_event_ns,
                program=PROGRAM_SEGMENTS if s.caching_allocator_suspected else PROGRAM_DRIVER,
                recorded=recorded_baseline(s, points, stream),
            )
        )
    return sources, notes

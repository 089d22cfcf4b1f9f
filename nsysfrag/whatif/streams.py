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
from nsysfrag.analysis.tried_settings import (
    RunSettings,
    Setting,
    recorded_requests,
    tried_settings,
)
from nsysfrag.inputs.torch_snapshot.columns import SnapshotColumns
from nsysfrag.models.segments.requests import snapshot_requests
from nsysfrag.models.series import ALLOCATED
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
    for d in devices:
        replay_cap, _ = replay_capacity(capacity, d.record)
        empty_at = d.record.program_releases(replay_cap, config.garbage_collection_threshold)
        req = snapshot_requests(d.history, d.window, empty_at)
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
            )
        )
    return sources, notes


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
                program=PROGRAM_SEGMENTS if s.caching_allocator_suspected else PROGRAM_DRIVER,
                recorded=recorded_baseline(s, points, stream),
            )
        )
    return sources, notes

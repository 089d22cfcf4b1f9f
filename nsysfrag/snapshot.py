"""analyze_snapshot(path) -> Analysis: a PyTorch memory snapshot in the pytorch-segments model.

The same figures as the nsys path (SPEC §3–§5), per CUDA device, for the same reporters: the
free blocks are the inactive ranges inside reserved segments (``segments_model``), and a block's
site is the innermost Python frame of its allocation outside torch/ (``snapshot_reader``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nsysfrag.analysis import (
    DEFAULT_GRANULARITY,
    Analysis,
    Counts,
    SpaceAnalysis,
    Timeline,
    histogram,
    hotspots_of,
    state_after,
)
from nsysfrag.analysis.metrics import (
    format_bytes,
    global_frag,
    growth_per_second,
    local_frag,
    overall_health,
)
from nsysfrag.errors import InputError
from nsysfrag.inputs.torch_snapshot.reader import (
    Snapshot,
    describe_actions,
    is_snapshot,
    read_snapshot,
)
from nsysfrag.models.observed.kernel import (
    ALLOCATED,
    FREED,
    UNMATCHED_FREE,
    ZERO_SIZE_ALLOC,
    ReplayResult,
    SpaceEvents,
)
from nsysfrag.models.segments.replay import (
    MIN_BLOCK_BYTES,
    MODEL_NAME,
    OOM,
    DeviceReplay,
    free_blocks_after,
    replay_device,
)

__all__ = ["MODEL_NAME", "analyze_snapshot", "analyze_snapshot_file", "is_snapshot"]

SNAPSHOT_PID = 0  # a snapshot names no process


def analyze_snapshot_file(
    path: str | Path,
    capacity_bytes: int | None = None,
    granularity_bytes: int = DEFAULT_GRANULARITY,
) -> Analysis:
    """Read and analyze the snapshot at ``path``."""
    return analyze_snapshot(read_snapshot(path), capacity_bytes, granularity_bytes)


def analyze_snapshot(
    snapshot: Snapshot,
    capacity_bytes: int | None = None,
    granularity_bytes: int = DEFAULT_GRANULARITY,
) -> Analysis:
    """One space per CUDA device of ``snapshot``, replayed in the pytorch-segments model.

    ``capacity_bytes`` is C for every device; without it C comes from the snapshot's OOM
    entries (reserved + CUDA free at the OOM), else it is the peak reserved memory (a warning
    says so). PyTorch rounds blocks to 512 B itself, so ``granularity_bytes`` is not used.
    """
    if capacity_bytes is not None and capacity_bytes < 1:
        raise InputError("--capacity must be a positive number of bytes")
    warnings: list[str] = []
    if granularity_bytes != DEFAULT_GRANULARITY:
        warnings.append(
            f"--granularity {granularity_bytes} is ignored for a PyTorch snapshot: block sizes"
            f" are recorded (the caching allocator rounds to {MIN_BLOCK_BYTES} B itself)"
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
    if not any(snapshot.traces.get(d) for d in devices):
        warnings.append(
            "the snapshot has no trace entries (segments only): every figure is the state at the"
            " moment of the snapshot; record history with"
            " torch.cuda.memory._record_memory_history() to see how it got there"
        )
    if snapshot.expandable_segments:
        warnings.append(
            "expandable segments: before raising OOM PyTorch unmaps fully free pages and maps"
            " them where a request needs them, so free blocks in different mapped ranges are not"
            " as stranded as the figures say; read global and local fragmentation as upper bounds"
        )
    spaces = []
    for device in devices:
        space = _analyze_device(snapshot, device, capacity_bytes, warnings)
        if space is not None:
            spaces.append(space)
    if not spaces:
        raise InputError(
            f"{snapshot.path}: no device has a segment, an allocation or an OOM in this snapshot;"
            " there is nothing to analyze"
        )
    return Analysis(
        trace_path=snapshot.path,
        nsys_version=None,
        granularity_bytes=MIN_BLOCK_BYTES,
        spaces=spaces,
        skipped_rows=snapshot.skipped_entries,
        warnings=warnings,
        model=MODEL_NAME,
    )


def _capacity(
    r: DeviceReplay, device: int, override: int | None, warnings: list[str]
) -> tuple[int, str]:
    if override is not None:
        if r.max_reserved_bytes > override:
            warnings.append(
                f"device {device}: the snapshot reserved up to {format_bytes(r.max_reserved_bytes)},"
                f" more than --capacity {format_bytes(override)}; global_frag can exceed 1"
            )
        return override, "--capacity"
    estimates = [
        o.reserved_bytes + o.device_free_bytes for o in r.ooms if o.device_free_bytes is not None
    ]
    if estimates:
        # What this process could reach at the OOM: its own reserve plus what CUDA had free.
        # Other processes and the CUDA context are not in it, so it is a lower bound.
        return max(max(estimates), r.max_reserved_bytes, 1), "oom"
    cap = max(r.max_reserved_bytes, 1)
    warnings.append(
        f"device {device}: the snapshot does not say how much memory the device has (no OOM"
        f" entry), so capacity C is the peak reserved memory, {format_bytes(cap)}, and global_frag"
        " is a share of that; pass --capacity (e.g. 80GiB) for the device's memory"
    )
    return cap, "reserved_peak"


def _analyze_device(
    snapshot: Snapshot, device: int, capacity_override: int | None, warnings: list[str]
) -> SpaceAnalysis | None:
    r = replay_device(snapshot, device)
    n = len(r.time_ns)
    if n == 0:
        return None
    capacity, capacity_source = _capacity(r, device, capacity_override, warnings)
    if r.conflicts:
        warnings.append(
            f"device {device}: {r.conflicts} trace entr{'y' if r.conflicts == 1 else 'ies'} did"
            " not fit the layout rebuilt from the final segments (the snapshot is inconsistent or"
            " edited); the layout there is approximate"
        )
    elif r.final_mismatches:
        warnings.append(
            f"device {device}: the replay ends {r.final_mismatches} segment(s) or block(s) away"
            " from the snapshot's final state; the layout is approximate"
        )
    if not r.timestamps and r.trace_entries:
        warnings.append(
            f"device {device}: the trace has no timestamps (PyTorch before 2.1), so times are"
            " entry numbers, 1 ns apart, and growth_per_s is 0"
        )
    g = global_frag(r.free_bytes, r.largest_free_bytes, capacity)
    loc = local_frag(r.free_bytes, r.largest_free_bytes)
    peak = int(np.argmax(g))
    at_peak = free_blocks_after(snapshot, device, peak)
    result = _as_replay_result(r)
    events = _as_space_events(r)
    outcome = r.event
    allocations = int(((outcome == ALLOCATED) & (np.arange(n) >= r.initial_blocks)).sum())
    ooms = len(r.ooms)
    counts = Counts(
        allocations=allocations,
        frees=int((outcome == FREED).sum()),
        unmatched_frees=int((outcome == UNMATCHED_FREE).sum()),
        overlaps=int(r.overlap.sum()),
        zero_size_allocs=int((outcome == ZERO_SIZE_ALLOC).sum()),
        failed_allocations=ooms,
        other_kind_events=0,
    )
    allocated_at_peak, requested_at_peak = r.peak_allocated
    max_global, max_local = float(g.max()), float(loc.max())
    max_blocks = int(r.free_blocks.max())
    return SpaceAnalysis(
        pid=SNAPSHOT_PID,
        device=device,
        device_name=f"cuda:{device}",
        process_name=None,
        capacity_bytes=capacity,
        base_address=r.base_address,
        arena_end=r.end_address,
        span_mode=False,
        counts=counts,
        alloc_failure_rate=ooms / (ooms + allocations) if ooms + allocations else 0.0,
        peak=state_after(events, peak, g, loc, result),
        peak_index=peak,
        final=state_after(events, n - 1, g, loc, result),
        max_global_frag=max_global,
        max_local_frag=max_local,
        max_free_blocks=max_blocks,
        max_live_bytes=int(r.live_bytes.max()),
        internal_frag=(
            (allocated_at_peak - requested_at_peak) / allocated_at_peak
            if allocated_at_peak > 0
            else 0.0
        ),
        growth_per_s=growth_per_second(r.time_ns, g) if r.timestamps else 0.0,
        health=overall_health(max_global, max_local, max_blocks),
        out_of_order_frees=int(r.out_of_order.sum()),
        hole_creating_frees=int(r.hole.sum()),
        hotspots=hotspots_of(events, result, r.site, r.site_names),
        size_histogram=histogram(r.bytes[outcome == ALLOCATED]),
        free_block_histogram=histogram(np.asarray(at_peak.sizes, dtype=np.int64)),
        timeline=Timeline(
            time_ns=r.time_ns,
            event=outcome,
            address=r.address,
            bytes=r.bytes,
            global_frag=g,
            local_frag=loc,
            free_blocks=r.free_blocks,
            largest_free_bytes=r.largest_free_bytes,
            free_bytes=r.free_bytes,
            live_bytes=r.live_bytes,
            removed_at=r.removed_at,
            site=r.site,
            site_names=r.site_names,
        ),
        caching_allocator_suspected=False,
        model=MODEL_NAME,
        extras=_extras(snapshot, r, capacity_source, peak, at_peak.releasable_bytes),
    )


def _extras(
    snapshot: Snapshot, r: DeviceReplay, capacity_source: str, peak: int, releasable: int
) -> dict[str, Any]:
    """The snapshot-only figures, merged into the space's JSON document."""
    return {
        "snapshot_layout": snapshot.layout,
        "allocator_conf": snapshot.allocator_conf,
        "expandable_segments": snapshot.expandable_segments,
        "capacity_source": capacity_source,
        "time_origin_unix_us": snapshot.time_origin_us,
        "reserved_bytes_peak": r.max_reserved_bytes,
        "allocated_bytes_peak": r.max_allocated_bytes,
        "requested_bytes_peak": r.max_requested_bytes,
        "reserved_bytes_at_frag_peak": int(r.reserved_bytes[peak]),
        # Free blocks that are whole cudaMalloc segments: PyTorch can return them to CUDA.
        "releasable_bytes_at_frag_peak": releasable,
        "reserved_bytes_final": int(r.reserved_bytes[-1]),
        "allocated_bytes_final": int(r.allocated_bytes[-1]),
        "requested_bytes_final": int(r.live_bytes[-1]),
        "window": {
            "trace_entries": r.trace_entries,
            "initial_blocks": r.initial_blocks,
            "initial_reserved_bytes": r.initial_reserved_bytes,
            "timestamps": r.timestamps,
            "conflicts": r.conflicts,
            "final_mismatches": r.final_mismatches,
        },
        "oom_events": [
            {
                "time_ns": o.time_ns,
                "device_free_bytes": o.device_free_bytes,
                "requested_bytes": o.requested_bytes,
                "largest_free_bytes": o.largest_free_bytes,
                "free_bytes": o.free_bytes,
                "reserved_bytes": o.reserved_bytes,
                "allocated_bytes": o.allocated_bytes,
                "stream": o.stream,
                "site": o.site,
            }
            for o in r.ooms
        ],
    }


def _as_replay_result(r: DeviceReplay) -> ReplayResult:
    """The replay in the observed model's vocabulary, for the shared hotspot and state code."""
    i = int(np.argmax(r.allocated_bytes)) if len(r.allocated_bytes) else 0
    return ReplayResult(
        outcome=np.where(r.event == OOM, ZERO_SIZE_ALLOC, r.event).astype(np.int8),
        overlap=r.overlap,
        free_bytes=r.free_bytes,
        largest_free_bytes=r.largest_free_bytes,
        free_blocks=r.free_blocks,
        live_bytes=r.live_bytes,
        peak_footprint=np.array([r.allocated_bytes[i], r.live_bytes[i]], dtype=np.int64),
        out_of_order=r.out_of_order,
        hole=r.hole,
        freed_alloc=r.freed_alloc,
        pin_left=r.pin_left,
        pin_right=r.pin_right,
        removed_at=r.removed_at,
    )


def _as_space_events(r: DeviceReplay) -> SpaceEvents:
    n = len(r.time_ns)
    is_block = r.event == ALLOCATED
    return SpaceEvents(
        start_ns=r.time_ns,
        is_free=(r.event == FREED) | (r.event == UNMATCHED_FREE),
        offset=np.where(
            r.address >= np.uint64(r.base_address),
            (r.address - np.uint64(r.base_address)).astype(np.int64),
            -1,
        ),
        bytes=r.bytes,
        footprint=np.where(is_block, r.bytes, 0),
        slot=np.full(n, -1, dtype=np.int64),
        slot_offset=np.zeros(0, dtype=np.int64),
        arena_bytes=r.end_address - r.base_address,
    )

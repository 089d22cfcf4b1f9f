"""summarize(space, run) -> SpaceAnalysis: one model's state series turned into the figures of
docs/metrics.md. The one place a space's figures are computed, whichever input and model gave
them."""

from __future__ import annotations

import numpy as np

from nsysfrag.analysis.failures import failures_of, stranded_sites
from nsysfrag.analysis.histograms import histogram
from nsysfrag.analysis.hotspots import hotspots_of
from nsysfrag.analysis.metrics import (
    global_frag,
    growth_per_second,
    local_frag,
    material,
    rate_health,
    unrated_maxima,
)
from nsysfrag.analysis.peak_sites import peak_sites
from nsysfrag.analysis.results import (
    Counts,
    Fragmentation,
    SpaceAnalysis,
    StateColumns,
    Timeline,
)
from nsysfrag.capacity import stated
from nsysfrag.events import FAILED_ALLOC, I64, SourceInfo
from nsysfrag.inputs import RecordedSpace
from nsysfrag.models import ModelRun
from nsysfrag.models.series import (
    ALLOCATED,
    FREED,
    UNMATCHED_FREE,
    ZERO_SIZE_ALLOC,
    PoolColumns,
)

CACHING_SEGMENT_BYTES = 2 << 20


def fragmentation(
    states: StateColumns,
    time_ns: I64,
    capacity_bytes: int,
    timed: bool = True,
    pool: PoolColumns | None = None,
) -> Fragmentation:
    """Peak, final and maximum state, health and growth of a non-empty series; ``timed=False``
    when the times are entry numbers (growth is then 0). ``free_bytes`` must be everything free
    on the device (what materiality is judged by)."""
    g = global_frag(states.free_bytes, states.largest_free_bytes, capacity_bytes)
    loc = local_frag(states.free_bytes, states.largest_free_bytes)
    health, basis = rate_health(
        g, loc, states.free_blocks, material(states.free_bytes, capacity_bytes), time_ns
    )
    return Fragmentation(
        states=states,
        time_ns=time_ns,
        pool=pool,
        global_frag=g,
        local_frag=loc,
        peak_index=int(np.argmax(g)),
        health=health,
        health_basis=basis,
        growth_per_s=growth_per_second(time_ns, g) if timed else 0.0,
    )


def summarize(space: RecordedSpace, run: ModelRun, source: SourceInfo, model: str) -> SpaceAnalysis:
    """The figures of one space from its model run (which must have points)."""
    series = run.series
    capacity = run.capacity_bytes
    f = fragmentation(series, series.time_ns, capacity, space.timestamps, series.pool)
    event = series.event
    allocations = int((event[series.initial_blocks :] == ALLOCATED).sum())
    failed = int((space.events.kind == FAILED_ALLOC).sum())
    counts = Counts(
        allocations=allocations,
        frees=int((event == FREED).sum()),
        unmatched_frees=int((event == UNMATCHED_FREE).sum()),
        overlaps=int(series.overlap.sum()),
        zero_size_allocs=int((event == ZERO_SIZE_ALLOC).sum()),
        failed_allocations=failed,
        other_kind_events=space.other_kind_events,
    )
    held, live_at_held = series.held_peak
    block_sizes = series.bytes[event == ALLOCATED]
    at_peak = run.free_blocks_after(f.peak_index)
    memory_peak = memory_peak_index(series.pool) if series.pool is not None else None
    section = run.snapshot_section(f.peak_index, at_peak)
    return SpaceAnalysis(
        pid=space.pid,
        device=space.device,
        device_name=space.device_name,
        process_name=space.process_name,
        capacity_bytes=capacity,
        base_address=series.base_address,
        arena_end=series.end_address,
        span_mode=series.span_mode,
        counts=counts,
        alloc_failure_rate=failed / (failed + allocations) if failed + allocations else 0.0,
        **f.headline(),
        peak_index=f.peak_index,
        memory_peak=None if memory_peak is None else f.state(memory_peak),
        memory_peak_index=memory_peak,
        memory_peak_sites=None if memory_peak is None else peak_sites(run, memory_peak),
        page_bytes=series.page_bytes,
        internal_frag=(held - live_at_held) / held if held > 0 else 0.0,
        health_basis=f.health_basis,
        ooms=failures_of(
            space.events, series, f, capacity,
            lambda p: stranded_sites(run.stranded_after(p), series),
        ),
        out_of_order_frees=int(series.out_of_order.sum()),
        hole_creating_frees=int(series.hole.sum()),
        hotspots=hotspots_of(series),
        size_histogram=histogram(block_sizes),
        free_block_histogram=histogram(at_peak.sizes),
        timeline=Timeline(
            time_ns=series.time_ns,
            event=event,
            address=series.address,
            bytes=series.bytes,
            global_frag=f.global_frag,
            local_frag=f.local_frag,
            free_blocks=series.free_blocks,
            largest_free_bytes=series.largest_free_bytes,
            free_bytes=series.free_bytes,
            live_bytes=series.live_bytes,
            removed_at=series.removed_at,
            site=series.site,
            site_names=series.site_names,
            pool=series.pool,
        ),
        caching_allocator_suspected=source.driver_allocations and _looks_like_segments(block_sizes),
        source=source,
        model=model,
        snapshot=section,
        timestamps=space.timestamps,
        capacity=section.capacity if section is not None else stated(capacity, space.capacity_source),
        unrated=tuple(
            unrated_maxima(
                f.local_frag, series.free_blocks, series.free_bytes, capacity, series.time_ns
            )
        ),
    )


def memory_peak_index(pool: PoolColumns) -> int:
    """The first point at which reserved is at its maximum; of several, the one with the most
    allocated (then the first of those)."""
    reserved = pool.reserved_bytes
    at_max = np.flatnonzero(reserved == reserved.max())
    return int(at_max[int(np.argmax(pool.allocated_bytes[at_max]))])


def _looks_like_segments(block_sizes: I64) -> bool:
    """Every block a multiple of 2 MiB: a caching allocator's segments, not its tensors."""
    return bool(
        len(block_sizes) > 0
        and (block_sizes >= CACHING_SEGMENT_BYTES).all()
        and (block_sizes % CACHING_SEGMENT_BYTES == 0).all()
    )

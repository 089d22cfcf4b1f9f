"""Failed allocations at the moment they happened, and what each says about fragmentation.

Every failed allocation of a space is reported with the state of the space when it failed: the
state after the last point at or before it (the empty arena before the first point). A failure
is described by its own state, never by the state at another moment such as the peak.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from nsysfrag.analysis.peak_sites import stranded_by_site
from nsysfrag.analysis.results import (
    CAPACITY,
    FRAGMENTATION,
    UNKNOWN,
    Failure,
    Fragmentation,
    PoolState,
    State,
    StrandedSite,
)
from nsysfrag.events import FAILED_ALLOC, AllocationEvents
from nsysfrag.models.series import StateSeries, StrandedSegment

# The sites whose blocks hold stranded memory at a point, largest first.
StrandedAt = Callable[[int], tuple[StrandedSite, ...]]
STRANDED_SITES_LISTED = 10


def verdict(requested: int | None, device_free: int, state: State) -> str:
    """``capacity`` when the request exceeds everything the allocator could have found without
    fragmentation (the driver's free memory, the stranded and the releasable bytes), else
    ``fragmentation``; ``unknown`` without a size or a caching allocator's figures."""
    pool = state.pool
    if requested is None or pool is None:
        return UNKNOWN
    if requested > device_free + pool.stranded_bytes + pool.releasable_bytes:
        return CAPACITY
    return FRAGMENTATION


def failures_of(
    events: AllocationEvents,
    series: StateSeries,
    f: Fragmentation,
    capacity_bytes: int,
    stranded_at: StrandedAt | None = None,
) -> tuple[Failure, ...]:
    """Every failed allocation among ``events``, in order, with its state (on a device of
    ``capacity_bytes``)."""
    failed = np.flatnonzero(events.kind == FAILED_ALLOC)
    # Only a caching allocator's failures record where the request was made.
    sites = events.sites.codes(failed) if len(failed) and series.pool is not None else None
    out = []
    for j, (event, point) in enumerate(zip(failed.tolist(), series.failure_points.tolist())):
        time_ns = int(events.time_ns[event])
        state = _empty(series, capacity_bytes, time_ns) if point < 0 else _at(f.state(point), time_ns)
        own = series.failure_allocated_bytes
        if own is not None and state.pool is not None:
            allocated = int(own[j])
            if allocated != state.pool.allocated_bytes:
                pool = dataclasses.replace(state.pool, allocated_bytes=allocated)
                state = dataclasses.replace(state, pool=pool)
        asked = int(events.bytes[event])
        requested = asked if asked >= 0 else None
        recorded = None
        if events.device_free_bytes is not None and events.device_free_bytes[event] >= 0:
            recorded = int(events.device_free_bytes[event])
        model_free = state.pool.device_free_bytes if state.pool is not None else 0
        v = verdict(requested, model_free if recorded is None else recorded, state)
        site = None
        if sites is not None:
            codes, names = sites
            site = names[int(codes[j])]
        out.append(
            Failure(
                state=state,
                requested_bytes=requested,
                verdict=v,
                recorded_device_free_bytes=recorded,
                site=site,
                stack=events.failure_stacks[j] if events.failure_stacks is not None else (),
                stranded_sites=stranded_at(point) if v == FRAGMENTATION and stranded_at else (),
            )
        )
    return tuple(out)


def stranded_sites(
    segments: list[StrandedSegment], series: StateSeries
) -> tuple[StrandedSite, ...]:
    """The sites of the allocated blocks in ``segments``, each credited with the stranded bytes
    of every segment it has a block in; largest first, the first STRANDED_SITES_LISTED."""
    names = series.site_names
    return tuple(
        StrandedSite(names[code], total, count)
        for code, total, count in stranded_by_site(segments, series)[:STRANDED_SITES_LISTED]
    )


def _at(state: State, time_ns: int) -> State:
    """``state`` as it was at ``time_ns`` (a failure's moment: after the point it follows)."""
    return state if state.time_ns == time_ns else dataclasses.replace(state, time_ns=time_ns)


def _empty(series: StateSeries, capacity: int, time_ns: int) -> State:
    """The space before its first event: nothing reserved, the whole device free (one free
    block, when that is at least a page); a model without reserved memory: its whole arena."""
    if series.pool is None:
        arena = series.end_address - series.base_address
        return State(time_ns, 0.0, 0.0, 1, arena, arena, 0)
    blocks = 1 if capacity >= (series.page_bytes or 1) else 0
    nothing = PoolState(reserved_bytes=0, allocated_bytes=0, active_bytes=0, releasable_bytes=0,
                        stranded_bytes=0, device_free_bytes=capacity, largest_block_bytes=0)  # fmt: skip
    return State(time_ns, 0.0, 0.0, blocks, capacity, capacity, 0, nothing)

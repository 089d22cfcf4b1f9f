"""The analysis as values: what ``analyze`` computes and every reporter reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from nsysfrag.analysis.metrics import F64, Health, HealthBasis, Unrated, size_class_label
from nsysfrag.events import I64, InputCounts, SourceInfo

if TYPE_CHECKING:
    from nsysfrag.capacity import Capacity
    from nsysfrag.models.section import SnapshotSection
    from nsysfrag.models.series import PoolColumns

TIMELINE_POINTS = 2000


@dataclass(frozen=True, slots=True)
class PoolState:
    """What the device held for the space at one moment: the caching allocator's segments
    (pytorch-segments), or the driver's resident pages (observed)."""

    reserved_bytes: int  # the segments' bytes, or the resident pages' (and memory pools')
    allocated_bytes: int  # PyTorch's allocated_bytes: blocks allocated and not freed (footprints, in pages)
    active_bytes: int  # PyTorch's active_bytes: also the freed blocks other streams still use
    releasable_bytes: int  # R: free bytes the allocator (a memory pool) can give back
    stranded_bytes: int  # S: free bytes beside allocated blocks in segments (resident pages)
    device_free_bytes: int  # D: the device's memory outside them
    largest_block_bytes: int  # L: the largest free block inside a segment (resident pages)


@dataclass(frozen=True, slots=True)
class State:
    """The space right after one event."""

    time_ns: int
    global_frag: float
    local_frag: float
    free_blocks: int
    largest_free_bytes: int
    free_bytes: int
    live_bytes: int
    pool: PoolState | None = None  # only where the model is of a caching allocator


# What a failed allocation says about fragmentation.
UNKNOWN = "unknown"  # the input records no size for the failed request
CAPACITY = "capacity"  # even with no fragmentation at all the request would not have fit
FRAGMENTATION = "fragmentation"  # the memory existed, but no single free range held it


@dataclass(frozen=True, slots=True)
class StrandedSite:
    """Where the allocated blocks are that keep stranded memory from the driver."""

    site: str
    stranded_bytes: int  # stranded in the segments holding this site's blocks
    segments: int


@dataclass(frozen=True, slots=True)
class SiteBytes:
    """One allocation site's bytes of some kind (live, stranded) at one moment."""

    site: str
    bytes: int


@dataclass(frozen=True, slots=True)
class Failure:
    """An allocation that failed, with the state of its space at that moment."""

    state: State  # after the last event at or before the failure (time_ns: the failure's)
    requested_bytes: int | None  # None: the input does not record it
    verdict: str  # UNKNOWN, CAPACITY or FRAGMENTATION
    recorded_device_free_bytes: int | None = None  # what the driver reported free, if recorded
    site: str | None = None  # where the failed request was made, if recorded
    stack: tuple[str, ...] = ()  # the request's path through the program, innermost first
    stranded_sites: tuple[StrandedSite, ...] = ()  # fragmentation verdicts: largest first


@dataclass(frozen=True, slots=True)
class Counts:
    allocations: int = 0
    frees: int = 0
    unmatched_frees: int = 0
    overlaps: int = 0
    zero_size_allocs: int = 0
    failed_allocations: int = 0
    other_kind_events: int = 0


@dataclass(frozen=True, slots=True)
class Hotspot:
    """Out-of-order frees of one (site, size class) of freed block."""

    site: str
    size_lo_bytes: int
    out_of_order_frees: int
    hole_creating_frees: int
    hole_bytes: int
    pinned_by: tuple[str, ...]  # sites of the blocks that bounded the holes, most frequent first

    @property
    def size_class(self) -> str:
        return size_class_label(self.size_lo_bytes.bit_length() - 1)


@dataclass(frozen=True, slots=True)
class Bucket:
    lo_bytes: int
    hi_bytes: int
    count: int
    bytes: int


@dataclass(frozen=True)
class Timeline:
    """Full resolution: one entry per point of the space's state series, in order."""

    time_ns: I64
    event: np.ndarray  # outcome codes; nsysfrag.models.series.EVENT_NAMES names them
    address: np.ndarray
    bytes: I64
    global_frag: F64
    local_frag: F64
    free_blocks: I64
    largest_free_bytes: I64
    free_bytes: I64
    live_bytes: I64
    removed_at: I64  # allocations: index of the event that freed or evicted the block, or -1
    site: I64  # allocations: code into site_names; 0 (no site) for other events
    site_names: list[str]
    pool: PoolColumns | None = None  # a caching allocator's reserved, allocated, ... per point

    def sample_indices(self, peak_index: int, points: int = TIMELINE_POINTS) -> I64:
        """At most ``points`` evenly spread indices, always with the first, peak and last."""
        n = len(self.time_ns)
        if n <= points:
            return np.arange(n, dtype=np.int64)
        spread = np.linspace(0, n - 1, points - 1).round().astype(np.int64)
        return np.unique(np.concatenate([spread, [0, peak_index, n - 1]]))[:points]


@dataclass(frozen=True)
class SpaceAnalysis:
    pid: int
    device: int
    device_name: str
    process_name: str | None
    capacity_bytes: int
    base_address: int
    arena_end: int
    span_mode: bool
    counts: Counts
    alloc_failure_rate: float
    peak: State
    peak_index: int
    final: State
    max_global_frag: float
    max_local_frag: float
    max_free_blocks: int
    max_live_bytes: int
    internal_frag: float
    growth_per_s: float
    health: Health
    health_basis: HealthBasis | None  # None when the space is ok
    ooms: tuple[Failure, ...]  # every failed allocation, in order
    out_of_order_frees: int
    hole_creating_frees: int
    hotspots: list[Hotspot]
    size_histogram: list[Bucket]
    free_block_histogram: list[Bucket]
    timeline: Timeline
    caching_allocator_suspected: bool
    source: SourceInfo  # the input, and the words reports use for it
    model: str  # which model produced these figures
    snapshot: SnapshotSection | None = None  # the figures only a PyTorch snapshot has
    timestamps: bool = True  # False: the times are entry numbers (a snapshot without times)
    # The state when the device held the most for the space (reserved at its maximum), beside
    # the worst fragmentation (``peak``); None for a model without reserved memory.
    memory_peak: State | None = None
    memory_peak_index: int | None = None
    page_bytes: int | None = None  # the driver's page, where the model maps blocks onto pages
    # Each site's live and stranded bytes at the memory peak (None without one).
    memory_peak_sites: PeakSites | None = None
    capacity: Capacity | None = None  # C with where it came from (capacity_bytes is C)
    # Maxima above a threshold that the health does not count (the materiality rule).
    unrated: tuple[Unrated, ...] = ()

    @property
    def capacity_source(self) -> str:
        """Where C came from (nsysfrag.capacity.SOURCES)."""
        return self.capacity.source if self.capacity is not None else "device"

    @property
    def capacity_basis(self) -> str:
        """Where C came from, in words."""
        return self.capacity.basis if self.capacity is not None else "the device's memory"

    @property
    def capacity_assumed(self) -> bool:
        """Nothing in the input says how large the device is (C is the peak reserved)."""
        return self.capacity is not None and self.capacity.assumed


@dataclass(frozen=True)
class Analysis:
    source: SourceInfo
    granularity_bytes: int
    spaces: list[SpaceAnalysis]
    model: str
    input_counts: InputCounts = field(default_factory=InputCounts)
    warnings: list[str] = field(default_factory=list)
    page_bytes: int | None = None  # the driver's page, where the model maps blocks onto pages


class StateColumns(Protocol):
    """The state after every event, as any model (or simulated allocator) gives it."""

    @property
    def free_bytes(self) -> I64: ...

    @property
    def largest_free_bytes(self) -> I64: ...

    @property
    def free_blocks(self) -> npt.NDArray[np.integer]: ...

    @property
    def live_bytes(self) -> I64: ...


@dataclass(frozen=True)
class Fragmentation:
    """The rated figures of one state series on a device of C bytes (docs/metrics.md)."""

    states: StateColumns
    time_ns: I64
    pool: PoolColumns | None
    global_frag: F64  # per event
    local_frag: F64
    peak_index: int  # the first event at which global_frag is at its maximum
    health: Health
    health_basis: HealthBasis | None
    growth_per_s: float

    def state(self, i: int) -> State:
        """The state after point ``i``."""
        states, pool = self.states, self.pool
        return State(
            time_ns=int(self.time_ns[i]),
            global_frag=float(self.global_frag[i]),
            local_frag=float(self.local_frag[i]),
            free_blocks=int(states.free_blocks[i]),
            largest_free_bytes=int(states.largest_free_bytes[i]),
            free_bytes=int(states.free_bytes[i]),
            live_bytes=int(states.live_bytes[i]),
            pool=None if pool is None else pool_state(pool, i),
        )

    @property
    def max_live_bytes(self) -> int:
        return int(self.states.live_bytes.max())

    def headline(self) -> dict[str, Any]:
        """The figures every summary of a series carries under the same names, as keyword
        arguments: an analyzed space (:class:`SpaceAnalysis`) and a what-if policy's replay
        (``PolicyOutcome``) both take them, so they are computed and named in one place."""
        return {
            "peak": self.state(self.peak_index),
            "final": self.state(len(self.global_frag) - 1),
            "max_global_frag": float(self.global_frag.max()),
            "max_local_frag": float(self.local_frag.max()),
            "max_free_blocks": int(self.states.free_blocks.max()),
            "max_live_bytes": self.max_live_bytes,
            "health": self.health,
            "growth_per_s": self.growth_per_s,
        }


def pool_state(pool: PoolColumns, i: int) -> PoolState:
    reserved, active = int(pool.reserved_bytes[i]), int(pool.active_bytes[i])
    releasable = int(pool.releasable_bytes[i])
    return PoolState(
        reserved_bytes=reserved,
        allocated_bytes=int(pool.allocated_bytes[i]),
        active_bytes=active,
        releasable_bytes=releasable,
        # Never below 0: a memory pool can record less than its blocks' footprints.
        stranded_bytes=max(0, reserved - active - releasable),
        device_free_bytes=pool.device_free_at(i),
        largest_block_bytes=int(pool.largest_block_bytes[i]),
    )


@dataclass(frozen=True)
class PeakSites:
    """Every site's live and stranded bytes at one point, most bytes first (ties by name)."""

    live: tuple[SiteBytes, ...]
    stranded: tuple[SiteBytes, ...]
    stranded_bytes: int  # of every segment holding stranded memory, each counted once
    # Per such segment: its stranded bytes and the sites of its blocks, so that a list cut
    # short can say how much stranded memory none of its sites pins.
    segment_bytes: I64
    segment_sites: tuple[frozenset[str], ...]

    def unpinned_by(self, listed: set[str]) -> int:
        """The stranded bytes of the segments that hold no block of a ``listed`` site."""
        keep = [not (sites & listed) for sites in self.segment_sites]
        return int(self.segment_bytes[np.asarray(keep, dtype=np.bool_)].sum()) if keep else 0

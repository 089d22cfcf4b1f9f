"""The analysis as values: what ``analyze`` computes and every reporter reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from nsysfrag.analysis.metrics import F64, Health, HealthBasis, Unrated, size_class_label
from nsysfrag.events import I64, InputCounts, SourceInfo

if TYPE_CHECKING:
    from nsysfrag.analysis.peak_sites import PeakSites
    from nsysfrag.capacity import Capacity
    from nsysfrag.models.segments import SnapshotSection
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

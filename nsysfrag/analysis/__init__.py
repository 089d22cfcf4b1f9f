"""analyze(trace) -> Analysis: every space's replay turned into the SPEC §3–§5 figures."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nsysfrag.analysis.metrics import (
    F64,
    Health,
    global_frag,
    growth_per_second,
    local_frag,
    overall_health,
    size_class,
    size_class_label,
)
from nsysfrag.errors import InputError
from nsysfrag.inputs.nsys.records import I64, ProgressCallback, Trace
from nsysfrag.inputs.nsys.sites import SiteResolver
from nsysfrag.models.observed.kernel import (
    ALLOCATED,
    FREED,
    NO_BLOCK,
    UNMATCHED_FREE,
    ZERO_SIZE_ALLOC,
    ReplayResult,
    SpaceEvents,
    assign_slots,
    replay,
)

MODEL_NAME = "observed"
DEFAULT_GRANULARITY = 512
TIMELINE_POINTS = 2000
EVENT_NAMES: tuple[str, ...] = ("alloc", "free", "unmatched_free", "zero_size_alloc")  # by outcome code
# Codes 4-8: the pytorch-segments model's segment and OOM events (nsysfrag.segments_model).
EVENT_NAMES += ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")
CACHING_SEGMENT_BYTES = 2 << 20


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
    """Full resolution: one entry per replayed event of the space, in order."""

    time_ns: I64
    event: np.ndarray  # replay outcome codes; EVENT_NAMES[code] names them
    address: np.ndarray
    bytes: I64
    global_frag: F64
    local_frag: F64
    free_blocks: I64
    largest_free_bytes: I64
    free_bytes: I64
    live_bytes: I64
    removed_at: I64  # allocations: index of the event that freed or evicted the block, or -1
    site: I64  # allocations: code into site_names; 0 ("(no range)") for other events
    site_names: list[str]

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
    out_of_order_frees: int
    hole_creating_frees: int
    hotspots: list[Hotspot]
    size_histogram: list[Bucket]
    free_block_histogram: list[Bucket]
    timeline: Timeline
    caching_allocator_suspected: bool
    model: str = MODEL_NAME  # which model produced these figures
    extras: dict[str, Any] = field(default_factory=dict)  # model-specific keys for the JSON


@dataclass(frozen=True)
class Analysis:
    trace_path: str
    nsys_version: str | None
    granularity_bytes: int
    spaces: list[SpaceAnalysis]
    skipped_rows: int = 0
    vmm_calls: int = 0
    unattributed_failures: int = 0
    unassigned_other_kind_events: int = 0
    warnings: list[str] = field(default_factory=list)
    model: str = MODEL_NAME


def analyze(
    trace: Trace,
    capacity_bytes: int | None = None,
    granularity_bytes: int = DEFAULT_GRANULARITY,
    progress: ProgressCallback | None = None,
) -> Analysis:
    """Replay every (process, device) space of ``trace`` in the observed address-space model."""
    if granularity_bytes < 1:
        raise InputError("--granularity must be a positive number of bytes")
    if capacity_bytes is not None and capacity_bytes < 1:
        raise InputError("--capacity must be a positive number of bytes")
    mem = trace.memory
    groups = _group_by_space(mem.pid, mem.device, np.flatnonzero(mem.modelled))
    resolver = SiteResolver(mem, trace.api, trace.nvtx)
    failures, unattributed = _charge_failures(trace, resolver, set(groups))
    other = {
        k: len(v)
        for k, v in _group_by_space(mem.pid, mem.device, np.flatnonzero(~mem.modelled)).items()
    }
    total = sum(len(rows) for rows in groups.values())
    spaces, done = [], 0
    for key in sorted(groups):
        if progress is not None:
            progress("replaying events", done, total)
        spaces.append(
            _analyze_space(
                trace,
                resolver,
                key,
                groups[key],
                _capacity(trace, key, capacity_bytes),
                granularity_bytes,
                failures.get(key, 0),
                other.get(key, 0),
            )
        )
        done += len(groups[key])
    if progress is not None:
        progress("replaying events", done, total)
    warnings = []
    if trace.vmm_calls:
        warnings.append(
            f"{trace.vmm_calls} virtual-memory-management call(s) (cuMemCreate/cuMemMap) were"
            " traced; nsys may not record their memory, so the layout can be incomplete"
            " (PyTorch expandable_segments and NCCL use them)"
        )
    if trace.skipped_rows:
        warnings.append(
            f"{trace.skipped_rows} memory event row(s) had NULL or malformed values and were skipped"
        )
    if unattributed:
        warnings.append(
            f"{unattributed} failed allocation call(s) came from processes with no device-memory"
            " events and are not charged to any space"
        )
    unassigned = sum(v for k, v in other.items() if k not in groups)
    return Analysis(
        trace_path=trace.path,
        nsys_version=trace.nsys_version,
        granularity_bytes=granularity_bytes,
        spaces=spaces,
        skipped_rows=trace.skipped_rows,
        vmm_calls=trace.vmm_calls,
        unattributed_failures=unattributed,
        unassigned_other_kind_events=unassigned,
        warnings=warnings,
    )


def _group_by_space(pid: I64, device: I64, rows: I64) -> dict[tuple[int, int], I64]:
    """Event indices (in order) of each (pid, device) among ``rows``."""
    if len(rows) == 0:
        return {}
    keys = (pid[rows] << 32) | device[rows]
    if (keys == keys[0]).all():  # the common case: one process on one device
        return {(int(pid[rows[0]]), int(device[rows[0]])): rows}
    order = np.argsort(keys, kind="stable")
    uniq, first = np.unique(keys[order], return_index=True)
    bounds = np.append(first, len(rows))
    return {
        (int(k >> 32), int(k & 0xFFFFFFFF)): rows[order[bounds[j] : bounds[j + 1]]]
        for j, k in enumerate(uniq.tolist())
    }


def _capacity(trace: Trace, key: tuple[int, int], override: int | None) -> int:
    if override is not None:
        return override
    pid, device = key
    gpu_id = trace.cuda_devices.get((pid, device), device)
    gpu = trace.gpus.get(gpu_id)
    if gpu is None or gpu.total_memory is None:
        raise InputError(
            f"{trace.path}: process {pid} allocated on device {device}, but the trace has no"
            " TARGET_INFO_GPU row with that device's memory size; pass --capacity BYTES"
        )
    return gpu.total_memory


def _device_name(trace: Trace, key: tuple[int, int]) -> str:
    pid, device = key
    gpu = trace.gpus.get(trace.cuda_devices.get((pid, device), device))
    return gpu.name if gpu is not None else f"device {device}"


def _charge_failures(
    trace: Trace, resolver: SiteResolver, spaces: set[tuple[int, int]]
) -> tuple[dict[tuple[int, int], int], int]:
    """SPEC §3: a failed allocation call goes to the device of its thread's most recent
    successful allocation, else to its process's lowest device."""
    api = trace.api
    failed = np.flatnonzero(api.is_failed_allocation)
    if len(failed) == 0:
        return {}, 0
    mem = trace.memory
    allocs = np.flatnonzero(mem.modelled & ~mem.is_free & (mem.bytes > 0))
    tid, _ = resolver.calling_threads(allocs)
    called = tid >= 0
    allocs, tid = allocs[called], tid[called]
    # For each failure, the latest allocation on the same thread strictly before it: sort the
    # allocations by (thread, time) and binary-search each failure's (thread, time).
    threads = (mem.pid[allocs] << 24) | tid
    order = np.lexsort((mem.start_ns[allocs], threads))
    threads, times, devices = threads[order], mem.start_ns[allocs][order], mem.device[allocs][order]
    fail_threads = (api.pid[failed] << 24) | api.tid[failed]
    fail_times = api.start_ns[failed]
    lo = np.searchsorted(threads, fail_threads, side="left")
    hi = np.searchsorted(threads, fail_threads, side="right")
    charged_device = np.full(len(failed), -1, dtype=np.int64)
    for j in range(len(failed)):
        before = lo[j] + np.searchsorted(times[lo[j] : hi[j]], fail_times[j], side="left") - 1
        if before >= lo[j]:
            charged_device[j] = devices[before]
    lowest: dict[int, int] = {}
    for pid, device in sorted(spaces):
        lowest.setdefault(pid, device)
    out: Counter[tuple[int, int]] = Counter()
    unattributed = 0
    for pid, device in zip(api.pid[failed].tolist(), charged_device.tolist(), strict=True):
        if device >= 0:  # the thread had allocated before
            out[(pid, device)] += 1
        elif pid in lowest:
            out[(int(pid), lowest[pid])] += 1
        else:
            unattributed += 1
    return dict(out), unattributed


def _space_events(
    trace: Trace, rows: I64, granularity: int, capacity: int
) -> tuple[SpaceEvents, int, int]:
    """Relative offsets, footprints and slots of one space's events; also B and E."""
    mem = trace.memory
    # One space holding every event (the usual case) needs views, not copies.
    whole = len(rows) == len(mem) and (len(rows) == 0 or rows[-1] == len(rows) - 1)
    is_free = mem.is_free if whole else mem.is_free[rows]
    nbytes = mem.bytes if whole else mem.bytes[rows]
    address = mem.address if whole else mem.address[rows]
    is_block = ~is_free & (nbytes > 0)
    footprint = np.where(is_block, -(-nbytes // granularity) * granularity, 0)
    if is_block.any():
        base = int(address[is_block].min())
    else:
        # No allocation to anchor the arena: use the lowest address seen so the layout is
        # defined (every event is then an unmatched free or a zero-size allocation).
        base = int(address.min())
    above = address >= np.uint64(base)
    offset = np.where(above, (address - np.uint64(base)).astype(np.int64), -1)
    highest_end = int((offset[is_block] + footprint[is_block]).max()) if is_block.any() else 0
    arena = max(capacity, highest_end)
    slot_offset, slot = assign_slots(offset, is_block, is_free)
    events = SpaceEvents(
        start_ns=mem.start_ns if whole else mem.start_ns[rows],
        is_free=is_free,
        offset=offset,
        bytes=nbytes,
        footprint=footprint,
        slot=slot,
        slot_offset=slot_offset.astype(np.int64),
        arena_bytes=arena,
    )
    return events, base, base + arena


def histogram(sizes: I64) -> list[Bucket]:
    sizes = np.sort(sizes[sizes > 0])
    if len(sizes) == 0:
        return []
    k = size_class(sizes)
    classes, first, counts = np.unique(k, return_index=True, return_counts=True)
    totals = np.add.reduceat(sizes, first)
    return [
        Bucket(1 << c, 1 << (c + 1), n, t)
        for c, n, t in zip(classes.tolist(), counts.tolist(), totals.tolist(), strict=True)
    ]


def _free_blocks_after(events: SpaceEvents, result: ReplayResult, index: int) -> I64:
    """Sizes of the free blocks right after event ``index``, from the blocks live then."""
    placed = np.flatnonzero(result.outcome[: index + 1] == ALLOCATED)
    alive = placed[(result.removed_at[placed] > index) | (result.removed_at[placed] == NO_BLOCK)]
    starts = events.offset[alive]
    order = np.argsort(starts)
    starts, ends = starts[order], (starts + events.footprint[alive])[order]
    gaps: I64 = np.concatenate([starts, [events.arena_bytes]]) - np.concatenate([[0], ends])
    return gaps[gaps > 0]


def state_after(events: SpaceEvents, i: int, g: F64, loc: F64, result: ReplayResult) -> State:
    return State(
        time_ns=int(events.start_ns[i]),
        global_frag=float(g[i]),
        local_frag=float(loc[i]),
        free_blocks=int(result.free_blocks[i]),
        largest_free_bytes=int(result.largest_free_bytes[i]),
        free_bytes=int(result.free_bytes[i]),
        live_bytes=int(result.live_bytes[i]),
    )


def _analyze_space(
    trace: Trace,
    resolver: SiteResolver,
    key: tuple[int, int],
    rows: I64,
    capacity: int,
    granularity: int,
    failed: int,
    other_kind: int,
) -> SpaceAnalysis:
    events, base, end = _space_events(trace, rows, granularity, capacity)
    # The compiled replay runs without the GIL: resolve the sites of the placed blocks (every
    # allocation with bytes > 0 is placed) on this thread meanwhile.
    with ThreadPoolExecutor(max_workers=1) as pool:
        replaying = pool.submit(replay, events)
        site_codes = np.zeros(len(rows), dtype=np.int64)
        placed = np.flatnonzero(~events.is_free & (events.bytes > 0))
        site_codes[placed], site_names = resolver.site_codes(rows[placed])
        result = replaying.result()
    g = global_frag(result.free_bytes, result.largest_free_bytes, capacity)
    loc = local_frag(result.free_bytes, result.largest_free_bytes)
    peak = int(np.argmax(g))
    last = len(rows) - 1
    outcome = result.outcome
    allocations = int((outcome == ALLOCATED).sum())
    counts = Counts(
        allocations=allocations,
        frees=int((outcome == FREED).sum()),
        unmatched_frees=int((outcome == UNMATCHED_FREE).sum()),
        overlaps=int(result.overlap.sum()),
        zero_size_allocs=int((outcome == ZERO_SIZE_ALLOC).sum()),
        failed_allocations=failed,
        other_kind_events=other_kind,
    )
    fp, live_at_fp = (int(v) for v in result.peak_footprint)
    internal = (fp - live_at_fp) / fp if fp > 0 else 0.0
    max_global, max_local = float(g.max()), float(loc.max())
    max_blocks = int(result.free_blocks.max())
    block_sizes = events.bytes[outcome == ALLOCATED]
    return SpaceAnalysis(
        pid=key[0],
        device=key[1],
        device_name=_device_name(trace, key),
        process_name=trace.process_names.get(key[0]),
        capacity_bytes=capacity,
        base_address=base,
        arena_end=end,
        span_mode=end > base + capacity,
        counts=counts,
        alloc_failure_rate=failed / (failed + allocations) if failed + allocations else 0.0,
        peak=state_after(events, peak, g, loc, result),
        peak_index=peak,
        final=state_after(events, last, g, loc, result),
        max_global_frag=max_global,
        max_local_frag=max_local,
        max_free_blocks=max_blocks,
        max_live_bytes=int(result.live_bytes.max()),
        internal_frag=internal,
        growth_per_s=growth_per_second(events.start_ns, g),
        health=overall_health(max_global, max_local, max_blocks),
        out_of_order_frees=int(result.out_of_order.sum()),
        hole_creating_frees=int(result.hole.sum()),
        hotspots=hotspots_of(events, result, site_codes, site_names),
        size_histogram=histogram(block_sizes),
        free_block_histogram=histogram(_free_blocks_after(events, result, peak)),
        timeline=Timeline(
            time_ns=events.start_ns,
            event=outcome,
            address=trace.memory.address[rows],
            bytes=events.bytes,
            global_frag=g,
            local_frag=loc,
            free_blocks=result.free_blocks,
            largest_free_bytes=result.largest_free_bytes,
            free_bytes=result.free_bytes,
            live_bytes=result.live_bytes,
            removed_at=result.removed_at,
            site=site_codes,
            site_names=site_names,
        ),
        caching_allocator_suspected=bool(
            len(block_sizes) > 0
            and (block_sizes >= CACHING_SEGMENT_BYTES).all()
            and (block_sizes % CACHING_SEGMENT_BYTES == 0).all()
        ),
    )


def hotspots_of(
    events: SpaceEvents, result: ReplayResult, site_codes: I64, site_names: list[str]
) -> list[Hotspot]:
    frees = np.flatnonzero(result.out_of_order)
    if len(frees) == 0:
        return []
    freed = result.freed_alloc[frees]
    hole = result.hole[frees]
    sizes = events.bytes[freed]
    # One group per (site, size class), keyed site * 64 + class; aggregated with bincount (no
    # sort: there are few sites and 64 classes, far fewer keys than frees).
    keys = (site_codes[freed] << 6) | size_class(sizes)
    frees_per_key = np.bincount(keys)
    groups = np.flatnonzero(frees_per_key)
    group_of = np.searchsorted(groups, keys)
    n_groups = len(groups)
    frees_per_group = frees_per_key[groups]
    holes_per_group = np.bincount(group_of[hole], minlength=n_groups)
    hole_bytes = np.zeros(n_groups, dtype=np.int64)
    np.add.at(hole_bytes, group_of[hole], sizes[hole])
    # Pinning sites: count (group, site) pairs over the left and right neighbours of each hole.
    pin_sites = np.concatenate(
        [site_codes[result.pin_left[frees][hole]], site_codes[result.pin_right[frees][hole]]]
    )
    pin_groups = np.concatenate([group_of[hole], group_of[hole]])
    pair_keys = pin_groups * len(site_names) + pin_sites
    if n_groups * len(site_names) <= 1 << 24:
        pair_counts = np.bincount(pair_keys)
        pairs = np.flatnonzero(pair_counts)
        pair_counts = pair_counts[pairs]
    else:
        pairs, pair_counts = np.unique(pair_keys, return_counts=True)
    pinned: dict[int, list[tuple[int, str]]] = {}
    for pair, count in zip(pairs.tolist(), pair_counts.tolist(), strict=True):
        group, site = divmod(pair, len(site_names))
        pinned.setdefault(group, []).append((-count, site_names[site]))
    hotspots = [
        Hotspot(
            site=site_names[key >> 6],
            size_lo_bytes=1 << (key & 0x3F),
            out_of_order_frees=int(frees_per_group[g]),
            hole_creating_frees=int(holes_per_group[g]),
            hole_bytes=int(hole_bytes[g]),
            pinned_by=tuple(name for _, name in sorted(pinned.get(g, []))),
        )
        for g, key in enumerate(groups.tolist())
    ]
    hotspots.sort(key=lambda h: (-h.hole_bytes, -h.out_of_order_frees, h.site, h.size_lo_bytes))
    return hotspots

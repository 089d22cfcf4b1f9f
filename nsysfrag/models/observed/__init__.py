"""The ``observed`` model (docs/metrics.md): blocks where the trace says they were, on the
device's pages.

A block's footprint is its size rounded up to the granularity G; a page of P bytes is resident
while a live footprint touches it. The driver maps free pages wherever they lie, so a request
fits the device's free pages (D) whatever their addresses; what fragments is the memory locked
in partly used pages (stranded). Blocks from a memory pool count in allocated, and the pool's
recorded size counts in reserved instead of their pages. The compiled replay (``kernel``) gives
the state after every allocation and free.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from nsysfrag.events import (
    ALLOC,
    FAILED_ALLOC,
    FREE,
    FREE_COMPLETED,
    I64,
    KIND_NAMES,
    AllocationEvents,
    MemoryPools,
)
from nsysfrag.models.observed.kernel import KernelEvents, KernelOutput, replay
from nsysfrag.models.observed.kernel import warm_up as warm_up  # re-exported: inputs.nsys warms it
from nsysfrag.models.observed.slots import assign_slots
from nsysfrag.models.series import (
    ALLOCATED,
    NO_BLOCK,
    FreeBlocks,
    PoolColumns,
    StateSeries,
    StrandedSegment,
    from_replay,
)
from nsysfrag.units import format_bytes

if TYPE_CHECKING:
    from nsysfrag.models.section import SnapshotSection
    from nsysfrag.models.space import RecordedSpace

MODEL_NAME = "observed"
DEFAULT_GRANULARITY = 512
DEFAULT_PAGE_BYTES = 2 << 20  # the driver's large page: what its allocations are aligned to
# The most the blocks of a space may span: offsets and footprint ends from the base page are
# int64. Inputs refuse a space whose blocks span more (nsys: ``inputs.nsys.spaces``): its
# addresses are damaged.
MAX_ARENA_BYTES = (1 << 63) - 1
# The kinds the model places: allocations, and frees that make memory reusable.
_PLACEABLE = np.zeros(len(KIND_NAMES), dtype=np.bool_)
_PLACEABLE[[ALLOC, FREE, FREE_COMPLETED]] = True


@dataclass(frozen=True)
class ObservedModel:
    granularity_bytes: int = DEFAULT_GRANULARITY
    page_bytes: int = DEFAULT_PAGE_BYTES
    name: str = MODEL_NAME

    def run(self, space: RecordedSpace) -> ObservedRun:
        """Replay the space's allocations and frees; other events (failures, segments) are
        not placed. The space's capacity must be known."""
        if space.capacity_bytes is None:
            raise ValueError("the observed model needs the space's capacity")
        events, rows = _placeable(space.events)
        kernel_events, base, end = kernel_events_of(
            events, self.granularity_bytes, self.page_bytes, space.capacity_bytes
        )
        # The compiled replay runs without the GIL: resolve the sites of the placed blocks
        # (every allocation with bytes > 0 is placed) on this thread meanwhile.
        with ThreadPoolExecutor(max_workers=1) as pool:
            replaying = pool.submit(replay, kernel_events)
            site_codes = np.zeros(len(events), dtype=np.int64)
            placed = np.flatnonzero(~kernel_events.is_free & (events.bytes > 0))
            site_codes[placed], site_names = space.events.sites.codes(rows[placed])
            out = replaying.result()
        fp, live_at_fp = (int(v) for v in out.peak_footprint)
        releasable = (
            kernel_events.pool_releasable
            if len(kernel_events.pool_releasable)
            else np.zeros(len(events), dtype=np.int64)  # untouched zeros cost no memory
        )
        series = from_replay(
            StateSeries,
            out,
            events,  # the times, addresses and sizes of the points
            site=site_codes,
            site_names=site_names,
            held_peak=(fp, live_at_fp),
            base_address=base,
            end_address=end,
            # A failed call is no point: it failed in the state of the last point before it.
            failure_points=np.searchsorted(rows, np.flatnonzero(space.events.kind == FAILED_ALLOC))
            - 1,
            pool=from_replay(
                PoolColumns,
                out,
                # The driver frees at once: nothing waits on another stream.
                active_bytes=out.allocated_bytes,
                releasable_bytes=releasable,
                capacity_bytes=space.capacity_bytes,
            ),
            page_bytes=self.page_bytes,
        )
        warnings = []
        most = int(out.reserved_bytes.max()) if len(out.reserved_bytes) else 0
        if most > space.capacity_bytes:
            warnings.append(
                f"process {space.pid} device {space.device}: the pages its blocks touch reached"
                f" {format_bytes(most)}, more than the device's {format_bytes(space.capacity_bytes)}"
                " (a wrong --capacity, or memory of other kinds in the same pages): device free"
                " memory is taken as 0 there and global fragmentation is clamped to 100 %"
            )
        return ObservedRun(series, space.capacity_bytes, kernel_events, out, warnings)


@dataclass(frozen=True)
class ObservedRun:
    series: StateSeries
    capacity_bytes: int
    kernel_events: KernelEvents
    output: KernelOutput
    warnings: list[str] = field(default_factory=list)

    def live_after(self, point: int) -> I64:
        """The allocation points of the blocks live right after ``point``."""
        out = self.output
        placed = np.flatnonzero(out.event[: point + 1] == ALLOCATED)
        alive: I64 = placed[(out.removed_at[placed] > point) | (out.removed_at[placed] == NO_BLOCK)]
        return alive

    def free_blocks_after(self, point: int) -> FreeBlocks:
        """The free runs inside resident pages right after ``point`` (device free memory is no
        block here), from the blocks live then."""
        events = self.kernel_events
        alive = self.live_after(point)
        alive = alive[~events.in_pool[alive]]
        starts = events.offset[alive]
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], (starts + events.footprint[alive])[order]
        return FreeBlocks(_page_runs(starts, ends, events.page_bytes))

    def stranded_after(self, point: int) -> list[StrandedSegment]:
        """The resident pages holding stranded memory right after ``point`` (memory pools'
        blocks aside: a pool's memory is its recorded size, not pages), each with its free
        bytes and the blocks in it."""
        events = self.kernel_events
        alive = self.live_after(point)
        alive = alive[~events.in_pool[alive]]
        page = events.page_bytes
        starts = events.offset[alive]
        ends = starts + events.footprint[alive]
        pages, stranded = _stranded_pages(starts, ends, page)
        if len(pages) == 0:
            return []
        # Only a block's first and last pages can hold stranded bytes: its inner pages are
        # wholly its own. So each block is in (at most) those two of the stranded pages.
        block = np.concatenate([alive, alive])
        touched = np.concatenate([starts // page, (ends - 1) // page])
        row = np.searchsorted(pages, touched)
        hit = (row < len(pages)) & (pages[np.minimum(row, len(pages) - 1)] == touched)
        order = np.lexsort((block[hit], row[hit]))
        rows, blocks = row[hit][order], block[hit][order]
        base = self.series.base_address
        first = base - base % page
        out = []
        bounds = np.searchsorted(rows, np.arange(len(pages) + 1))
        for k in range(len(pages)):
            points = np.unique(blocks[bounds[k] : bounds[k + 1]])
            out.append(
                StrandedSegment(
                    first + int(pages[k]) * page, int(stranded[k]), tuple(points.tolist())
                )
            )
        return out

    def snapshot_section(self, peak: int, at_peak: FreeBlocks) -> SnapshotSection | None:
        return None


def _stranded_pages(starts: I64, ends: I64, page: int) -> tuple[I64, I64]:
    """The pages (numbers, ascending) that footprints [starts, ends) leave partly free, and
    the free bytes of each. Overlapping footprints count once: the union is taken first, and
    only the end pages of its runs can be partly free."""
    if len(starts) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    opens = np.ones(len(starts), dtype=np.bool_)
    opens[1:] = starts[1:] > reach[:-1]
    run_start = starts[opens]
    run_end = reach[_last_of_runs(opens)]
    head, tail = run_start // page, (run_end - 1) // page
    one = head == tail
    page_of = np.concatenate([head, tail[~one]])
    used = np.concatenate([
        np.where(one, run_end - run_start, (head + 1) * page - run_start),
        run_end[~one] - tail[~one] * page,
    ])  # fmt: skip
    pages, where = np.unique(page_of, return_inverse=True)
    covered = np.zeros(len(pages), dtype=np.int64)
    np.add.at(covered, where.reshape(-1), used)
    free = page - covered
    partly = free > 0
    return pages[partly], free[partly]


def _last_of_runs(opens: np.ndarray) -> I64:
    """The index of the last element of each run that ``opens`` starts."""
    last = np.flatnonzero(opens)[1:] - 1
    return np.append(last, len(opens) - 1)


def _page_runs(starts: I64, ends: I64, page: int) -> I64:
    """The free runs inside the pages that footprints [starts, ends) touch (sorted by start,
    none overlapping in bytes), as the kernel counts them: the head of the first block's first
    page, the tail of the last one's last page, and between neighbours one run when no whole
    page lies between them, else the tail and the head of their own pages."""
    if len(starts) == 0:
        return np.zeros(0, dtype=np.int64)
    p_end, q_start = ends[:-1], starts[1:]
    tail_page = -(-p_end // page) * page
    head_page = q_start // page * page
    joined = tail_page >= head_page
    runs = np.concatenate([
        [starts[0] - starts[0] // page * page],
        np.where(joined, np.maximum(0, q_start - p_end), 0),
        np.where(joined, 0, tail_page - p_end),
        np.where(joined, 0, q_start - head_page),
        [-(-ends[-1] // page) * page - ends[-1]],
    ])  # fmt: skip
    return runs[runs > 0]


def _placeable(events: AllocationEvents) -> tuple[AllocationEvents, I64]:
    """The allocations and frees among ``events`` (requested frees are not free yet), and
    their indices in ``events``; views, no copies, when that is all there is."""
    placeable = _PLACEABLE[events.kind]
    if placeable.all():
        return events, np.arange(len(placeable), dtype=np.int64)
    rows = np.flatnonzero(placeable)
    pools = events.pools
    return (
        AllocationEvents(
            time_ns=events.time_ns[rows],
            kind=events.kind[rows],
            address=events.address[rows],
            bytes=events.bytes[rows],
            sites=events.sites,
            pools=None if pools is None else MemoryPools(
                pools.pool[rows], pools.size_bytes[rows], pools.kept_bytes[rows]
            ),
        ),
        rows,
    )


def kernel_events_of(
    events: AllocationEvents, granularity: int, page_bytes: int, capacity: int
) -> tuple[KernelEvents, int, int]:
    """Offsets from the base page, footprints, slots and pools of one space's allocations and
    frees; also B (the lowest allocated address) and the highest footprint end."""
    is_free = events.kind != ALLOC
    nbytes = events.bytes
    address = events.address
    is_block = ~is_free & (nbytes > 0)
    footprint = np.where(is_block, -(-nbytes // granularity) * granularity, 0)
    if is_block.any():
        base = int(address[is_block].min())
    else:
        # No allocation: use the lowest address seen so the offsets are defined (every event
        # is then an unmatched free or a zero-size allocation).
        base = int(address.min())
    # Offsets count from the page B lies in, so that page k of the space starts at k * P.
    page_base = base - base % page_bytes
    # Addresses are unsigned 64-bit; offsets are signed, which the input made safe for every
    # block (MAX_ARENA_BYTES). A free far above every block (2**63 or more) wraps negative:
    # a free of no block, as it should be.
    above = address >= np.uint64(page_base)
    offset = np.where(above, (address - np.uint64(page_base)).astype(np.int64), -1)
    highest_end = int((offset[is_block] + footprint[is_block]).max()) if is_block.any() else 0
    slot_offset, slot = assign_slots(offset, is_block, is_free)
    in_pool, pool_reserved, pool_releasable = _pool_columns(events.pools, is_block)
    kernel_events = KernelEvents(
        is_free=is_free,
        offset=offset,
        bytes=nbytes,
        footprint=footprint,
        slot=slot,
        slot_offset=slot_offset.astype(np.int64),
        in_pool=in_pool,
        page_bytes=page_bytes,
        capacity_bytes=capacity,
        pool_reserved=pool_reserved,
        pool_releasable=pool_releasable,
    )
    return kernel_events, base, max(base, page_base + highest_end)


def _pool_columns(pools: MemoryPools | None, is_block: np.ndarray) -> tuple[np.ndarray, I64, I64]:
    """Which allocations came from a pool, and per event the sum over the space's pools of
    each one's latest recorded size and of what a trim would give back, max(0, size - kept)."""
    if pools is None or not (pools.pool >= 0).any():
        empty = np.zeros(0, dtype=np.int64)
        return np.zeros(len(is_block), dtype=np.bool_), empty, empty
    rows = np.flatnonzero(pools.pool >= 0)
    which = pools.pool[rows]
    size = pools.size_bytes[rows]
    spare = np.maximum(0, size - pools.kept_bytes[rows])
    # Each row replaces its pool's previous figures: the change is the difference from the
    # pool's previous row (or from nothing), and the sums are the running totals of changes.
    order = np.argsort(which, kind="stable")
    first = np.ones(len(rows), dtype=np.bool_)
    first[1:] = which[order][1:] != which[order][:-1]
    totals = []
    for figure in (size, spare):
        change = np.empty(len(rows), dtype=np.int64)
        ordered = figure[order]
        change[order] = np.where(first, ordered, ordered - np.roll(ordered, 1))
        per_event = np.zeros(len(is_block), dtype=np.int64)
        per_event[rows] = change
        totals.append(np.cumsum(per_event))
    return is_block & (pools.pool >= 0), totals[0], totals[1]

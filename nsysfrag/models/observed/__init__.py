"""The ``observed`` model (docs/metrics.md): blocks where the trace says they were.

A block's footprint is its size rounded up to the granularity G; the arena runs from the
lowest allocated address B to E = max(B + C, the highest footprint end). The compiled replay
(``kernel``) gives the state after every allocation and free.
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
)
from nsysfrag.models.observed.kernel import KernelEvents, KernelOutput, assign_slots, replay
from nsysfrag.models.observed.kernel import warm_up as warm_up
from nsysfrag.models.series import (
    ALLOCATED,
    NO_BLOCK,
    FreeBlocks,
    StateSeries,
    StrandedSegment,
    from_replay,
)

if TYPE_CHECKING:
    from nsysfrag.inputs import RecordedSpace
    from nsysfrag.models.segments import SnapshotSection

MODEL_NAME = "observed"
DEFAULT_GRANULARITY = 512
# The most an arena may span: block offsets and footprint ends from B are int64. Inputs refuse
# a space whose blocks span more (nsys: ``inputs.nsys.spaces``): its addresses are damaged.
MAX_ARENA_BYTES = (1 << 63) - 1
# The kinds the model places: allocations, and frees that make memory reusable.
_PLACEABLE = np.zeros(len(KIND_NAMES), dtype=np.bool_)
_PLACEABLE[[ALLOC, FREE, FREE_COMPLETED]] = True


@dataclass(frozen=True)
class ObservedModel:
    granularity_bytes: int = DEFAULT_GRANULARITY
    name: str = MODEL_NAME

    def run(self, space: RecordedSpace) -> ObservedRun:
        """Replay the space's allocations and frees; other events (failures, segments) are
        not placed. The space's capacity must be known."""
        if space.capacity_bytes is None:
            raise ValueError("the observed model needs the space's capacity")
        events, rows = _placeable(space.events)
        kernel_events, base, end = kernel_events_of(
            events, self.granularity_bytes, space.capacity_bytes
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
        series = from_replay(
            StateSeries,
            out,
            events,  # the times, addresses and sizes of the points
            site=site_codes,
            site_names=site_names,
            held_peak=(fp, live_at_fp),
            base_address=base,
            end_address=end,
            span_mode=end > base + space.capacity_bytes,
            # A failed call is no point: it failed in the state of the last point before it.
            failure_points=np.searchsorted(rows, np.flatnonzero(space.events.kind == FAILED_ALLOC))
            - 1,
        )
        return ObservedRun(series, space.capacity_bytes, kernel_events, out)


@dataclass(frozen=True)
class ObservedRun:
    series: StateSeries
    capacity_bytes: int
    kernel_events: KernelEvents
    output: KernelOutput
    warnings: list[str] = field(default_factory=list)

    def free_blocks_after(self, point: int) -> FreeBlocks:
        """Sizes of the free blocks right after ``point``, from the blocks live then."""
        events, out = self.kernel_events, self.output
        placed = np.flatnonzero(out.event[: point + 1] == ALLOCATED)
        alive = placed[(out.removed_at[placed] > point) | (out.removed_at[placed] == NO_BLOCK)]
        starts = events.offset[alive]
        order = np.argsort(starts)
        starts, ends = starts[order], (starts + events.footprint[alive])[order]
        gaps: I64 = np.concatenate([starts, [events.arena_bytes]]) - np.concatenate([[0], ends])
        return FreeBlocks(gaps[gaps > 0])

    def stranded_after(self, point: int) -> list[StrandedSegment]:
        return []  # no segments: nothing is stranded in them

    def snapshot_section(self, peak: int, at_peak: FreeBlocks) -> SnapshotSection | None:
        return None


def _placeable(events: AllocationEvents) -> tuple[AllocationEvents, I64]:
    """The allocations and frees among ``events`` (requested frees are not free yet), and
    their indices in ``events``; views, no copies, when that is all there is."""
    placeable = _PLACEABLE[events.kind]
    if placeable.all():
        return events, np.arange(len(placeable), dtype=np.int64)
    rows = np.flatnonzero(placeable)
    kind = events.kind
    return (
        AllocationEvents(
            time_ns=events.time_ns[rows],
            kind=kind[rows],
            address=events.address[rows],
            bytes=events.bytes[rows],
            sites=events.sites,
        ),
        rows,
    )


def kernel_events_of(
    events: AllocationEvents, granularity: int, capacity: int
) -> tuple[KernelEvents, int, int]:
    """Relative offsets, footprints and slots of one space's allocations and frees; also B
    and E."""
    is_free = events.kind != ALLOC
    nbytes = events.bytes
    address = events.address
    is_block = ~is_free & (nbytes > 0)
    footprint = np.where(is_block, -(-nbytes // granularity) * granularity, 0)
    if is_block.any():
        base = int(address[is_block].min())
    else:
        # No allocation to anchor the arena: use the lowest address seen so the layout is
        # defined (every event is then an unmatched free or a zero-size allocation).
        base = int(address.min())
    # Addresses are unsigned 64-bit; offsets from B are signed, which the input made safe for
    # every block (MAX_ARENA_BYTES). A free far above every block (2**63 or more) wraps
    # negative: a free of no block, as it should be.
    above = address >= np.uint64(base)
    offset = np.where(above, (address - np.uint64(base)).astype(np.int64), -1)
    highest_end = int((offset[is_block] + footprint[is_block]).max()) if is_block.any() else 0
    arena = max(capacity, highest_end)
    slot_offset, slot = assign_slots(offset, is_block, is_free)
    kernel_events = KernelEvents(
        is_free=is_free,
        offset=offset,
        bytes=nbytes,
        footprint=footprint,
        slot=slot,
        slot_offset=slot_offset.astype(np.int64),
        arena_bytes=arena,
    )
    return kernel_events, base, base + arena

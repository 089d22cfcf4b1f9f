"""What every model produces: the state of an address space after each of its points.

A point is an event the model placed on its timeline: what it did is an outcome code below.
The observed model has one point per allocation or free; the segments model also has points for
segment events, OOMs and the blocks already live when its window opens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from nsysfrag.events import I64, U64, BoolArray

# What a point did (the ``event`` column of a series; EVENT_NAMES names them in reports).
ALLOCATED = 0
FREED = 1
UNMATCHED_FREE = 2  # a free of no live block
ZERO_SIZE_ALLOC = 3
SEGMENT_ALLOC = 4
SEGMENT_FREE = 5
SEGMENT_MAP = 6
SEGMENT_UNMAP = 7
OOM = 8  # an allocation the allocator could not serve
WINDOW_START = 9  # the state a recording's window opened on (when no block or segment says it)
EVENT_NAMES: tuple[str, ...] = (
    "alloc", "free", "unmatched_free", "zero_size_alloc",
    "segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom", "window_start",
)  # fmt: skip
NO_BLOCK = -1

IndexArray = npt.NDArray[np.signedinteger]  # int32 where every index fits, else int64


@dataclass(frozen=True)
class PoolColumns:
    """What the device holds for the space after every point, in a caching allocator's terms
    (reserved, allocated, ...): its segments (pytorch-segments), or the driver's pages
    (observed)."""

    reserved_bytes: I64
    allocated_bytes: I64  # PyTorch's allocated_bytes: active blocks whose free was not requested
    active_bytes: I64  # PyTorch's active_bytes: every block not yet free (F = reserved - active)
    releasable_bytes: I64  # R
    largest_block_bytes: I64  # L: the largest free block inside a segment (a resident page)
    capacity_bytes: int  # C

    @property
    def device_free_bytes(self) -> I64:
        """D = max(C - reserved, 0) after every point; computed when asked, one column fewer to
        hold for millions of points."""
        free: I64 = np.maximum(self.capacity_bytes - self.reserved_bytes, 0)
        return free

    def device_free_at(self, point: int) -> int:
        """D after ``point``."""
        return max(self.capacity_bytes - int(self.reserved_bytes[point]), 0)


@dataclass(frozen=True)
class StateSeries:
    """The state after every point (arrays of the point count), and what each point did."""

    time_ns: I64
    event: npt.NDArray[np.int8]  # outcome codes above
    address: U64
    bytes: I64
    # Everything free on the device, what the metrics and materiality are computed over: the
    # arena's free bytes (observed); the device's memory outside the segments plus the free
    # bytes inside them, D + F (pytorch-segments).
    free_bytes: I64
    largest_free_bytes: I64  # the largest request that fits: L; L_eff = max(L, D + R)
    free_blocks: I64  # N (pytorch-segments: the free blocks in segments, + 1 when D > 0)
    live_bytes: I64  # U: the requested bytes of the live blocks
    overlap: BoolArray  # allocations that overlapped live blocks (their frees went missing)
    out_of_order: BoolArray  # frees of a block that was not the newest live one
    # Frees that left a hole: memory that stays reserved because live blocks keep it (free
    # bytes in pages that stay resident; a free block with live blocks on both sides).
    hole: BoolArray
    freed_alloc: IndexArray  # frees: the point that allocated the freed block, or NO_BLOCK
    # Hole-creating frees: the allocations that pin the hole, on its left and on its right
    # (NO_BLOCK: none on that side).
    pin_left: IndexArray
    pin_right: IndexArray
    removed_at: IndexArray  # allocations: the point that freed or evicted the block, or NO_BLOCK
    site: I64  # allocations: a code into site_names; 0 for other points
    site_names: list[str]
    # (held, live bytes) at the first maximum of the bytes the blocks hold (footprints, or
    # allocated blocks): held - live is the rounding waste, internal fragmentation.
    held_peak: tuple[int, int]
    base_address: int  # the arena [base, end) the model laid the blocks out in
    end_address: int
    initial_blocks: int = 0  # the first points stand for blocks live before the recording
    span_mode: bool = False  # the arena is wider than the device: free space is over-stated
    # Per failed allocation of the space's events, in order: the point whose state held when it
    # failed (the last point at or before it), or NO_BLOCK when it failed before the first.
    failure_points: IndexArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    pool: PoolColumns | None = None  # reserved, allocated, ... per point
    # Per failed allocation: the allocated bytes at its own moment where the model knows them
    # (pytorch-segments: the last point also carries the frees requested after it, which came
    # after a failure at that point).
    failure_allocated_bytes: I64 | None = None
    # Frees: the bytes their hole strands (None: a hole strands the freed block's bytes).
    hole_bytes: I64 | None = None
    # The driver's page where the model maps blocks onto pages (observed): the device's free
    # memory D then counts as a free block from one page on (else from one byte).
    page_bytes: int | None = None

    def __len__(self) -> int:
        return len(self.time_ns)


Figures = TypeVar("Figures", StateSeries, PoolColumns)


def from_replay(kind: type[Figures], *replayed: object, **rest: Any) -> Figures:
    """A state series (or its pool columns) from the ``rest`` of the fields and, for each other
    field, the attribute of that name of the first of ``replayed`` that has one: a replay's
    outputs and the events it replayed name their columns (and arena, initial blocks) as the
    series does."""
    taken = {}
    for f in fields(kind):
        if f.name not in rest:
            source = next((r for r in replayed if hasattr(r, f.name)), None)
            if source is not None:
                taken[f.name] = getattr(source, f.name)
    return kind(**taken, **rest)


@dataclass(frozen=True, slots=True)
class FreeBlocks:
    """The free blocks at one moment."""

    sizes: I64
    releasable_bytes: int = 0  # of them, wholly free segments an allocator could give back


@dataclass(frozen=True, slots=True)
class StrandedSegment:
    """A segment holding stranded memory at one moment: free bytes that stay reserved because
    allocated blocks share the segment."""

    start: int
    stranded_bytes: int
    block_points: tuple[int, ...]  # the allocation points of its allocated blocks

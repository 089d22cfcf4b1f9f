"""What the ``pytorch-segments`` model replays from a PyTorch snapshot, as plain types.

A snapshot's final segments with their blocks, its history entries (as records and as
columns), the action names as event kinds, and the history's times. The snapshot reader
(``inputs/torch_snapshot``) builds these and re-exports them; they live here, beside the
model, so that the model looks down at its input's shape, never up at the reader. Not inside
``models/segments/``: importing that package loads the compiled replay, and reading an input
(or only asking whether a file is a snapshot) must not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nsysfrag import events
from nsysfrag.events import I8, I64

# Each trace action (TraceEntry::Action in CUDACachingAllocator.h) as a kind of the one event
# model; "free" is a free with nothing pending.
ACTION_KINDS = {
    "alloc": events.ALLOC,
    "free": events.FREE,
    "free_requested": events.FREE_REQUESTED,
    "free_completed": events.FREE_COMPLETED,
    "segment_alloc": events.SEGMENT_ALLOC,
    "segment_free": events.SEGMENT_FREE,
    "segment_map": events.SEGMENT_MAP,
    "segment_unmap": events.SEGMENT_UNMAP,
    "oom": events.FAILED_ALLOC,
    "snapshot": events.MARK,
}

NO_STACK = "(no stack recorded)"
NO_TIME = np.iinfo(np.int64).min  # the entry has no time_us (PyTorch before 2.1)
Frame = tuple[str, str, str]  # file, line, function: as text, whatever the pickle held


@dataclass(frozen=True, slots=True)
class Block:
    """A block of a segment in the final state (free blocks are not kept)."""

    address: int
    size: int  # bytes the block takes in its segment (rounded, or unsplit)
    requested_bytes: int  # what the program asked for
    pending_free: bool  # freed by the program, waiting on other streams' events
    site: str


@dataclass(frozen=True, slots=True)
class Segment:
    """One cudaMalloc'd segment, or one contiguous mapped range of an expandable segment."""

    device: int
    address: int
    size: int
    stream: int
    small_pool: bool | None  # None where the snapshot does not say
    expandable: bool
    blocks: tuple[Block, ...]  # allocated and pending-free blocks, by address


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One entry of a device's history, the ring buffer PyTorch records (its ``TraceEntry``)."""

    action: str
    address: int  # 0 for oom and snapshot
    size: int  # requested bytes (alloc/free_*), segment or mapped bytes, rounded request (oom)
    stream: int
    time_us: int | None  # absent before PyTorch 2.1
    site: str
    device_free: int | None = None  # oom: what cudaMemGetInfo reported free


@dataclass(frozen=True, slots=True)
class HistoryColumns:
    """One device's history, oldest first, one array element per kept entry."""

    action: I8  # the event kinds of nsysfrag.events (ACTION_KINDS)
    address: I64  # 0 for oom and snapshot
    size: I64  # requested bytes (alloc/free_*), segment or mapped bytes, rounded request (oom)
    stream: I64
    time_us: I64  # NO_TIME where the entry has none
    stack: I64  # id into SnapshotColumns.stack_site; 0: no stack recorded or not kept
    oom_rows: I64  # the entries that are OOMs
    oom_device_free: I64  # per OOM: what cudaMemGetInfo reported free, -1 if not recorded
    oom_frames: tuple[tuple[Frame, ...], ...]  # per OOM: the failed request's whole stack

    def __len__(self) -> int:
        return len(self.action)


def history_times(time_us: I64, origin_us: int) -> tuple[I64, bool]:
    """ns since ``origin_us`` per entry, never decreasing (an entry without a time takes the
    one before it, the first ones the first time there is); entry numbers when the history has
    no timestamps at all."""
    present = time_us != NO_TIME
    if not present.any():
        return np.arange(len(time_us), dtype=np.int64), False
    rel = np.where(present, time_us - origin_us, np.iinfo(np.int64).min)
    rel[0] = max(int(rel[0]), int(rel[np.argmax(present)]))
    return np.maximum.accumulate(rel) * 1000, True

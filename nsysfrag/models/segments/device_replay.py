"""What a pytorch-segments replay of one device gives: its timeline, one point per modelled
event, and the out-of-memory entries met on the way. Both replays (the Python reference in
``replay`` and the compiled one in ``compiled``) return these."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nsysfrag.events import I64, BoolArray


@dataclass(frozen=True)
class OomEvent:
    time_ns: int
    device_free_bytes: int | None
    requested_bytes: int  # rounded, as the allocator recorded it
    largest_free_bytes: int
    free_bytes: int
    reserved_bytes: int
    allocated_bytes: int  # PyTorch's: active blocks whose free was not requested
    stream: int
    site: str


@dataclass
class DeviceReplay:
    """One device's timeline in the pytorch-segments model, one point per modelled event."""

    time_ns: I64
    event: np.ndarray  # replay outcome codes, plus SEGMENT_* and OOM
    address: np.ndarray  # uint64
    bytes: I64
    free_bytes: I64
    largest_free_bytes: I64
    free_blocks: I64
    live_bytes: I64
    reserved_bytes: I64
    active_bytes: I64  # every block not yet free (PyTorch's active_bytes)
    pending_bytes: I64  # of them, freed by the program and waiting on other streams
    releasable_bytes: I64  # R (docs/metrics.md): wholly free segments, whole free expandable pages
    out_of_order: BoolArray
    hole: BoolArray
    freed_alloc: I64
    pin_left: I64
    pin_right: I64
    removed_at: I64
    overlap: BoolArray
    site: I64
    site_names: list[str]
    initial_blocks: int
    initial_reserved_bytes: int
    trace_entries: int
    timestamps: bool  # False: times are entry numbers
    conflicts: int  # the backward walk, plus frees of no live block found going forwards
    final_mismatches: int  # segments or blocks the replay's end differs from the snapshot in
    base_address: int
    end_address: int
    peak_allocated: tuple[int, int]  # (active, requested) at the first maximum of active bytes
    max_reserved_bytes: int
    max_active_bytes: int
    max_requested_bytes: int
    ooms: list[OomEvent] = field(default_factory=list)
    # Blocks live at the window's start whose inferred size an allocation showed too short:
    # address -> the size they had (the replay above already uses them).
    repairs: dict[int, int] = field(default_factory=dict)

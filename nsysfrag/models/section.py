"""The figures only a PyTorch snapshot has (reserved memory, the window, OOMs): what a
``pytorch-segments`` run adds to a space's analysis, as plain values every model's run may
name (``ModelRun.snapshot_section``) without loading the segments model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nsysfrag.models.tried_settings import Setting
    from nsysfrag.capacity import Capacity
    from nsysfrag.models.segments.device_replay import OomEvent


@dataclass(frozen=True, slots=True)
class SnapshotFacts:
    """What the snapshot says about itself."""

    layout: str  # which of the snapshot layouts the file has, in words
    allocator_conf: str | None  # PYTORCH_CUDA_ALLOC_CONF as the allocator saw it
    expandable_segments: bool
    time_origin_unix_us: int | None  # time 0 of the report


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """How the window of the snapshot's history was rebuilt."""

    trace_entries: int
    initial_blocks: int  # blocks live when the window opens
    initial_reserved_bytes: int
    timestamps: bool  # False: times are entry numbers
    conflicts: int  # entries the rebuilt layout could not fit
    final_mismatches: int  # segments or blocks the replay's end differs from the snapshot in


@dataclass(frozen=True, slots=True)
class SnapshotSection:
    """The figures only a snapshot has, in the order the JSON document lists them."""

    facts: SnapshotFacts
    capacity: Capacity  # C, where it came from and that in words
    reserved_bytes_peak: int
    allocated_bytes_peak: int  # PyTorch's allocated_bytes.all.peak (over the window)
    active_bytes_peak: int  # PyTorch's active_bytes.all.peak
    requested_bytes_peak: int
    reserved_bytes_at_frag_peak: int
    # Free blocks that are whole cudaMalloc segments: PyTorch can return them to CUDA.
    releasable_bytes_at_frag_peak: int
    reserved_bytes_final: int
    allocated_bytes_final: int
    active_bytes_final: int
    requested_bytes_final: int
    window: WindowFigures
    oom_events: tuple[OomEvent, ...]
    # The PYTORCH_CUDA_ALLOC_CONF settings `whatif` tries by default on this device (and so
    # the only ones advice may name).
    tried_settings: tuple[Setting, ...] = ()

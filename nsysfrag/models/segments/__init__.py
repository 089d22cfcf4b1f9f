"""The ``pytorch-segments`` model: caching-allocator blocks inside their segments.

``replay`` runs the model from the layout at the start of the window (``window``) through the
segments and blocks of ``layout``, with the allocator's ``rules``: the pure-Python reference.
``compiled`` runs the same model as compiled array code (``kernel``, ``kernel_layout``), event
for event the same (the property tests hold it to the reference); it is the one used, unless
``NSYSFRAG_SEGMENTS_REFERENCE=1``. This module turns a run into the one state series and the
figures only a snapshot has: reserved memory, the window, OOMs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from nsysfrag.capacity import (
    DEVICE,
    OVERRIDE,
    RESERVED_PEAK,
    Capacity,
    read_record,
    snapshot_capacity,
)
from nsysfrag.events import AllocationEvents, ProgressCallback
from nsysfrag.models.section import SnapshotFacts, SnapshotSection, WindowFigures
from nsysfrag.models.segments.compiled import CompiledDevice
from nsysfrag.models.segments.device_replay import DeviceReplay
from nsysfrag.models.segments.replay import (
    free_blocks_after,
    replay_device,
    stranded_after,
)
from nsysfrag.models.segments.rules import AllocatorSettings
from nsysfrag.models.series import (
    OOM,
    FreeBlocks,
    PoolColumns,
    StateSeries,
    StrandedSegment,
    from_replay,
)
from nsysfrag.models.snapshot_entries import Segment
from nsysfrag.models.tried_settings import (
    RunSettings,
    Setting,
    recorded_requests,
    tried_settings,
)
from nsysfrag.releases import UNLIMITED_SPLIT
from nsysfrag.units import format_bytes

if TYPE_CHECKING:
    from nsysfrag.models.space import RecordedSpace

MODEL_NAME = "pytorch-segments"
REFERENCE_ENV = "NSYSFRAG_SEGMENTS_REFERENCE"  # =1: the pure-Python replay, for comparison


@dataclass(frozen=True)
class SegmentsModel:
    """The model of one device: its segments at the snapshot and its allocator's settings."""

    final_segments: tuple[Segment, ...]
    settings: AllocatorSettings
    facts: SnapshotFacts
    name: str = MODEL_NAME
    progress: ProgressCallback | None = field(default=None, compare=False)
    device_bytes: int | None = None  # the device's memory, where recorded beside the snapshot

    def tried_settings(self, events: AllocationEvents) -> tuple[Setting, ...]:
        """What ``whatif`` tries on this device by default (``analysis.tried_settings``)."""
        s, conf = self.settings, self.facts.allocator_conf
        run = RunSettings.of(
            conf, s.expandable_segments, s.max_split_size, s.roundup_power2_divisions
        )
        live = (b.requested_bytes for seg in self.final_segments for b in seg.blocks)
        return tried_settings(run, recorded_requests(events.kind, events.bytes, live))

    def run(self, space: RecordedSpace) -> SegmentsRun:
        compiled = None
        if os.environ.get(REFERENCE_ENV, "") in ("", "0"):
            compiled = CompiledDevice(
                space.events, self.final_segments, self.settings, space.timestamps
            )
            r = compiled.replay(self.progress)
        else:
            r = replay_device(space.events, self.final_segments, self.settings, space.timestamps)
        warnings: list[str] = []
        if len(r.time_ns) == 0:
            empty = Capacity(0, RESERVED_PEAK, "")
            return SegmentsRun(self, space, r, _series(r, 0), empty, warnings, compiled)
        capacity = _capacity(r, space, self.device_bytes, warnings, self.settings)
        series = _series(r, capacity.bytes)
        device = space.device
        if r.conflicts:
            warnings.append(
                f"device {device}: {r.conflicts} trace entr{'y' if r.conflicts == 1 else 'ies'}"
                " did not fit the layout rebuilt from the final segments (the snapshot is"
                " inconsistent or edited); the layout there is approximate"
            )
        elif r.final_mismatches:
            warnings.append(
                f"device {device}: the replay ends {r.final_mismatches} segment(s) or block(s)"
                " away from the snapshot's final state; the layout is approximate"
            )
        if not r.timestamps and r.trace_entries:
            warnings.append(
                f"device {device}: the trace has no timestamps (PyTorch before 2.1), so times"
                " are entry numbers, 1 ns apart, and growth_per_s is 0"
            )
        return SegmentsRun(self, space, r, series, capacity, warnings, compiled)


@dataclass(frozen=True)
class SegmentsRun:
    model: SegmentsModel
    space: RecordedSpace
    replay: DeviceReplay
    series: StateSeries
    capacity: Capacity
    warnings: list[str]
    compiled: CompiledDevice | None = None  # the kernels' inputs, when the run was compiled

    @property
    def capacity_bytes(self) -> int:
        return self.capacity.bytes

    @property
    def capacity_source(self) -> str:
        return self.capacity.source

    def free_blocks_after(self, point: int) -> FreeBlocks:
        """The free blocks inside segments right after ``point``, and the device's free memory
        outside them as one more block (the model's free blocks)."""
        if self.compiled is not None:
            inside = self.compiled.free_blocks_at(point)
        else:
            m = self.model
            inside = free_blocks_after(
                self.space.events, m.final_segments, m.settings, point, self.replay.repairs
            )
        pool = self.series.pool
        device_free = pool.device_free_at(point) if pool is not None else 0
        if device_free <= 0:
            return inside
        sizes = np.append(inside.sizes, np.int64(device_free))
        return FreeBlocks(sizes, inside.releasable_bytes)

    def stranded_after(self, point: int) -> list[StrandedSegment]:
        if self.compiled is not None:
            return self.compiled.stranded_at(point)
        m = self.model
        return stranded_after(
            self.space.events, m.final_segments, m.settings, point, self.replay.repairs
        )

    def snapshot_section(self, peak: int, at_peak: FreeBlocks) -> SnapshotSection:
        r = self.replay
        return SnapshotSection(
            facts=self.model.facts,
            capacity=self.capacity,
            reserved_bytes_peak=r.max_reserved_bytes,
            allocated_bytes_peak=int((r.active_bytes - r.pending_bytes).max()),
            active_bytes_peak=r.max_active_bytes,
            requested_bytes_peak=r.max_requested_bytes,
            reserved_bytes_at_frag_peak=int(r.reserved_bytes[peak]),
            releasable_bytes_at_frag_peak=int(r.releasable_bytes[peak]),
            reserved_bytes_final=int(r.reserved_bytes[-1]),
            allocated_bytes_final=int(r.active_bytes[-1] - r.pending_bytes[-1]),
            active_bytes_final=int(r.active_bytes[-1]),
            requested_bytes_final=int(r.live_bytes[-1]),
            window=WindowFigures(
                trace_entries=r.trace_entries,
                initial_blocks=r.initial_blocks,
                initial_reserved_bytes=r.initial_reserved_bytes,
                timestamps=r.timestamps,
                conflicts=r.conflicts,
                final_mismatches=r.final_mismatches,
            ),
            oom_events=tuple(r.ooms),
            tried_settings=self.model.tried_settings(self.space.events),
        )


def _series(r: DeviceReplay, capacity: int) -> StateSeries:
    """The replay's state in the model's terms: free memory is everything free on the device,
    ``D + F`` with ``D`` the device's memory outside the segments, and the largest free block
    the largest request that succeeds without new memory, ``L_eff = max(L, D + R)`` (the
    allocator can release whole free segments and map a new one anywhere)."""
    device_free = np.maximum(capacity - r.reserved_bytes, 0)
    return from_replay(
        StateSeries,
        r,
        free_bytes=device_free + r.free_bytes,
        largest_free_bytes=np.maximum(r.largest_free_bytes, device_free + r.releasable_bytes),
        free_blocks=r.free_blocks + (device_free > 0),
        pool=from_replay(
            PoolColumns,
            r,
            allocated_bytes=r.active_bytes - r.pending_bytes,
            capacity_bytes=capacity,
            largest_block_bytes=r.largest_free_bytes,
        ),
        held_peak=r.peak_allocated,
        failure_points=np.flatnonzero(r.event == OOM),  # an oom is a point of its own
        failure_allocated_bytes=np.asarray([o.allocated_bytes for o in r.ooms], dtype=np.int64),
    )


def _capacity(
    r: DeviceReplay, space: RecordedSpace, device_bytes: int | None, warnings: list[str],
    settings: AllocatorSettings | None = None,
) -> Capacity:  # fmt: skip
    """C from the device's record (nsysfrag.capacity: what every command rates it against)."""
    events = space.events
    record = read_record(
        events.kind, events.bytes, events.device_free_bytes, r.initial_reserved_bytes,
        events.stream, events.address,
        (settings.max_split_size if settings else None) or UNLIMITED_SPLIT,
        any(settings.roundup_power2_divisions.values()) if settings else True,
    )  # fmt: skip
    capacity = snapshot_capacity(record, space.capacity_bytes, device_bytes)
    device = space.device
    if capacity.source == OVERRIDE and r.max_reserved_bytes > capacity.bytes:
        warnings.append(
            f"device {device}: the snapshot reserved up to {format_bytes(r.max_reserved_bytes)},"
            f" more than --capacity {format_bytes(capacity.bytes)}; global_frag can exceed 1"
        )
    elif capacity.source == DEVICE and r.max_reserved_bytes > capacity.bytes:
        warnings.append(
            f"device {device}: the snapshot reserved up to {format_bytes(r.max_reserved_bytes)},"
            f" more than the {format_bytes(capacity.bytes)} its device facts give; global_frag"
            " can exceed 1 (are the facts of another device?)"
        )
    elif capacity.assumed:
        warnings.append(
            f"device {device}: the snapshot does not say how much memory the device has (no"
            " out-of-memory entry, no OOM retry), so its capacity is taken to be the peak"
            f" reserved memory, {format_bytes(capacity.bytes)}: the rating assumes the device"
            " was full at the peak, so its fragmentation figures are upper bounds; pass"
            " --capacity (e.g. --capacity 80GiB) to rate the snapshot against the real device"
        )
    return capacity

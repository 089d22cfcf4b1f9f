"""What a snapshot's record says about each device: its history, the layout at the start of
its window, and its record of reserved memory (:mod:`nsysfrag.capacity` reads from it the
capacity every command uses, and which releases of memory the program asked for).

A replay of the recorded run itself (validation, and which releases were the program's) runs on
the device the record implies, whatever ``--capacity`` says: the recorded run ran there.
"""

from __future__ import annotations

from dataclasses import dataclass

from nsysfrag.allocators.base import UNLIMITED
from nsysfrag.capacity import OVERRIDE, Capacity, Record, recorded_capacity, snapshot_capacity
from nsysfrag.capacity import read_record as capacity_record
from nsysfrag.inputs import check_space_count
from nsysfrag.inputs.torch_snapshot.columns import EMPTY_HISTORY, HistoryColumns, SnapshotColumns
from nsysfrag.inputs.torch_snapshot.reader import segments_by_device
from nsysfrag.inputs.torch_snapshot.spaces import columns_events
from nsysfrag.models.segments.compiled import WindowLayout, window_start
from nsysfrag.models.segments.rules import AllocatorSettings
from nsysfrag.releases import UNLIMITED_SPLIT

__all__ = ["Record", "RecordedDevice", "recorded_devices", "replay_capacity"]


@dataclass(frozen=True)
class RecordedDevice:
    """What one device of a snapshot recorded: its history, the layout at the start of the
    history's window (rebuilt backwards from the final segments), and its reserved memory."""

    device: int
    history: HistoryColumns
    window: WindowLayout
    record: Record

    @property
    def traced(self) -> bool:
        return len(self.history) > 0

    def capacity(self, override: int | None, device_bytes: int | None = None) -> Capacity:
        """The device the policies replay on: the capacity ``analyze`` rates it against
        (``device_bytes``: its total memory, where a record wrote it beside the snapshot)."""
        return snapshot_capacity(self.record, override, device_bytes)


def recorded_devices(columns: SnapshotColumns) -> list[RecordedDevice]:
    """Every device of the snapshot, ascending."""
    settings = AllocatorSettings(
        columns.roundup_power2_divisions, columns.max_split_size, columns.expandable_segments
    )
    out = []
    devices = columns.devices()
    check_space_count(columns.path, len(devices), "CUDA devices")
    by_device = segments_by_device(columns.segments)
    for device in devices:
        history = columns.histories.get(device, EMPTY_HISTORY)
        final = by_device.get(device, [])
        events = columns_events(columns, device)[0]
        window = window_start(events, final, settings)
        initial = int((window.segment_end - window.segment_start).sum())
        record = capacity_record(
            events.kind, events.bytes, events.device_free_bytes, initial, events.stream,
            events.address, settings.max_split_size or UNLIMITED_SPLIT,
            any(settings.roundup_power2_divisions.values()),
        )  # fmt: skip
        out.append(RecordedDevice(device, history, window, record))
    return out


def replay_capacity(capacity: int | None, record: Record) -> tuple[int, str]:
    """The device a replay of the recorded run itself uses (validation, and which releases
    were the program's): what the record implies; else --capacity; else unlimited (the run
    never met a limit)."""
    implied = recorded_capacity(record)
    if implied is not None:
        return implied.bytes, implied.basis
    if capacity is not None:
        return capacity, OVERRIDE
    return UNLIMITED, "unlimited: the recorded run never met the device's limit"

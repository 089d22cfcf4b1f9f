"""A space as a model sees it (:class:`RecordedSpace`: its events and the model chosen for
it) and the two protocols every model keeps: :class:`Model` runs a space, :class:`ModelRun`
is what the analysis reads of the run. Inputs build spaces; models run them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from nsysfrag.events import AllocationEvents
from nsysfrag.models.series import FreeBlocks, StateSeries, StrandedSegment

if TYPE_CHECKING:
    from nsysfrag.models.section import SnapshotSection


@dataclass(frozen=True)
class RecordedSpace:
    """One address space, as the input recorded it."""

    pid: int
    device: int
    device_name: str
    process_name: str | None
    events: AllocationEvents
    model: Model
    capacity_bytes: int | None  # None: the model estimates it from the events
    # Where capacity_bytes came from (nsysfrag.capacity.SOURCES): "--capacity", or the device's
    # own figure; a model that estimates C says where its estimate came from itself.
    capacity_source: str = "device"
    other_kind_events: int = 0  # events of memory the model does not place (pinned, managed)
    timestamps: bool = True  # False: the events' times are entry numbers, 1 ns apart


class ModelRun(Protocol):
    """One space replayed by one model."""

    @property
    def series(self) -> StateSeries: ...

    @property
    def capacity_bytes(self) -> int:
        """C: the device memory the fragmentation ratios are shares of."""
        ...

    @property
    def warnings(self) -> list[str]:
        """What the reader of this space's figures should know, in order."""
        ...

    def free_blocks_after(self, point: int) -> FreeBlocks:
        """The free blocks right after ``point``."""
        ...

    def stranded_after(self, point: int) -> list[StrandedSegment]:
        """The segments holding stranded memory right after ``point`` (none without segments)."""
        ...

    def snapshot_section(self, peak: int, at_peak: FreeBlocks) -> SnapshotSection | None:
        """The figures only a snapshot has, given the fragmentation peak; None for others."""
        ...


class Model(Protocol):
    @property
    def name(self) -> str: ...

    def run(self, space: RecordedSpace) -> ModelRun: ...

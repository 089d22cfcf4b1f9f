"""The models: how blocks are placed in an address space, and its state after every point.

An input chooses the model of each of its spaces (``RecordedSpace.model``); running it gives a
:class:`ModelRun`, whose :class:`~nsysfrag.models.series.StateSeries` is the one type every
analysis reads. ``observed`` places blocks where the trace says they were; ``pytorch-segments``
places PyTorch's blocks inside the caching allocator's segments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from nsysfrag.models.series import FreeBlocks, StateSeries, StrandedSegment

if TYPE_CHECKING:
    from nsysfrag.inputs import RecordedSpace
    from nsysfrag.models.segments import SnapshotSection


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

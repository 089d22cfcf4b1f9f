"""The models: how blocks are placed in an address space, and its state after every point.

An input chooses the model of each of its spaces (``RecordedSpace.model``); running it gives a
:class:`ModelRun`, whose :class:`~nsysfrag.models.series.StateSeries` is the one type every
analysis reads. ``observed`` places blocks where the trace says they were; ``pytorch-segments``
places PyTorch's blocks inside the caching allocator's segments.
"""

from __future__ import annotations

from nsysfrag.models.space import Model, ModelRun, RecordedSpace

__all__ = ["Model", "ModelRun", "RecordedSpace"]

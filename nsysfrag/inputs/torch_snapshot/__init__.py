"""PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``): ``unpickle`` loads the
pickle without importing anything, ``reader`` checks it and reads it into typed records,
``columns`` (with ``stacks``) reads the same entries into columns, ``limits`` refuses memo
bombs, ``spaces`` turns a snapshot into one space per device."""

from __future__ import annotations

from pathlib import Path

from nsysfrag.inputs import InputFormat, InputOptions, Recording
from nsysfrag.inputs.torch_snapshot.reader import is_snapshot


def open_snapshot(path: Path, options: InputOptions) -> Recording:
    """The snapshot read into columns (``columns``), one space per device (``spaces``)."""
    from nsysfrag.inputs.torch_snapshot.columns import read_snapshot_columns
    from nsysfrag.inputs.torch_snapshot.spaces import recording_of

    return recording_of(read_snapshot_columns(path, options.progress), options)


TORCH_SNAPSHOT = InputFormat(
    name="torch-snapshot",
    description="a PyTorch memory snapshot",
    matches=is_snapshot,
    open=open_snapshot,
)

"""PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``): ``reader`` reads the
pickle into typed records, ``spaces`` turns them into one space per device."""

from __future__ import annotations

from pathlib import Path

from nsysfrag.inputs import InputFormat, InputOptions, Recording
from nsysfrag.inputs.torch_snapshot.reader import is_snapshot, read_snapshot


def open_snapshot(path: Path, options: InputOptions) -> Recording:
    from nsysfrag.inputs.torch_snapshot.spaces import recording_of

    return recording_of(read_snapshot(path), options)


TORCH_SNAPSHOT = InputFormat(
    name="torch-snapshot",
    description="a PyTorch memory snapshot",
    matches=is_snapshot,
    open=open_snapshot,
)

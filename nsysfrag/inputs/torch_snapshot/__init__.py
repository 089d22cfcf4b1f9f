"""PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``): ``unpickle`` loads the
pickle without importing anything, ``reader`` checks it and reads it into typed records,
``columns`` (with ``stacks``) reads the same entries into columns, ``limits`` refuses memo
bombs, ``spaces`` turns a snapshot into one space per device."""

from __future__ import annotations

from pathlib import Path

from nsysfrag.inputs.recording import InputFormat, InputOptions, Recording
from nsysfrag.inputs.torch_snapshot.reader import is_snapshot


def open_snapshot(path: Path, options: InputOptions) -> Recording:
    """The snapshot read into columns (``columns``), one space per device (``spaces``)."""
    from nsysfrag.inputs.torch_snapshot.columns import read_snapshot_columns
    from nsysfrag.inputs.torch_snapshot.spaces import recording_of
    from nsysfrag.inputs.torch_snapshot.facts import facts_beside

    # A snapshot of `nsysfrag record` has its devices' sizes beside it (X.device.json).
    warnings: list[str] = []
    facts = facts_beside(path, warnings)
    recording = recording_of(
        read_snapshot_columns(path, options.progress),
        options,
        device_bytes=facts.total_memory if facts is not None else None,
    )
    recording.warnings.extend(warnings)
    return recording


TORCH_SNAPSHOT = InputFormat(
    name="torch-snapshot",
    description="a PyTorch memory snapshot",
    matches=is_snapshot,
    open=open_snapshot,
)

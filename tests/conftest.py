from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from nsysfrag.testing.nsys_export import (
    ApiRow,
    ExportOptions,
    Gpu,
    MemoryRow,
    NvtxRow,
    write_export,
)

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"
REAL_TRACES = REPO.parent / "shared" / "real_traces"

MiB = 1 << 20
BASE = 0x7F00_0000_0000


MakeTrace = Callable[..., Path]


@pytest.fixture
def make_trace(tmp_path: Path) -> MakeTrace:
    """Build an nsys-shaped SQLite export from rows; returns its path."""
    counter = iter(range(10_000))

    def build(
        memory: Sequence[MemoryRow],
        api: Sequence[ApiRow] = (),
        nvtx: Sequence[NvtxRow] = (),
        gpus: Sequence[Gpu] = (Gpu(0, total_memory=64 * MiB),),
        options: ExportOptions | None = None,
    ) -> Path:
        return write_export(tmp_path / f"trace{next(counter)}.sqlite", memory, api, nvtx, gpus, options)

    return build

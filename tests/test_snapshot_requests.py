"""The request stream from the columns is, array for array, what whatif builds from records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nsysfrag.inputs.torch_snapshot.columns import read_snapshot_columns
from nsysfrag.models.segments.requests import snapshot_requests
from nsysfrag.whatif import snapshot_sources
from tests.conftest import REPO, SAMPLES

REAL_SNAPSHOTS = REPO.parent / "shared" / "real_snapshots"
INPUTS = sorted(SAMPLES.glob("*.pickle")) + (
    sorted(p for p in REAL_SNAPSHOTS.glob("*") if p.suffix in (".pickle", ".pkl"))
    if REAL_SNAPSHOTS.is_dir()
    else []
)


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name[:50])
def test_requests_from_columns_are_whatifs_request_streams(path: Path) -> None:
    sources, _, _ = snapshot_sources(path, None)
    columns = read_snapshot_columns(path)
    by_device = {s.device: s for s in sources}
    for device in columns.devices():
        got = snapshot_requests(columns, device)
        if device not in by_device:
            assert len(got.kind) == 0
            continue
        want = by_device[device].stream
        assert np.array_equal(got.kind, want.kind)
        assert np.array_equal(got.request, want.request)
        assert np.array_equal(got.time_ns, want.time_ns)
        assert np.array_equal(got.size, want.size)
        assert np.array_equal(got.stream, want.stream)
        names = tuple("default" if v == 0 else hex(v) for v in got.stream_values.tolist())
        assert names == want.stream_names
        warned = [w for w in by_device[device].warnings if "free(s) of blocks" in w]
        assert warned == (
            [f"{got.unmatched_frees} free(s) of blocks the snapshot never shows were skipped"]
            if got.unmatched_frees
            else []
        )
        assert by_device[device].timestamps == got.timestamps
        want_peak = by_device[device].recorded_peak_reserved_bytes
        initial = int((got.window.segment_end - got.window.segment_start).sum())
        assert want_peak == max([initial, *got.recorded_reserved.tolist()])

"""The request stream from the columns is, array for array, what whatif builds from records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nsysfrag.allocators import TorchConfig
from nsysfrag.inputs.torch_snapshot.columns import read_snapshot_columns
from nsysfrag.inputs.torch_snapshot.reader import read_snapshot
from nsysfrag.models.segments.requests import snapshot_requests
from nsysfrag.whatif.capacity import read_record, replay_capacity
from nsysfrag.whatif.streams import snapshot_streams
from tests.conftest import REPO, SAMPLES

REAL_SNAPSHOTS = REPO.parent / "shared" / "real_snapshots"
INPUTS = sorted(SAMPLES.glob("*.pickle")) + (
    sorted(p for p in REAL_SNAPSHOTS.glob("*") if p.suffix in (".pickle", ".pkl"))
    if REAL_SNAPSHOTS.is_dir()
    else []
)


def _empty_cache_calls(path: Path, device: int, initial_reserved: int) -> list[int]:
    """Where whatif says the program called empty_cache() (from its own record reading)."""
    snap = read_snapshot(path)
    config = TorchConfig.from_settings(
        snap.max_split_size, snap.roundup_power2_divisions, snap.expandable_segments,
        snap.allocator_conf,
    )  # fmt: skip
    record = read_record(snap.histories.get(device, []), initial_reserved)
    capacity, _ = replay_capacity(None, record)
    return record.program_releases(capacity, config.garbage_collection_threshold)


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name[:50])
def test_requests_from_columns_are_whatifs_request_streams(path: Path) -> None:
    sources, _, _ = snapshot_streams(path, None)
    columns = read_snapshot_columns(path)
    by_device = {s.device: s for s in sources}
    for device in columns.devices():
        plain = snapshot_requests(columns, device)
        initial = int((plain.window.segment_end - plain.window.segment_start).sum())
        got = snapshot_requests(columns, device, _empty_cache_calls(path, device, initial))
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
        expected = f"{got.unmatched_frees} free(s) of blocks the snapshot never shows were skipped"
        assert warned == ([expected] if got.unmatched_frees else [])
        assert by_device[device].timestamps == got.timestamps
        assert by_device[device].recorded_peak_reserved_bytes == max(
            [initial, *got.recorded_reserved.tolist()]
        )

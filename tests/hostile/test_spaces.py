"""Inputs that name more address spaces than any run has (issue 25, item 4).

Every space is replayed, analyzed and reported on its own, so a small file naming 20,000 CUDA
devices or 100,000 processes would run for minutes: past ``NSYSFRAG_MAX_SPACES`` (256) an input
is refused in one line, at once; within it, a snapshot's segments are grouped by device in
one pass (they were filtered once per device: quadratic).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from nsysfrag.testing.nsys_export import Gpu, MemoryRow, write_export
from tests.conftest import BASE, MiB
from tests.hostile.contract import run_nsysfrag


def _devices_snapshot(path: Path, devices: int) -> Path:
    """One free 2 MiB segment on each of ``devices`` CUDA devices, no trace."""
    block = {"address": BASE, "size": 2 * MiB, "requested_size": 0, "state": "inactive",
             "frames": []}  # fmt: skip
    segments = [{"device": d, "address": BASE, "total_size": 2 * MiB, "stream": 0,
                 "segment_type": "large", "blocks": [block]} for d in range(devices)]  # fmt: skip
    path.write_bytes(pickle.dumps({"segments": segments, "device_traces": []}, protocol=4))
    return path


def _processes_export(path: Path, processes: int) -> Path:
    rows = (MemoryRow(10 + i, 1000 + i, 0, BASE, MiB) for i in range(processes))
    return write_export(path, rows, [], [], [Gpu(0, total_memory=64 * MiB)])


@pytest.mark.parametrize("command", ["analyze", "whatif"])
def test_a_snapshot_of_20000_devices_is_refused_at_once(tmp_path: Path, command: str) -> None:
    # main: 28.5 s for analyze -q (35 s in the issue), whatif 50 s, --html past 60 s
    path = _devices_snapshot(tmp_path / "devices.pickle", 20_000)
    assert path.stat().st_size < 2 << 20
    out = run_nsysfrag([command, path, "-q", "--capacity", "64MiB"], inputs=[path])
    assert out.returncode == 2
    assert "20,000 address spaces (CUDA devices), more than the 256" in out.stderr
    assert "NSYSFRAG_MAX_SPACES=20000" in out.stderr


def test_an_export_of_100000_processes_is_refused_at_once(tmp_path: Path) -> None:
    # main: still running at 100 s
    path = _processes_export(tmp_path / "processes.sqlite", 100_000)
    out = run_nsysfrag(["analyze", path, "-q"], inputs=[path])
    assert out.returncode == 2 and "100,000 address spaces (processes × devices)" in out.stderr


def test_the_bound_can_be_raised_and_holds_within_it(tmp_path: Path) -> None:
    path = _devices_snapshot(tmp_path / "devices.pickle", 300)
    refused = run_nsysfrag(["analyze", path, "-q", "--capacity", "64MiB"], inputs=[path])
    assert refused.returncode == 2 and "300 address spaces" in refused.stderr
    out = run_nsysfrag(["analyze", path, "--json", "-", "--capacity", "64MiB"], inputs=[path],
                       env={"NSYSFRAG_MAX_SPACES": "300"})  # fmt: skip
    spaces = json.loads(out.stdout)["spaces"]
    assert [s["device"] for s in spaces] == list(range(300))
    bad = run_nsysfrag(["analyze", path, "-q"], inputs=[path], env={"NSYSFRAG_MAX_SPACES": "many"})
    assert bad.returncode == 2 and "NSYSFRAG_MAX_SPACES" in bad.stderr


def test_each_device_gets_its_own_segments(tmp_path: Path) -> None:
    from nsysfrag.inputs import InputOptions
    from nsysfrag.inputs.torch_snapshot.columns import read_snapshot_columns
    from nsysfrag.inputs.torch_snapshot.spaces import recording_of

    path = _devices_snapshot(tmp_path / "devices.pickle", 5)
    recording = recording_of(read_snapshot_columns(path), InputOptions(capacity_bytes=64 * MiB))
    assert [s.device for s in recording.spaces] == [0, 1, 2, 3, 4]
    assert [[seg.device for seg in s.model.final_segments] for s in recording.spaces] == [  # type: ignore[attr-defined]
        [0], [1], [2], [3], [4]
    ]

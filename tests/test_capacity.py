"""One capacity: every command rates an input against the same C, from the same evidence.

The estimator (``nsysfrag.capacity``) takes, in order, --capacity, the device's memory where it
was recorded beside the snapshot, the oom entries, the allocator's OOM retries, else the peak
reserved (an assumption). ``analyze`` and ``whatif`` must report the same C and source for
every device of every snapshot.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from nsysfrag.capacity import (
    DEVICE,
    OOM,
    OOM_RETRIES,
    OVERRIDE,
    RESERVED_PEAK,
    read_record,
    snapshot_capacity,
)
from nsysfrag.cli import cli
from nsysfrag.events import ALLOC, FAILED_ALLOC, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE
from nsysfrag.whatif import whatif
from tests.conftest import SNAPSHOT_INPUTS

MiB = 1 << 20
GiB = 1 << 30


def record(entries: list[tuple[int, int, int]], initial: int = 0):  # type: ignore[no-untyped-def]
    """(kind, size, device free or -1) per entry."""
    kind = np.array([k for k, _, _ in entries], dtype=np.int8)
    size = np.array([s for _, s, _ in entries], dtype=np.int64)
    free = np.array([f for _, _, f in entries], dtype=np.int64)
    return read_record(kind, size, free, initial)


# A malloc's OOM retry: 800 MiB reserved, 600 MiB of cached segments released, then a 500 MiB
# segment: the device refused 800 + 500 MiB, and the run held 800 MiB at most.
RETRY = [
    (SEGMENT_ALLOC, 200 * MiB, -1), (SEGMENT_ALLOC, 300 * MiB, -1),
    (SEGMENT_ALLOC, 300 * MiB, -1), (SEGMENT_FREE, 300 * MiB, -1), (SEGMENT_FREE, 300 * MiB, -1),
    (SEGMENT_ALLOC, 500 * MiB, -1), (ALLOC, 500 * MiB, -1),
]  # fmt: skip
OOM_ENTRY = [(SEGMENT_ALLOC, 1 * GiB, -1), (ALLOC, 1 * GiB, -1), (FAILED_ALLOC, 2 * GiB, 3 * GiB)]


def test_evidence_is_taken_in_order() -> None:
    both = record(RETRY + OOM_ENTRY)
    assert snapshot_capacity(both, 40 * GiB).source == OVERRIDE
    assert snapshot_capacity(both, 40 * GiB).bytes == 40 * GiB
    # The device's memory recorded beside the snapshot beats the retries, but not an oom entry
    # that shows less was reachable (reserved + the device's free memory then): other
    # processes, NCCL and the CUDA context held the rest.
    noted = snapshot_capacity(both, device_bytes=141 * GiB)
    assert (noted.bytes, noted.source) == (1724 * MiB + 3 * GiB, OOM)
    noted = snapshot_capacity(both, device_bytes=4 * GiB)
    assert (noted.bytes, noted.source) == (4 * GiB, DEVICE)
    noted = snapshot_capacity(record(RETRY), device_bytes=141 * GiB)
    assert (noted.bytes, noted.source) == (141 * GiB, DEVICE)
    assert snapshot_capacity(both, 40 * GiB, device_bytes=141 * GiB).source == OVERRIDE
    # An oom entry beats the retries: reserved (200 + 500 MiB + 1 GiB) + 3 GiB free then.
    c = snapshot_capacity(both)
    assert (c.bytes, c.source) == (1724 * MiB + 3 * GiB, OOM)
    # The retry: just below what the device refused.
    c = snapshot_capacity(record(RETRY))
    assert (c.bytes, c.source) == (1298 * MiB, OOM_RETRIES)
    # Nothing: the peak reserved, an assumption that says so.
    c = snapshot_capacity(record([(SEGMENT_ALLOC, 20 * MiB, -1), (ALLOC, MiB, -1)]))
    assert (c.bytes, c.source, c.assumed) == (20 * MiB, RESERVED_PEAK, True)
    assert c.basis.startswith("assumed") and "--capacity" in c.basis


def test_oom_capacity_is_the_most_any_oom_entry_offered_and_at_least_the_peak() -> None:
    two = record([
        (SEGMENT_ALLOC, 4 * GiB, -1), (FAILED_ALLOC, GiB, 1 * GiB),
        (SEGMENT_FREE, 4 * GiB, -1), (FAILED_ALLOC, GiB, 2 * GiB),
    ])  # fmt: skip
    assert snapshot_capacity(two).bytes == 5 * GiB  # 4 + 1 beats 0 + 2
    short = record([(SEGMENT_ALLOC, 4 * GiB, -1), (SEGMENT_FREE, 4 * GiB, -1), (FAILED_ALLOC, GiB, GiB)])
    assert snapshot_capacity(short).bytes == 4 * GiB  # the run held 4 GiB: C is at least that


def test_a_release_that_no_new_segment_follows_at_once_is_no_retry() -> None:
    # empty_cache(), then other work, then a new segment: the device refused nothing.
    r = record([
        (SEGMENT_ALLOC, GiB, -1), (ALLOC, GiB, -1), (FREE_COMPLETED, GiB, -1),
        (SEGMENT_FREE, GiB, -1), (FREE_COMPLETED, MiB, -1), (SEGMENT_ALLOC, 100 * MiB, -1),
        (ALLOC, 100 * MiB, -1),
    ])  # fmt: skip
    assert snapshot_capacity(r).source == RESERVED_PEAK
    # The same release with the new segment right after it is what a malloc's retry records.
    retried = record([
        (SEGMENT_ALLOC, GiB, -1), (ALLOC, GiB, -1), (FREE_COMPLETED, GiB, -1),
        (SEGMENT_FREE, GiB, -1), (SEGMENT_ALLOC, 100 * MiB, -1), (ALLOC, 100 * MiB, -1),
    ])  # fmt: skip
    assert snapshot_capacity(retried).source == OOM_RETRIES


def _analyze(path: Path, *extra: str) -> dict[int, tuple[int, str]]:
    result = CliRunner().invoke(cli, ["analyze", str(path), "--json", "-", *extra])
    assert result.exit_code == 0, result.output
    return {s["device"]: (s["capacity_bytes"], s["capacity_source"])
            for s in json.loads(result.stdout)["spaces"]}  # fmt: skip


@pytest.mark.parametrize("path", SNAPSHOT_INPUTS, ids=lambda p: p.name[:50])
def test_analyze_and_whatif_rate_every_device_against_the_same_capacity(path: Path) -> None:
    rated = _analyze(path)
    report = whatif(path, ["best-fit"])  # one cheap policy: the capacity does not depend on it
    replayed = {s.device: (s.capacity_bytes, s.capacity_source) for s in report.spaces}
    assert replayed, path.name
    for device, figures in replayed.items():
        assert rated[device] == figures, (path.name, device)
    # Every device's JSON says where C came from; an assumed C says so in words too.
    assert {source for _, source in rated.values()} <= {OOM, OOM_RETRIES, RESERVED_PEAK}


def test_with_capacity_both_commands_take_it(tmp_path: Path) -> None:
    path = next(p for p in SNAPSHOT_INPUTS if p.name == "pressure_snapshot.pickle")
    assert set(_analyze(path, "--capacity", "12GiB").values()) == {(12 * GiB, OVERRIDE)}
    report = whatif(path, ["best-fit"], capacity=12 * GiB)
    assert {(s.capacity_bytes, s.capacity_source) for s in report.spaces} == {(12 * GiB, OVERRIDE)}


def test_an_assumed_capacity_is_stated_in_every_report(tmp_path: Path) -> None:
    path = next(p for p in SNAPSHOT_INPUTS if p.name == "training_snapshot.pickle")
    runner = CliRunner()
    terminal = runner.invoke(cli, ["analyze", str(path)], env={"COLUMNS": "100"})
    assert "assumed: the peak reserved; pass --capacity" in terminal.stdout
    html = tmp_path / "r.html"
    assert runner.invoke(cli, ["analyze", str(path), "--html", str(html)]).exit_code == 0
    assert "assumed: the peak reserved; pass --capacity" in html.read_text()
    doc = json.loads(runner.invoke(cli, ["analyze", str(path), "--json", "-"]).stdout)
    (space,) = doc["spaces"]
    assert space["capacity_source"] == RESERVED_PEAK and space["capacity_basis"].startswith("assumed")
    report = runner.invoke(cli, ["whatif", str(path), "--policy", "best-fit"], env={"COLUMNS": "100"})
    assert "assumed: the peak reserved memory" in " ".join(report.stdout.split())

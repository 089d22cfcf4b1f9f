"""The reports tell each failed allocation with the state at its own moment (docs/metrics.md,
"Failed allocations"), never with the peak's; built on the hand-made cases of
tests/spec_reference/cases.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from nsysfrag.cli import cli
from nsysfrag.models.segments import REFERENCE_ENV
from tests.spec_reference.cases import PID, SEG, MiB, _Snapshot, failures_at_their_moment


def _analyze(path: Path, *args: str) -> dict[tuple[int, int], dict[str, Any]]:
    result = CliRunner().invoke(cli, ["analyze", str(path), "--json", "-", *args])
    assert result.exit_code == 0, result.output
    return {(s["pid"], s["device"]): s for s in json.loads(result.stdout)["spaces"]}


def test_nsys_failures_are_told_with_their_own_state(tmp_path: Path) -> None:
    """GIVEN two failed cudaMalloc calls on device 0, the first before any event (64 MiB free)
    and the second after three 8 MiB allocations, and later 48 MiB of free pages
    WHEN the trace is analyzed
    THEN the advice counts both failures, describes the first with the empty device, says the
    size is unknown, and never quotes the peak's free memory."""
    case = failures_at_their_moment(tmp_path)
    advice = _analyze(case.path)[(PID, 0)]["advice"]
    assert isinstance(advice, list)
    text = " ".join(advice)
    assert "2 allocations failed." in text
    assert "0.000000 s with 64.00 MiB of free pages on the device and 0 B stranded" in text
    assert "records no size" in text and "unknown" in text
    assert "48.00 MiB" not in text


def _three_segments(tmp: Path, request: int) -> Path:
    """Three 20 MiB segments: site a's 8 MiB block beside 12 MiB free; site b's 16 MiB block
    beside 4 MiB free; a 4 MiB block of each beside 12 MiB free; then an oom for ``request``
    with 2 MiB of device memory free."""
    snap = _Snapshot()
    a = [{"filename": "/home/u/proj/a.py", "line": 10, "name": "f"}]
    b = [{"filename": "/home/u/proj/b.py", "line": 20, "name": "g"}]
    s1, s2, s3 = SEG, SEG + 20 * MiB, SEG + 40 * MiB
    layout = {s1: [(8, a)], s2: [(16, b)], s3: [(4, a), (4, b)]}
    for start, blocks in layout.items():
        snap.entry(0, "segment_alloc", start, 20 * MiB)
        at = start
        for mib, frames in blocks:
            snap.entry(0, "alloc", at, mib * MiB)
            snap.traces[0][-1]["frames"] = frames
            at += mib * MiB
    snap.entry(0, "oom", 2 * MiB, request)
    for start, blocks in layout.items():
        used = sum(mib for mib, _ in blocks)
        snap.segment(0, start, "large", [*(("active_allocated", mib * MiB, mib * MiB) for mib, _ in blocks),
                                         ("inactive", (20 - used) * MiB, 0)])  # fmt: skip
        for block, (_, frames) in zip(snap.segments[-1]["blocks"], blocks):
            block["frames"] = frames
    return snap.write(tmp / "three.pickle")


@pytest.mark.parametrize("replay", ["compiled", "python"])
def test_a_fragmentation_oom_names_the_sites_that_strand_memory(
    tmp_path: Path, replay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GIVEN 28 MiB stranded in three segments (12 beside site a's block, 4 beside site b's,
    12 beside one block of each), 2 MiB free on the device, the largest free block 12 MiB
    WHEN a 20 MiB request fails
    THEN the verdict is fragmentation (20 <= 2 + 28 + 0), the stranded sites are a (24 MiB in
    2 segments) then b (16 MiB in 2), and the advice says so with the failure's own numbers."""
    if replay == "python":
        monkeypatch.setenv(REFERENCE_ENV, "1")
    space = _analyze(_three_segments(tmp_path, 20 * MiB))[(0, 0)]
    (oom,) = space["ooms"]
    assert oom["verdict"] == "fragmentation"
    assert (oom["stranded_bytes"], oom["releasable_bytes"]) == (28 * MiB, 0)
    assert (oom["largest_block_bytes"], oom["recorded_device_free_bytes"]) == (12 * MiB, 2 * MiB)
    assert oom["stranded_sites"] == [
        {"site": "proj/a.py:10 f", "stranded_bytes": 24 * MiB, "segments": 2},
        {"site": "proj/b.py:20 g", "stranded_bytes": 16 * MiB, "segments": 2},
    ]
    text = " ".join(space["advice"])
    assert "failed by fragmentation: 20.00 MiB requested with 2.00 MiB free on the device" in text
    assert "28.00 MiB of it was stranded in segments that also hold blocks from" in text
    assert "'proj/a.py:10 f', 'proj/b.py:20 g'" in text


def test_a_capacity_oom_says_no_layout_would_have_held_it(tmp_path: Path) -> None:
    """GIVEN the same three segments
    WHEN a 40 MiB request fails
    THEN the verdict is capacity (40 > 2 + 28 + 0), no stranded sites are listed, and the advice
    says the program needs less memory, with the failure's own numbers."""
    space = _analyze(_three_segments(tmp_path, 40 * MiB))[(0, 0)]
    (oom,) = space["ooms"]
    assert oom["verdict"] == "capacity" and "stranded_sites" not in oom
    text = " ".join(space["advice"])
    assert "was out of capacity: 40.00 MiB requested with 2.00 MiB free on the device" in text
    assert "60.00 MiB reserved, 32.00 MiB allocated, 28.00 MiB stranded, 0 B releasable" in text


def _report(path: Path, tmp: Path) -> tuple[str, str]:
    """The terminal report at 80 columns and the HTML page of ``path``."""
    page = tmp / "report.html"
    result = CliRunner().invoke(
        cli, ["analyze", str(path), "--html", str(page)], env={"COLUMNS": "80"}
    )
    assert result.exit_code == 0, result.output
    return result.stdout, page.read_text(encoding="utf-8")


def test_the_reports_lead_with_a_fragmentation_oom_in_its_own_numbers(tmp_path: Path) -> None:
    """GIVEN the three segments and a 20 MiB request that fails by fragmentation
    WHEN the terminal and HTML reports are written
    THEN both show, before the state table, the request, the device free memory, reserved,
    allocated, stranded, releasable and largest free block at the failure, the verdict in
    words, and the sites whose blocks strand memory with their stranded bytes."""
    terminal, html = _report(_three_segments(tmp_path, 20 * MiB), tmp_path)
    for text, state in ((terminal, "State ("), (html, "<h3>State (")):
        failure = text[: text.index(state)]
        for figure in (
            "20.00 MiB",  # requested
            "device free 2.00 MiB" if text is terminal else ">2.00 MiB<",
            "60.00 MiB",  # reserved
            "32.00 MiB",  # allocated
            "28.00 MiB",  # stranded
            "12.00 MiB",  # largest free block
        ):
            assert figure in failure, figure
        shown = re.sub(r"<[^>]+>", "", failure)  # a site's markup (line breaks, a location) aside
        assert "fragmentation" in failure and "proj/a.py:10 f" in shown
        assert "24.00 MiB in 2 segments" in failure
    assert "at 0.000070 s: 20.00 MiB requested" in terminal  # µs: the snapshot spans under 1 s


def test_an_nsys_failure_says_its_size_is_not_recorded(tmp_path: Path) -> None:
    """GIVEN two failed cudaMalloc calls, the first before any event (64 MiB free)
    WHEN the terminal and HTML reports are written
    THEN both list each failure with its own time and free memory, say nsys recorded no size
    and the verdict is unknown, and never quote the peak's free memory for a failure."""
    case = failures_at_their_moment(tmp_path)
    terminal, html = _report(case.path, tmp_path)
    for text, state in ((terminal, "State ("), (html, "<h3>State (")):
        failure = text[: text.index(state)]
        assert "Failed allocations: 2 (size not recorded by nsys, verdict unknown)" in failure
        assert "64.00 MiB" in failure and "48.00 MiB" not in failure

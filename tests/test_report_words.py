"""The human reports as a PyTorch or nsys user reads them: each failure leads with its own
numbers, a snapshot's report speaks PyTorch, one time base in tables and figures, and every
line fits 80 columns; on the samples and, where present, the real snapshots."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.cells import cell_len

from nsysfrag.analysis import SpaceAnalysis, analyze
from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.analysis.time_base import moment, since_start_s, span_ns
from nsysfrag.cli import cli
from nsysfrag.inputs import InputOptions, open_input
from nsysfrag.moments import decimals
from nsysfrag.reporters.figures import fragmentation_timeline
from tests.conftest import REPO, SAMPLES

REAL = REPO.parent / "shared" / "real_snapshots"
CONSTRUCTOR = REAL / "Constructor-Sun+code_location__memory_snapshot.pickle"
SNAPSHOTS = sorted(SAMPLES.glob("*.pickle"))
NSYS_WORDS = re.compile(r"\bnsys\b|NVTX|cudaMalloc|TARGET_INFO|trace time", re.IGNORECASE)


def _run(path: Path, tmp: Path, width: int = 80) -> tuple[str, str, dict[str, Any]]:
    """Terminal report at ``width`` columns, HTML page and JSON document of ``path``."""
    page, doc = tmp / "r.html", tmp / "r.json"
    result = CliRunner().invoke(
        cli,
        ["analyze", str(path), "--html", str(page), "--json", str(doc)],
        env={"COLUMNS": str(width)},
    )
    assert result.exit_code == 0, result.output
    return result.stdout, page.read_text(encoding="utf-8"), json.loads(doc.read_text())


def _html_text(page: str) -> str:
    """The page's words: no figures (their glyphs are paths), no markup."""
    page = re.sub(r"<svg.*?</svg>|<style>.*?</style>", "", page, flags=re.DOTALL)
    return re.sub(r"<[^>]+>", " ", page)


def _oom_figures(oom: dict[str, Any]) -> list[str]:
    device_free = oom.get("recorded_device_free_bytes") or oom["device_free_bytes"]
    keys = ("reserved_bytes", "allocated_bytes", "stranded_bytes", "releasable_bytes",
            "largest_block_bytes")  # fmt: skip
    return [format_bytes(oom["requested_bytes"]), format_bytes(device_free)] + [
        format_bytes(oom[k]) for k in keys
    ]


def _check_ooms_lead(terminal: str, html: str, doc: dict[str, Any]) -> int:
    """Every OOM's own figures stand in both reports before its space's state table."""
    checked = 0
    panels = terminal.split("╭─")[1:]
    sections = html.split('<section class="space"')[1:]
    for space, panel, section in zip(doc["spaces"], panels, sections, strict=True):
        lead_t = panel[: panel.index("State (")]
        lead_h = section[: section.index("<h3>State (")]
        for oom in space["ooms"][:10]:
            assert oom["requested_bytes"] is not None
            for figure in _oom_figures(oom):
                assert figure in lead_h, figure
                # Terminal lines wrap: compare without the panel's borders and line breaks.
                flat = " ".join(line.strip("│ ") for line in lead_t.splitlines())
                assert figure in flat, figure
            checked += 1
    return checked


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.name)
def test_snapshot_reports_speak_pytorch_and_lead_with_each_oom(path: Path, tmp_path: Path) -> None:
    """GIVEN a sample snapshot
    WHEN its terminal and HTML reports are written
    THEN neither says an nsys-only word, both say reserved / allocated / stranded /
    releasable, and each OOM's own request and state come before the state table."""
    terminal, html, doc = _run(path, tmp_path)
    words = _html_text(html)
    for text in (terminal, words):
        assert not NSYS_WORDS.search(text), NSYS_WORDS.search(text)
        for word in ("reserved", "allocated", "stranded", "releasable", "device free"):
            assert word in text, word
    _check_ooms_lead(terminal, html, doc)


def test_the_real_oom_is_told_with_its_own_numbers_not_the_peaks(tmp_path: Path) -> None:
    """GIVEN the real snapshot whose device 1 ran out of memory asking 4.94 GiB
    WHEN its reports are written
    THEN the OOM leads device 1 with its own request and device free memory and the verdict
    out of capacity, no sentence describes it with the peak's state, and every terminal line
    fits 80 columns."""
    if not CONSTRUCTOR.exists():
        pytest.skip("the real snapshots are not beside this checkout")
    terminal, html, doc = _run(CONSTRUCTOR, tmp_path)
    assert _check_ooms_lead(terminal, html, doc) == 1
    assert "4.94 GiB requested — out of capacity" in terminal
    assert "largest free block was" not in terminal + html
    assert all(cell_len(line) <= 80 for line in terminal.splitlines())
    assert not NSYS_WORDS.search(terminal + _html_text(html))


@pytest.mark.parametrize(
    "name", ["inference_serving.sqlite", "churn_anomalies.sqlite"]
)
def test_nsys_failures_lead_with_their_moment_and_state(name: str, tmp_path: Path) -> None:
    """GIVEN an nsys sample with failed cudaMalloc calls
    WHEN its reports are written
    THEN the failures come first, each with its own time and free memory (device free,
    stranded, largest usable), the size "not
    recorded by nsys" and the verdict unknown; the terminal lists ten and points to --json."""
    terminal, html, doc = _run(SAMPLES / name, tmp_path)
    (space,) = doc["spaces"]
    lead = terminal[: terminal.index("State (")]
    assert "size not recorded by nsys, verdict unknown" in lead
    shown = space["ooms"][:10]
    head = html[: html.index("<h3>State (")]
    for oom in shown:
        # In the state table's words: device free, stranded and the largest usable request.
        assert format_bytes(oom["largest_free_bytes"]) in lead
        assert format_bytes(oom["device_free_bytes"]) in head
        assert format_bytes(oom["stranded_bytes"]) in head
    more = len(space["ooms"]) - 10
    assert (f"… and {more} more; --json lists all." in lead) == (more > 0)


def _space(path: Path) -> SpaceAnalysis:
    analysis = analyze(open_input(path, InputOptions()))
    return analysis.spaces[0]


@pytest.mark.parametrize(
    "name", ["inference_serving.sqlite", "training_snapshot.pickle", "multi_gpu.sqlite"]
)
def test_a_table_and_a_figure_place_the_peak_at_the_same_time(name: str, tmp_path: Path) -> None:
    """GIVEN a sample
    WHEN the terminal state table and the fragmentation figure show the peak
    THEN the table's time and the figure's x for the peak marker are the same number of
    seconds since the input's first event, and the figure's x axis says so."""
    space = _space(SAMPLES / name)
    terminal, _, _ = _run(SAMPLES / name, tmp_path, width=120)
    shown = moment(space, space.peak.time_ns)
    # The "at" row's worst-fragmentation column, after the peak memory's, holds its time.
    first = moment(space, space.memory_peak.time_ns) if space.memory_peak is not None else ""
    cell = r"\s+[│┃]?\s*"
    assert re.search(rf"\bat{cell}{re.escape(first)}{cell}{re.escape(shown)}", terminal), shown
    fig = fragmentation_timeline(space)
    ax = fig.axes[0]
    (marker,) = [line for line in ax.get_lines() if line.get_marker() == "o"]
    (x,) = marker.get_xdata()
    assert f"{float(x):.{decimals(span_ns(space))}f} s" == shown  # µs where it spans under 1 s
    assert abs(float(x) - since_start_s(space, space.peak.time_ns)) < 1e-9
    assert ax.get_xlabel() == "time since the input's first event (s)"


def test_every_report_line_fits_80_columns_on_the_real_snapshots(tmp_path: Path) -> None:
    """GIVEN every real snapshot beside the checkout
    WHEN its terminal report is printed at 80 columns
    THEN no line is wider than 80 cells."""
    paths = sorted(REAL.glob("*.pickle"))
    if not paths:
        pytest.skip("the real snapshots are not beside this checkout")
    for path in paths:
        result = CliRunner().invoke(cli, ["analyze", str(path)], env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        wide = [line for line in result.stdout.splitlines() if cell_len(line) > 80]
        assert not wide, (path.name, wide[:2])

"""What the terminal says of time and of pinning sites, at 80 and 200 columns (issue 35, item 3).

main, on a snapshot of 835 µs: "at 0.000 s" for health, peak and worst and "growth +38443.412
points/s"; on a real trace "-0.000 points/s"; in a job's table "0.000s"; at 80 columns the
hotspots' "pinned by" site wrapped at the column's slashes (~22 cells) and "+3 more" split
across lines.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from nsysfrag.analysis import analyze
from nsysfrag.analysis.time_base import span_ns
from nsysfrag.inputs import open_input
from nsysfrag.moments import GROWTH_SPAN_NS
from tests.conftest import REAL_TRACES, SAMPLES

WIDTHS = [80, 200]
SHORT = SAMPLES / "torch_fragmentation_snapshot.pickle"  # spans 835 µs
LONG = SAMPLES / "inference_serving.sqlite"  # spans 5 s
TIME = re.compile(r"(?<![\w.])(\d+\.(\d+)) s\b")


def _out(args: list[str], width: int) -> str:
    from nsysfrag.cli import cli

    result = CliRunner().invoke(cli, args, env={"COLUMNS": str(width), "NO_COLOR": "1"})
    assert result.exit_code in (0, 1), result.output
    return result.stdout


def _panel_text(out: str) -> str:
    """The report's words with the panel's borders and the line breaks taken out."""
    lines = [line.strip().strip("│").strip() for line in out.splitlines()]
    return " ".join(lines)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_short_input_tells_its_times_to_the_microsecond_and_no_growth(width: int) -> None:
    space = analyze(open_input(SHORT)).spaces[0]
    assert span_ns(space) < GROWTH_SPAN_NS  # the premise: under a second
    out = _out(["analyze", str(SHORT)], width)
    times = TIME.findall(out)
    assert times and all(len(decimals) == 6 for _, decimals in times), times
    assert "0.000 s" not in out
    said = _panel_text(out)
    assert "growth of global fragmentation: not shown (the input spans 0.000835 s, under a second)" in said
    assert "points/s" not in out
    assert f"{space.growth_per_s * 100:+.3f}" not in out  # the figure itself is not shown


@pytest.mark.parametrize("width", WIDTHS)
def test_a_long_input_keeps_milliseconds_and_its_growth(width: int) -> None:
    out = _out(["analyze", str(LONG)], width)
    times = TIME.findall(out)
    assert times and all(len(decimals) == 3 for _, decimals in times), times
    space = analyze(open_input(LONG)).spaces[0]
    assert f"{space.growth_per_s * 100:+.3f} points/s" in _panel_text(out)


REAL_MEMORY_TRACES = REAL_TRACES.parent / "real_memory_traces"
# Its growth is -0.00016 points/s over 46.9 s: main printed "-0.000 points/s".
NEAR_ZERO = "ntua-el20062+gemm_spmm_a100__gemm_pipeline_inference_like__nsys_reports__nsys_report_db_10000_10_100.sqlite"


@pytest.mark.skipif(not (REAL_MEMORY_TRACES / NEAR_ZERO).is_file(), reason="the genuine traces are not here")
def test_a_rate_that_rounds_to_nothing_is_never_minus_zero() -> None:
    space = analyze(open_input(REAL_MEMORY_TRACES / NEAR_ZERO)).spaces[0]
    assert -0.0005 < space.growth_per_s * 100 < 0  # the premise
    said = _panel_text(_out(["analyze", str(REAL_MEMORY_TRACES / NEAR_ZERO)], 200))
    assert "growth of global fragmentation: ±0.000 points/s" in said
    assert "-0.000" not in said and "−0.000" not in said


@pytest.mark.parametrize("width", WIDTHS)
def test_pinned_by_keeps_its_site_and_its_count_whole(width: int) -> None:
    for path in (SHORT, LONG, SAMPLES / "inference_snapshot.pickle"):
        out = _out(["analyze", str(path)], width)
        lines = [line.strip(" │") for line in out.splitlines()]
        for i, line in enumerate(lines):
            # "+3" at the end of a line with "more" starting the next: main split it
            if re.search(r"\+\d+$", line.rstrip()):
                assert not lines[i + 1].lstrip().startswith("more"), (path.name, line)
        for site in re.findall(r"pinned by (\S+)", out):
            # the pinning site's innermost part is whole: shortened from the left, never cut
            assert not site.endswith(("_", "/")), (path.name, site)


def test_the_job_table_says_its_times_with_a_space(tmp_path: Path) -> None:
    for rank, name in enumerate(("torch_capacity_snapshot.pickle", "torch_fragmentation_snapshot.pickle")):
        shutil.copy(SAMPLES / name, tmp_path / f"rank{rank}.pickle")
    out = _out(["analyze", str(tmp_path / "rank0.pickle"), str(tmp_path / "rank1.pickle")], 80)
    assert not re.search(r"\d\.\d+s\b", out), out  # main: "0.000s" in the health cell
    assert "0.000162 s" in out  # rank 1's worst moment, to the microsecond (it spans 835 µs)

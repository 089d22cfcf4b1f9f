"""The HTML report stays bounded as a snapshot grows: a generated snapshot of 40,000 entries (more
than the figures draw at full resolution) gives a page under 5 MB whose figures draw a bounded
number of points and one image for the address map. The 1 M and 5 M entry figures are measured
by benchmarks/bench_snapshot_scale.py."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from nsysfrag.analysis import Analysis, analyze
from nsysfrag.inputs import open_input
from nsysfrag.reporters.html import render
from nsysfrag.reporters.timeline_points import FULL_RESOLUTION_EVENTS, TIME_BINS
from tests.conftest import REPO

ENTRIES = 40_000
MAX_PAGE_BYTES = 5_000_000


def big_snapshot_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "nsysfrag_big_snapshot", REPO / "benchmarks" / "big_snapshot.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def analysis(tmp_path_factory: pytest.TempPathFactory) -> Analysis:
    path: Path = tmp_path_factory.mktemp("big") / "snapshot.pickle"
    big_snapshot_module().write_snapshot(path, ENTRIES)
    return analyze(open_input(path))


@pytest.fixture(scope="module")
def page(analysis: Analysis) -> str:
    return render(analysis)


def figure(page: str, name: str) -> str:
    found = re.search(rf'<figure [^>]*data-figure="{name}">(.*?)</figure>', page, re.DOTALL)
    assert found is not None, name
    return found.group(1)


def test_the_snapshot_is_past_full_resolution(analysis: Analysis) -> None:
    assert len(analysis.spaces) == 1
    assert len(analysis.spaces[0].timeline.time_ns) > FULL_RESOLUTION_EVENTS


def test_page_is_under_5_mb(page: str) -> None:
    assert len(page.encode("utf-8")) < MAX_PAGE_BYTES


def test_address_map_is_one_image_not_a_shape_per_block(page: str, analysis: Analysis) -> None:
    svg = figure(page, "address_map")
    assert svg.count("<image") == 1
    assert analysis.spaces[0].counts.allocations > 10_000
    assert len(svg) < 300_000


def test_time_series_draw_a_bounded_number_of_points(page: str) -> None:
    # A line of k points is one path of about 2k steps; every figure holds a few lines.
    for name in ("fragmentation", "memory", "free_blocks"):
        svg = figure(page, name)
        longest = max(len(d) for d in re.findall(r' d="([^"]*)"', svg))
        assert longest < 2 * 4 * TIME_BINS * 20, name  # at most ~20 characters a step

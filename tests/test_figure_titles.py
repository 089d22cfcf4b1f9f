"""Figure titles as drawn (issue 35, item 1): read back from the rendered SVG, one ``<text>``
element per drawn line.

main escaped the tool's own line break with the input's control characters, so every title read
"…driver's pages\\npid 3310 (python3)…" on one line, and the address map's, too wide for the
figure, was clipped at both ends.
"""

from __future__ import annotations

import dataclasses
import io
import re
from datetime import datetime, timedelta, timezone
from functools import cache

import matplotlib
import pytest
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import TextToPath

from nsysfrag.analysis import SpaceAnalysis, analyze
from nsysfrag.history.chart import trend_figure
from nsysfrag.history.store import StoredRun
from nsysfrag.history.trends import Series
from nsysfrag.inputs import InputOptions, open_input
from nsysfrag.reporters.figure_axes import TITLE_ID, TITLE_PT, save_figure, space_label
from nsysfrag.reporters.figures import figure_builders
from tests.conftest import SAMPLES

_GROUP = re.compile(rf'<g id="{TITLE_ID}">(.*?)</g>', re.DOTALL)
_LINE = re.compile(r'<text [^>]*transform="translate\(([-\d.]+) [-\d.]+\)"[^>]*>(.*?)</text>')


@cache
def _space(name: str) -> SpaceAnalysis:
    options = InputOptions(capacity_bytes=None)
    return analyze(open_input(SAMPLES / name, options)).spaces[0]


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    # Text as <text> elements (the HTML page draws glyphs as paths; the layout is the same).
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        save_figure(fig, buf, format="svg")
    return buf.getvalue()


def _unescape_xml(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace(
        "&#39;", "'").replace("&amp;", "&")  # fmt: skip


def title_lines(fig: Figure) -> list[tuple[float, str]]:
    """Each drawn line of the title: its left edge (pt) and its text."""
    (group,) = _GROUP.findall(_svg(fig))
    return [(float(x), _unescape_xml(t)) for x, t in _LINE.findall(group)]


def _fits(fig: Figure, lines: list[tuple[float, str]]) -> bool:
    width_pt = fig.get_figwidth() * 72.0
    measure = TextToPath()
    font = FontProperties(size=TITLE_PT)
    for left, text in lines:
        w, _, _ = measure.get_text_width_height_descent(text, font, ismath=False)
        if left < 0 or left + w > width_pt + 0.5:
            return False
    return True


SAMPLE_INPUTS = ["inference_serving.sqlite", "torch_fragmentation_snapshot.pickle"]


@pytest.mark.parametrize("name", list(figure_builders))
@pytest.mark.parametrize("sample", SAMPLE_INPUTS)
def test_each_title_is_two_drawn_lines_that_fit(sample: str, name: str) -> None:
    space = _space(sample)
    fig = figure_builders[name](space)
    lines = title_lines(fig)
    texts = [t for _, t in lines]
    assert len(texts) == 2, texts
    assert texts[0].endswith(space.source.words.figure_title) or (
        space.source.words.figure_title + " · " in texts[0]
    ), texts
    assert texts[1] == space_label(space)
    assert not any("\\n" in t for t in texts)
    assert _fits(fig, lines), lines  # main: the address map's title ran off both edges


def test_a_line_break_in_a_name_stays_escaped_and_a_long_one_wraps_inside() -> None:
    space = dataclasses.replace(
        _space("inference_serving.sqlite"),
        process_name="py\r\nthon\x1b[2J",
        device_name="NVIDIA " + "very long device name " * 8,
    )
    for build in (figure_builders["address_map"], figure_builders["memory"]):
        fig = build(space)
        lines = title_lines(fig)
        drawn = " ".join(t for _, t in lines)
        assert "(py\\r\\nthon\\x1b[2J)" in drawn  # the input's break is text, one name one line
        assert not any(ch in drawn for ch in "\r\n\x1b")
        assert len(lines) >= 3 and _fits(fig, lines), lines  # wrapped, never clipped


def _run(i: int, model: str) -> StoredRun:
    at = datetime(2026, 11, 1, tzinfo=timezone.utc) + timedelta(days=i)
    return StoredRun(i, at, f"/t/{i}.sqlite", "0" * 64, model, 2 << 20, None, None, None, None, None)


def test_the_history_trend_title_breaks_where_the_tool_breaks_it() -> None:
    runs = [_run(i, "observed") for i in (1, 2, 3)]
    series = [Series("dev0/pid1", "global_frag", (1, 2, 3), (0.1, 0.2, 0.3))]
    lines = [t for _, t in title_lines(trend_figure(runs, series, "global_frag"))]
    assert lines[0].startswith("global_frag across runs · ")
    assert lines[1] == "3 run(s), 2026-11-02 → 2026-11-04 (UTC)"
    assert len(lines) == 2

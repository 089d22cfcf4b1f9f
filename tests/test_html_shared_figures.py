"""--html and --png together build each figure once, and the files are those of separate builds."""

from __future__ import annotations

import io
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner
from matplotlib.figure import Figure

from nsysfrag.analysis import Analysis, analyze
from nsysfrag.cli import cli
from nsysfrag.inputs import InputOptions, open_input
from nsysfrag.reporters import figures, html, shared_figures
from nsysfrag.reporters.figure_axes import save_figure
from nsysfrag.reporters.png import write_pngs
from tests.conftest import SAMPLES

# An export whose space is not one moment (all six figures) and a PyTorch snapshot (its own
# memory figure and words).
INPUTS = ("training_loop.sqlite", "training_snapshot.pickle")


@cache
def sample(name: str) -> Analysis:
    return analyze(open_input(SAMPLES / name, InputOptions()))


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    save_figure(fig, buf, format="png", dpi="figure")
    return buf.getvalue()


@pytest.mark.parametrize("name", INPUTS)
def test_a_figure_saved_twice_gives_what_a_fresh_one_gives(name: str) -> None:
    # Without save_figure putting the layout back, the second save of most figures differed.
    for space in sample(name).spaces:
        for fig_name, build in figures.figures_for(space).items():
            fresh_svg, fresh_png = html.svg_markup(build(space), "p-"), png_bytes(build(space))
            once = build(space)
            assert html.svg_markup(once, "p-") == fresh_svg
            assert png_bytes(once) == fresh_png, fig_name
            assert html.svg_markup(once, "p-") == fresh_svg, fig_name


def test_sharing_builds_each_figure_once_with_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    analysis = sample("training_loop.sqlite")
    apart_page = html.render(analysis)
    apart = write_pngs(analysis, tmp_path / "apart")
    built: list[str] = []
    for fig_name, build in list(figures.figure_builders.items()):
        def counted(space, build=build, fig_name=fig_name):  # type: ignore[no-untyped-def]
            built.append(fig_name)
            return build(space)

        monkeypatch.setitem(figures.figure_builders, fig_name, counted)
    with shared_figures.sharing():
        page = html.render(analysis)
        shared = write_pngs(analysis, tmp_path / "shared")
    assert sorted(built) == sorted(figures.figure_builders) * len(analysis.spaces)
    assert page == apart_page
    assert [p.read_bytes() for p in shared] == [p.read_bytes() for p in apart]
    # Outside the scope nothing is kept: each report builds its own again.
    built.clear()
    html.render(analysis)
    assert len(built) == len(figures.figure_builders) * len(analysis.spaces)
    # analyze opens the scope when both formats are asked for.
    built.clear()
    trace = str(SAMPLES / "training_loop.sqlite")
    args = ["analyze", trace, "-q", "--html", str(tmp_path / "r.html"), "--png", str(tmp_path / "p")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert len(built) == len(figures.figure_builders) * len(analysis.spaces)
    assert (tmp_path / "r.html").read_text() == apart_page

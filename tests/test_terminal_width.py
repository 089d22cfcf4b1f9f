"""The terminal reports at 80 and 120 columns (``COLUMNS``): every line fits, nothing is cut,
no figure is split from its unit, and where the checkout is makes no difference."""

from __future__ import annotations

import io
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.text import Text

from nsysfrag.cli import cli
from nsysfrag.reporters.layout import Column, FittedTable, Layout, Prose, fit_widths, wrap_lines
from tests.conftest import SAMPLES

ANALYZED = sorted(p.name for p in SAMPLES.iterdir() if p.suffix in (".sqlite", ".pickle"))
WHATIF = ["training_snapshot.pickle", "inference_serving.sqlite"]
FIGURE = re.compile(r"[-+−]?\d[\d,.]*(?:–\d[\d,.]*)? (?:[KMGTPE]iB|B|%|s)(?![\w/])")
SPLIT = re.compile(r"\d[ │┃]*\n[ │┃]*(?:[KMGTPE]iB|B|%|s)\b")


def render(argv: list[str], width: int, cwd: Path) -> str:
    """The command's stdout, run in ``cwd`` (inputs by relative name) at ``width`` columns."""
    old = Path.cwd()
    try:
        os.chdir(cwd)
        result = CliRunner().invoke(cli, argv, env={"COLUMNS": str(width)})
    finally:
        os.chdir(old)
    assert result.exit_code == 0, result.output
    return result.stdout


def check_fits(text: str, width: int, wide: str) -> None:
    for line in text.splitlines():
        assert cell_len(line) <= width, f"{cell_len(line)} > {width}: {line!r}"
    # Only the content's own elisions ("…" in a shortened list) and sites shortened from the
    # left ("…/" before their innermost part, which stays whole), never a cut cell.
    assert text.count("…") - text.count("…/") == wide.count("…") - wide.count("…/")
    for innermost in re.findall(r"…/([^\s/│┃]+)", text):
        assert f"/{innermost}" in wide, innermost
    assert not SPLIT.search(text), SPLIT.search(text)


def _workspace(tmp_path: Path, depth: int, names: list[str]) -> Path:
    work = tmp_path.joinpath(*(["deeper-and-deeper"] * depth))
    work.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(SAMPLES / name, work / name)
    return work


@pytest.mark.parametrize("name", ANALYZED)
def test_analyze_fits_80_and_120_columns_wherever_it_runs(tmp_path: Path, name: str) -> None:
    shallow, deep = _workspace(tmp_path, 0, [name]), _workspace(tmp_path / "d", 12, [name])
    wide = render(["analyze", name], 400, shallow)
    for width in (80, 120):
        text = render(["analyze", name], width, shallow)
        check_fits(text, width, wide)
        # A table shows every figure whole, wrapping only words and names.
        assert set(FIGURE.findall(wide)) <= set(FIGURE.findall(text))
        assert render(["analyze", name], width, deep) == text


@pytest.mark.parametrize("name", WHATIF)
def test_whatif_fits_80_and_120_columns(tmp_path: Path, name: str) -> None:
    work = _workspace(tmp_path, 0, [name])
    wide = render(["whatif", name], 400, work)
    for width in (80, 120):
        check_fits(render(["whatif", name], width, work), width, wide)


def test_history_and_compare_fit_80_and_120_columns(tmp_path: Path) -> None:
    names = ["training_loop.sqlite", "multi_gpu.sqlite", "inference_snapshot.pickle"]
    work = _workspace(tmp_path, 0, names)
    db = str(work / "h.sqlite")
    for i, name in enumerate(names):
        render(["analyze", name, "-q", "--json", f"{i}.json", "--record", "--db", db,
                "--label", f"nightly #{400 + i} of the global fragmentation run",
                "--tag", "model=llama-8b", "--tag", "priority=critical"], 80, work)  # fmt: skip
    for argv in (["history", "--db", db], ["compare", "0.json", "1.json"]):
        wide = render(argv, 400, work)
        for width in (80, 120):
            text = render(argv, width, work)
            check_fits(text, width, wide)
            assert set(FIGURE.findall(wide)) <= set(FIGURE.findall(text))
    # At 80 columns the label, tags and trace stay readable: no column squeezed to nothing.
    text = render(["history", "--db", db], 80, work)
    assert "priority=critical" in text and "model=llama-8b" in text and "nightly #401 of the" in text
    assert "┳┳" not in text


# ---------------------------------------------------------------- the layout itself


def test_prose_never_splits_a_figure_from_its_unit() -> None:
    text = Text("at the peak the largest free block was 774.00 MiB of 4.90 GiB (93.0 %) free")
    for width in range(12, 80):
        lines = [line.plain for line in wrap_lines(text, width)]
        assert " ".join(lines) == text.plain
        assert all(cell_len(line) <= width for line in lines)
        for figure in ("774.00 MiB", "4.90 GiB", "93.0 %"):
            assert any(figure in line for line in lines), (width, lines)


def test_a_name_longer_than_its_column_folds_after_slashes_and_is_kept_whole() -> None:
    site = "train_step/forward/layer_05/attention/ScaledDotProductFlashAttentionBackward0"
    lines = [line.plain for line in wrap_lines(Text(site), 20, name=True)]
    assert "".join(lines) == site
    assert lines[0] == "train_step/forward/"
    assert all(cell_len(line) <= 20 for line in lines)


def test_widths_shrink_names_first_then_headers_then_words() -> None:
    # stops per column: [widest, after names, after headers wrap, after words wrap]
    name, figure, words = [40, 12, 12, 12], [11, 11, 8, 8], [16, 16, 16, 10]
    assert fit_widths([name, figure, words], 67) == ([40, 11, 16], 0)
    assert fit_widths([name, figure, words], 50) == ([23, 11, 16], 1)
    assert fit_widths([name, figure, words], 36) == ([12, 8, 16], 2)
    assert fit_widths([name, figure, words], 30) == ([12, 8, 10], 3)
    assert fit_widths([name, figure, words], 29) is None


def test_a_table_too_wide_for_any_layout_becomes_paragraphs() -> None:
    columns = [Column("site", kind="name"), *(Column(f"figure {i}", justify="right") for i in range(6))]
    rows = [["request/decode", *(f"{i}.00 GiB" for i in range(6))]]
    table = FittedTable(Text("Hotspots"), Layout(columns, rows))
    console = Console(width=40, record=True, file=io.StringIO())
    console.print(table)
    text = console.export_text()
    assert "figure 3 3.00 GiB" in " ".join(text.split())
    assert all(cell_len(line) <= 40 for line in text.splitlines())


def test_prose_measures_its_longest_unbreakable_piece() -> None:
    console = Console(width=80)
    m = Measurement.get(console, console.options, Prose(Text("free 1.38 GiB of 80.00 GiB")))
    assert (m.minimum, m.maximum) == (len("80.00 GiB"), len("free 1.38 GiB of 80.00 GiB"))


def test_a_tiny_or_zero_columns_still_prints_the_report(tmp_path: Path) -> None:
    work = _workspace(tmp_path, 0, ["training_loop.sqlite"])
    wide = render(["analyze", "training_loop.sqlite"], 400, work)
    for width in (0, 5):
        text = render(["analyze", "training_loop.sqlite"], width, work)
        check_fits(text, 40, wide)  # the narrowest report nsysfrag prints
        assert "80.00 GiB" in text  # the device, in a table cell never split


def test_a_site_is_shortened_from_the_left_keeping_its_innermost_part_whole() -> None:
    """GIVEN a site of three parts and a '+2 more' after it
    WHEN it is fitted to narrower and narrower columns
    THEN it drops its outer parts first ('…/' in their place), keeps the innermost part whole
    (wrapping it at its space rather than mid-word), and always shows what follows it."""
    from nsysfrag.reporters.layout import Site

    site = Site("train/step/models.py:178 update_nodes", Text(" +2 more"))
    assert site.fitted(60).plain == "train/step/models.py:178 update_nodes +2 more"
    assert site.fitted(40).plain == "…/models.py:178 update_nodes +2 more"
    narrow = site.fitted(20).plain.split("\n")
    assert narrow[0] == "…/models.py:178" and "update_nodes" in narrow[1]
    assert all(cell_len(line) <= 20 for line in narrow) and narrow[-1].endswith("more")

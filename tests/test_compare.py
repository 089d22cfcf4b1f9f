"""`nsysfrag compare` that explains: the state side by side in the input's words, the sites
ranked by how much their figures changed (a planted change must come first, exactly), the
verdict, documents without the per-site figures, refusals, jobs, real snapshot pairs."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from rich.cells import cell_len

from nsysfrag.analysis import analyze
from nsysfrag.checks.comparison import compare
from nsysfrag.checks.site_changes import GONE, MOVED, NEW, SAME, UNLISTED, SiteList, site_changes
from nsysfrag.cli import cli
from nsysfrag.inputs import open_input
from nsysfrag.reporters.json_report import document
from tests.compare_pairs import (
    GROWING_FRAME,
    GROWING_RANGE,
    HOTSPOT_BYTES,
    HOTSPOT_FRAME,
    HOTSPOT_RANGE,
    PAGE_HOLE_BYTES,
    MiB,
    export_pair,
    snapshot_pair,
    snapshot_run,
)
from tests.conftest import REAL_SNAPSHOTS
from tests.test_html import console_problems, needs_chromium, png_pixels, run_chromium

PLANTED = 48 * MiB + 5000  # not a round number: the delta must be exact to the byte


def invoke(*args: str | Path) -> Any:
    result = CliRunner().invoke(cli, [str(a) for a in args], env={"COLUMNS": "80"})
    return result


def compare_json(base: Path, current: Path, *args: str) -> dict[str, Any]:
    result = invoke("compare", base, current, "--json", "-", *args)
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def analysis_json(path: Path, out: Path) -> Path:
    result = invoke("analyze", path, "-q", "--json", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return snapshot_pair(tmp_path_factory.mktemp("snapshots"), PLANTED)


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return export_pair(tmp_path_factory.mktemp("exports"), PLANTED)


# ---------------------------------------------------------------- the planted change


@pytest.mark.parametrize(
    ("pair", "growing", "hotspot", "hole"),
    [("snapshots", GROWING_FRAME, HOTSPOT_FRAME, HOTSPOT_BYTES),
     ("exports", GROWING_RANGE, HOTSPOT_RANGE, PAGE_HOLE_BYTES)],
)  # fmt: skip
def test_the_planted_site_is_ranked_first_with_its_exact_delta(
    pair: str, growing: str, hotspot: str, hole: int, request: pytest.FixtureRequest
) -> None:
    base, current = request.getfixturevalue(pair)
    doc = compare_json(base, current)
    assert doc["schema"] == "nsysfrag-compare/1"
    (space,) = doc["spaces"]
    live = space["sites"]["live_at_memory_peak"]["changes"]
    assert (live[0]["site"], live[0]["delta_bytes"], live[0]["status"]) == (growing, PLANTED, SAME)
    assert len(live) == 1  # nothing else moved
    holes = space["sites"]["hole_bytes"]["changes"]
    assert (holes[0]["site"], holes[0]["status"], holes[0]["delta_bytes"]) == (hotspot, NEW, hole)
    assert holes[0]["base_bytes"] == 0 and holes[0]["current_bytes"] == hole
    # The verdict tells it in words: the growth, where it lives, the new hotspot.
    verdict = space["verdict"]
    assert verdict.startswith("Peak reserved +")
    assert f"{PLANTED / MiB:.2f} MiB of it is live at `{growing}`" in verdict
    assert f"`{hotspot}` (a new hotspot)" in verdict
    # The state at peak memory: reserved and requested grew, requested by the planted bytes.
    peak = next(m for m in space["moments"] if m["moment"] == "memory_peak")
    figures = {f["figure"]: f for f in peak["figures"]}
    assert figures["live_bytes"]["delta"] == PLANTED
    assert figures["reserved_bytes"]["delta"] >= PLANTED


def test_documents_compare_as_the_inputs_do(snapshots: tuple[Path, Path], tmp_path: Path) -> None:
    base, current = snapshots
    direct = compare_json(base, current)
    docs = [analysis_json(p, tmp_path / f"{p.stem}.json") for p in snapshots]
    read_back = compare_json(*docs)
    for key in ("moments", "sites", "verdict", "health"):
        assert read_back["spaces"][0][key] == direct["spaces"][0][key], key
    # A document and an input together work as well: a baseline kept from last week's run.
    mixed = compare_json(docs[0], current)
    assert mixed["spaces"][0]["sites"] == direct["spaces"][0]["sites"]


def test_analyze_with_baseline_explains_the_change(
    exports: tuple[Path, Path], tmp_path: Path
) -> None:
    base, current = exports
    baseline = analysis_json(base, tmp_path / "base.json")
    result = invoke("analyze", current, "--baseline", baseline)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"of it is live at `{GROWING_RANGE}`" in text
    assert "Live bytes at peak memory" in text and HOTSPOT_RANGE in text


def test_sites_whose_lines_moved_match_by_file_and_function(tmp_path: Path) -> None:
    base = snapshot_run(tmp_path / "base.pickle", 0, hotspot=False)
    edited = snapshot_run(tmp_path / "edited.pickle", PLANTED, hotspot=False, line_shift=7)
    (space,) = compare_json(base, edited)["spaces"]
    (change,) = space["sites"]["live_at_memory_peak"]["changes"]
    assert change == {
        "site": "proj/model.py:157 forward",
        "base_site": GROWING_FRAME,
        "status": MOVED,
        "base_bytes": 60 * MiB,
        "current_bytes": 60 * MiB + PLANTED,
        "delta_bytes": PLANTED,
    }
    assert "(was `proj/model.py:150 forward`)" in space["verdict"]


# ---------------------------------------------------------------- matching, unit by unit


def test_site_matching_rules() -> None:
    base = SiteList({"a.py:1 f": 10, "m.py:10 g": 5, "m.py:20 g": 7, "x.py:3 h": 4, "nvtx/one": 3})
    current = SiteList({"a.py:1 f": 12, "m.py:12 g": 6, "m.py:22 g": 7, "x.py:5 h": 1,
                        "x.py:9 h": 2, "nvtx/two": 8})  # fmt: skip
    by_site = {c.site: c for c in site_changes(base, current)}
    assert (by_site["a.py:1 f"].status, by_site["a.py:1 f"].delta) == (SAME, 2)
    # As many lines on each side: paired in line order.
    assert (by_site["m.py:12 g"].base_site, by_site["m.py:12 g"].delta) == ("m.py:10 g", 1)
    assert (by_site["m.py:22 g"].base_site, by_site["m.py:22 g"].delta) == ("m.py:20 g", 0)
    # One line became two: added together under the function's name.
    merged = by_site["x.py h"]
    assert (merged.status, merged.merged, merged.base, merged.current) == (MOVED, True, 4, 3)
    assert (by_site["nvtx/one"].status, by_site["nvtx/two"].status) == (GONE, NEW)
    ranked = [c.site for c in site_changes(base, current)]
    assert ranked[:2] == ["nvtx/two", "nvtx/one"]  # |+8|, |-3|


def test_a_list_cut_short_leaves_a_site_unlisted_not_new() -> None:
    base = SiteList({"a": 100, "b": 50}, other_sites=3, other_bytes=40)
    current = SiteList({"a": 100, "c": 30})
    by_site = {c.site: c for c in site_changes(base, current)}
    assert (by_site["c"].status, by_site["c"].base) == (UNLISTED, None)
    assert (by_site["b"].status, by_site["b"].current) == (GONE, 0)


# ---------------------------------------------------------------- the analysis document


def _sites_doc(path: Path, listed: int | None) -> dict[str, Any]:
    (space,) = document(analyze(open_input(path)), sites_listed=listed)["spaces"]
    return dict(space["memory_peak_sites"])


@pytest.mark.parametrize("name", ["training_snapshot.pickle", "inference_serving.sqlite",
                                  "pressure_gc_snapshot.pickle", "churn_anomalies.sqlite"])  # fmt: skip
def test_per_site_figures_add_up_to_the_memory_peak(name: str) -> None:
    from tests.conftest import SAMPLES

    a = analyze(open_input(SAMPLES / name))
    for s, doc in zip(a.spaces, document(a)["spaces"], strict=True):
        sites = doc["memory_peak_sites"]
        assert sites["live"]["total_bytes"] == s.memory_peak.live_bytes
        listed = sum(x["bytes"] for x in sites["live"]["sites"])
        assert listed + sites["live"]["other_bytes"] == s.memory_peak.live_bytes
        # Stranded bytes: every segment (page) once, the same as the state says.
        assert sites["stranded"]["total_bytes"] == doc["memory_peak"]["stranded_bytes"]
        # A site pins at most all of it.
        assert all(
            x["bytes"] <= sites["stranded"]["total_bytes"] for x in sites["stranded"]["sites"]
        )


def test_stranded_pages_are_credited_to_every_site_with_a_block_in_them(tmp_path: Path) -> None:
    """Page 0: a (1 MiB) and b (512 KiB), 512 KiB free; c (3 MiB) from page 1 leaves 1 MiB of
    page 2 free. So a and b pin 512 KiB each, c 1 MiB: 1.5 MiB stranded in all."""
    from nsysfrag.testing.nsys_export import ApiRow, Gpu, MemoryRow, NvtxRow, write_export

    base = 0x7F20_0000_0000
    blocks = [(0, MiB, "a"), (MiB, MiB // 2, "b"), (2 * MiB, 3 * MiB, "c")]
    memory, api, nvtx = [], [], []
    for i, (offset, size, site) in enumerate(blocks, start=1):
        memory.append(MemoryRow(i * 1000, 1, 0, base + offset, size, correlation_id=i))
        api.append(ApiRow(i * 1000 - 10, i * 1000 + 10, 1, 7, "cudaMalloc", i))
        nvtx.append(NvtxRow(i * 1000 - 100, i * 1000 + 100, 1, 7, site))
    path = write_export(
        tmp_path / "pages.sqlite", memory, api, nvtx, [Gpu(0, total_memory=1 << 30)]
    )
    full = _sites_doc(path, None)
    assert {x["site"]: x["bytes"] for x in full["stranded"]["sites"]} == {
        "c": MiB, "a": MiB // 2, "b": MiB // 2,
    }  # fmt: skip
    assert full["stranded"]["total_bytes"] == 3 * MiB // 2
    assert [x["site"] for x in full["live"]["sites"]] == ["c", "a", "b"]
    # Cut to one site each: the rest is one total; the stranded memory no listed site pins
    # (page 0's) is what the others hold.
    short = _sites_doc(path, 1)
    assert short["live"] == {"total_bytes": 4.5 * MiB, "sites": [{"site": "c", "bytes": 3 * MiB}],
                             "other_sites": 2, "other_bytes": 1.5 * MiB}  # fmt: skip
    assert (short["stranded"]["other_sites"], short["stranded"]["other_bytes"]) == (2, MiB // 2)


def test_an_older_document_compares_metric_by_metric_and_says_what_is_missing(
    exports: tuple[Path, Path], tmp_path: Path
) -> None:
    base, current = exports
    doc = json.loads(analysis_json(base, tmp_path / "base.json").read_text())
    for space in doc["spaces"]:  # as an nsysfrag before these figures wrote it
        for key in ("memory_peak", "memory_peak_sites"):
            del space[key]
    del doc["trace"]["words"], doc["trace"]["input"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    result = invoke("compare", old, current)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "not compared: the state at peak memory (not in old.json)" in text
    assert "not compared: per-site live bytes at peak memory (not in old.json)" in text
    assert "observed device pages" in text  # its words follow from its model
    (space,) = compare_json(old, current)["spaces"]
    assert [m["moment"] for m in space["moments"]] == ["peak", "final"]
    assert list(space["sites"]) == ["hole_bytes"]
    assert space["verdict"].startswith("Peak live bytes +")


# ---------------------------------------------------------------- refusals


def test_two_kinds_of_input_are_refused_in_one_line(
    snapshots: tuple[Path, Path], exports: tuple[Path, Path], tmp_path: Path
) -> None:
    doc = analysis_json(exports[0], tmp_path / "export.json")
    for pair in ((snapshots[0], exports[1]), (doc, snapshots[1]), (snapshots[0], doc)):
        result = invoke("compare", *pair)
        assert result.exit_code == 2
        (line,) = result.output.strip().splitlines()
        assert "compare two of one kind (two snapshots, two nsys exports)" in line
        assert "a PyTorch memory snapshot" in line and "an nsys export" in line
    result = invoke("analyze", snapshots[1], "--baseline", doc)
    assert result.exit_code == 2 and "compare two of one kind" in result.output
    other = json.loads(doc.read_text())
    other["model"]["name"] = "arena"
    (tmp_path / "arena.json").write_text(json.dumps(other))
    result = invoke("compare", doc, tmp_path / "arena.json")
    assert result.exit_code == 2
    assert "analyzed in the observed model and arena.json in the arena model" in result.output


# ---------------------------------------------------------------- words, widths, pages


@pytest.mark.parametrize("pair", ["snapshots", "exports"])
def test_terminal_report_fits_80_columns_in_the_input_s_words(
    pair: str, request: pytest.FixtureRequest
) -> None:
    base, current = request.getfixturevalue(pair)
    result = invoke("compare", base, current)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    text = result.output
    for moment in ("at peak memory", "at worst fragmentation", "final"):
        assert moment in text
    for figure in ("reserved", "allocated", "stranded", "releasable", "device free",
                   "largest usable request"):  # fmt: skip
        assert re.search(rf"^[│ ]+{figure} ", text, re.MULTILINE), figure
    assert "largest free at peak" not in text
    if pair == "snapshots":
        assert "pytorch-segments address space" in text and "stack frame" in text
        assert "observed" not in text and "NVTX" not in text
    else:
        assert "observed device pages" in text and "(NVTX)" in text
        assert "stack frame" not in text and "observed address space" not in text


def test_regression_gate_still_trips(exports: tuple[Path, Path]) -> None:
    base, current = exports
    result = invoke("compare", base, current, "--fail-on-regression", "0.0001", "-q")
    assert result.exit_code == 1
    assert "regression: pid 1 device 0: max local frag grew by" in result.output
    assert invoke("compare", current, base, "--fail-on-regression", "0.5", "-q").exit_code == 0


def test_html_page_is_self_contained_and_escaped(
    snapshots: tuple[Path, Path], tmp_path: Path
) -> None:
    base, current = snapshots
    page = tmp_path / "compare.html"
    result = invoke("compare", base, current, "--html", page, "-q")
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert html.startswith("<!doctype html>") and "<script" not in html and "http" not in html
    assert f"<code>{GROWING_FRAME}</code>" in html and "a new hotspot" in html
    assert "observed" not in html


# ---------------------------------------------------------------- jobs


def test_two_jobs_compare_rank_by_rank_and_name_the_worst(
    snapshots: tuple[Path, Path], exports: tuple[Path, Path], tmp_path: Path
) -> None:
    jobs = []
    for side, (snapshot, export) in (("base", (snapshots[0], exports[0])),
                                     ("current", (snapshots[1], exports[1]))):  # fmt: skip
        folder = tmp_path / side
        folder.mkdir()
        shutil.copyfile(snapshot, folder / "rank0.pickle")
        shutil.copyfile(export, folder / "rank1.sqlite")
        jobs.append(folder)
    doc = compare_json(*jobs)
    assert doc["job"] is True and [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert doc["worst"]["current"]["rank"] in (0, 1)
    for rank, growing in ((0, GROWING_FRAME), (1, GROWING_RANGE)):
        (space,) = doc["ranks"][rank]["comparison"]["spaces"]
        top = space["sites"]["live_at_memory_peak"]["changes"][0]
        assert (top["site"], top["delta_bytes"]) == (growing, PLANTED)
    text = " ".join(invoke("compare", *jobs).stdout.split())
    assert text.startswith("worst rank (peak global frag): rank")
    assert "(base, rank 0) → " in text and "(current, rank 1)" in text


# ---------------------------------------------------------------- genuine snapshots


REAL_PAIRS = [
    ("kkaitlyn111+cs336-a2-systems__memory_files__memory_ctx128_fullstep_.pickle",
     "kkaitlyn111+cs336-a2-systems__memory_files__memory_ctx256_forward_.pickle"),
    ("Wedsonlin+assignment2-systems__results__medium_128_inference_memory_snapshot.pickle",
     "Wedsonlin+assignment2-systems__results__medium_512_training_memory_snapshot.pickle"),
]  # fmt: skip


@pytest.mark.parametrize("pair", REAL_PAIRS, ids=["kkaitlyn-ctx128-ctx256", "wedsonlin-128-512"])
def test_genuine_snapshot_pairs_attribute_every_byte(pair: tuple[str, str]) -> None:
    paths = [REAL_SNAPSHOTS / name for name in pair]
    if not all(p.exists() for p in paths):
        pytest.skip("../shared/real_snapshots is absent")
    docs = [document(analyze(open_input(p)), sites_listed=None) for p in paths]
    doc = compare_json(*paths)
    (space,) = doc["spaces"]
    print(space["verdict"])  # the report quotes it (pytest -s)
    (b, c) = (d["spaces"][0] for d in docs)
    # Every live byte at peak memory is some site's: the sites' changes add up to the change.
    live = space["sites"]["live_at_memory_peak"]
    assert sum(x["delta_bytes"] for x in live["changes"]) == (
        c["memory_peak"]["live_bytes"] - b["memory_peak"]["live_bytes"]
    )
    # Each change is the difference of the two analyses' own figures for that site.
    own = [{x["site"]: x["bytes"] for x in d["memory_peak_sites"]["live"]["sites"]} for d in (b, c)]
    for x in live["changes"]:
        if x["status"] == SAME:
            assert x["delta_bytes"] == own[1][x["site"]] - own[0][x["site"]]
    ranked = [abs(x["delta_bytes"]) for x in live["changes"]]
    assert ranked == sorted(ranked, reverse=True)
    delta = c["memory_peak"]["reserved_bytes"] - b["memory_peak"]["reserved_bytes"]
    assert space["verdict"].startswith(f"Peak reserved {'+' if delta > 0 else '−'}")
    assert "observed" not in json.dumps(doc)


def test_a_comparison_is_a_pure_function_of_its_documents(snapshots: tuple[Path, Path]) -> None:
    docs = [document(analyze(open_input(p))) for p in snapshots]
    kept = copy.deepcopy(docs)
    first, second = compare(*docs), compare(*docs)
    assert first == second and docs == kept  # nothing read is changed


@needs_chromium
@pytest.mark.parametrize("pair", ["snapshots", "exports"])
def test_chromium_draws_the_comparison(
    pair: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    base, current = request.getfixturevalue(pair)
    page = tmp_path / "compare.html"
    assert invoke("compare", base, current, "--html", page, "-q").exit_code == 0
    shot = tmp_path / "shot.png"
    done = run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1600", page.as_uri())
    assert shot.exists(), done.stderr[-2000:]
    pixels = png_pixels(shot)
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50  # not blank
    assert not console_problems(done.stderr, page.as_uri())
    dom = run_chromium(tmp_path, "--dump-dom", page.as_uri()).stdout
    growing = GROWING_FRAME if pair == "snapshots" else GROWING_RANGE
    assert f"of it is live at <code>{growing}</code>" in dom
    assert (
        "pytorch-segments address space" if pair == "snapshots" else "observed device pages"
    ) in dom

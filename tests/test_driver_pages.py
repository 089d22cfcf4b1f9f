"""The observed model on genuine nsys exports with memory events (../shared/real_memory_traces,
skipped when absent), and on an export without times built from one of them (SPEC 1.2 §1–§2).

What the old flat-arena model got wrong on these files is what these tests pin: virtual gaps are
no free memory (no ratio above 1, no "236 TiB free"), module data 256 B apart is no overlap, and
a device holding a few bytes is not fragmented.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from nsysfrag.analysis import analyze
from nsysfrag.cli import cli
from nsysfrag.inputs import open_input
from nsysfrag.reporters.figures import fragmentation_timeline

REAL = Path(__file__).resolve().parent.parent.parent / "shared" / "real_memory_traces"
TRACES = sorted(REAL.glob("*.sqlite")) if REAL.is_dir() else []
MiB = 1 << 20
needs_real = pytest.mark.skipif(not TRACES, reason="../shared/real_memory_traces is absent")


def _json(path: Path, *args: str) -> dict:  # type: ignore[type-arg]
    result = CliRunner().invoke(cli, ["analyze", str(path), "--json", "-", *args])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def _named(fragment: str) -> Path:
    return next(p for p in TRACES if fragment in p.name)


@needs_real
@pytest.mark.parametrize("path", TRACES, ids=[p.name.split("__")[-1] for p in TRACES])
def test_no_ratio_exceeds_one_and_figures_add_up(path: Path) -> None:
    for s in _json(path)["spaces"]:
        for moment in (s["peak"], s["memory_peak"], s["final"], *s["ooms"]):
            assert 0 <= moment["global_frag"] <= 1 and 0 <= moment["local_frag"] <= 1
            if moment["reserved_bytes"] <= s["capacity_bytes"]:
                assert (moment["device_free_bytes"] + moment["stranded_bytes"]
                        + moment["allocated_bytes"] + moment["releasable_bytes"]) == s["capacity_bytes"]  # fmt: skip
            assert moment["free_bytes"] <= s["capacity_bytes"]
        assert s["memory_peak"]["reserved_bytes"] >= s["peak"]["reserved_bytes"]


@needs_real
def test_a_device_holding_a_few_bytes_is_not_fragmented() -> None:
    """The A100 GEMM pipeline ends holding 144 B of module data in one page: the arena model
    called it CRITICAL at 42.5 %; on pages it is ok, with 39.5 GiB of the device usable."""
    (s,) = _json(_named("db_10000_10_100"))["spaces"]
    assert s["health"] == "ok"
    final = s["final"]
    assert (final["live_bytes"], final["allocated_bytes"]) == (144, 0x310)
    assert final["reserved_bytes"] == 2 * MiB
    assert final["device_free_bytes"] == s["capacity_bytes"] - 2 * MiB
    assert final["largest_free_bytes"] == final["device_free_bytes"]
    # Module data at 0x..200000, +0x100, +0x110: footprints overlap, bytes do not.
    assert s["counts"]["overlaps"] == 0


@needs_real
def test_blocks_terabytes_apart_on_a_gh200_are_not_free_memory() -> None:
    """The GH200 SpMM export's blocks lie 236 TiB of addresses apart; the arena model read
    that as free memory (global frag 172.5 %). The device is 95 GiB and nearly empty."""
    (s,) = _json(_named("rgg_n_2_10_s0"))["spaces"]
    assert s["health"] == "ok" and s["max"]["global_frag"] < 0.01
    assert all(m["free_bytes"] <= s["capacity_bytes"] for m in (s["peak"], s["final"]))
    assert not s["span_mode"]


@needs_real
def test_an_export_without_times_tells_event_numbers_never_seconds(tmp_path: Path) -> None:
    """GIVEN a genuine export rewritten with start = 0 on every memory row (as nsys 2022.1
    writes them) WHEN analyzed THEN the moments are event numbers in JSON and in the terminal,
    the report says the export recorded no times, growth is 0, and the figures' x axis counts
    events."""
    source = _named("spmm_overlap_G5")
    path = tmp_path / "timeless.sqlite"
    shutil.copy(source, path)
    con = sqlite3.connect(path)
    con.execute("UPDATE CUDA_GPU_MEMORY_USAGE_EVENTS SET start = 0")
    con.commit()
    con.close()
    doc = _json(path)
    assert doc["trace"]["timestamps"] is False
    assert any("recorded no times" in w for w in doc["trace"]["warnings"])
    (s,) = doc["spaces"]
    events = s["counts"]["allocations"] + s["counts"]["frees"] + s["counts"]["unmatched_frees"]
    assert s["final"]["time_ns"] == events + s["counts"]["zero_size_allocs"] - 1
    assert s["growth_per_s"] == 0.0
    assert s["timeline"]["time_ns"] == sorted(s["timeline"]["time_ns"])
    result = CliRunner().invoke(cli, ["analyze", str(path)], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert not re.search(r"\d\.\d{3} s\b", result.output), result.output
    assert "event numbers" in result.output and re.search(r"\bevent \d+\b", result.output)
    assert "points/s" not in result.output  # no growth per second without seconds
    html = tmp_path / "r.html"
    assert CliRunner().invoke(cli, ["analyze", str(path), "--html", str(html), "-q"]).exit_code == 0
    page = html.read_text(encoding="utf-8")
    assert not re.search(r">\d+\.\d{3} s<", page) and "event 13" in page
    (space,) = analyze(open_input(path)).spaces
    assert fragmentation_timeline(space).axes[0].get_xlabel() == (
        "memory events in order (the export recorded no times)"
    )

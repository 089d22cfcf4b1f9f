"""The job document's summaries, worst rank, skew and heatmap, on hand-made rank documents.

The rank documents here carry SPEC 1.1's `health_basis` and `ooms[].verdict`, which the job's
reports read and show but never compute.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from rich.console import Console

from nsysfrag.checks.job_ranks import RankSummary, summaries_of
from nsysfrag.job.document import job_document
from nsysfrag.job.worker import RankOutcome
from nsysfrag.reporters.job import heatmap, html, terminal


def _state(t: int, g: float, live: int = 1 << 30) -> dict[str, Any]:
    return {"time_ns": t, "global_frag": g, "local_frag": g, "free_blocks": 3,
            "largest_free_bytes": 1 << 30, "free_bytes": 2 << 30, "live_bytes": live}  # fmt: skip


def _space(pid: int, times: list[int], frags: list[float], **extra: Any) -> dict[str, Any]:
    peak = max(range(len(frags)), key=lambda i: (frags[i], -i))
    space = {
        "pid": pid, "device": 0, "capacity_bytes": 80 << 30, "health": "ok",
        "counts": {"failed_allocations": 0}, "peak": _state(times[peak], frags[peak]),
        "final": _state(times[-1], frags[-1]),
        "max": {"global_frag": max(frags), "local_frag": max(frags), "free_blocks": 3,
                "live_bytes": 4 << 30},
        "hotspots": [], "timeline": {"time_ns": times, "global_frag": frags},
    }  # fmt: skip
    space.update(extra)
    return space


def _doc(*spaces: dict[str, Any]) -> dict[str, Any]:
    return {"schema": "nsysfrag/1", "trace": {"path": "x", "warnings": []},
            "model": {"name": "observed"}, "spaces": list(spaces)}  # fmt: skip


def _outcome(rank: int, doc: dict[str, Any] | None, error: str | None = None) -> RankOutcome:
    return RankOutcome(rank, f"rank{rank}.sqlite", document=doc, error=error, exit_code=2 if error else 0)


def test_the_summary_reads_basis_and_verdicts_from_the_document() -> None:
    critical = _space(
        7, [0, 10], [0.1, 0.5], health="critical",
        health_basis={"metric": "global_frag", "value": 0.5, "time_ns": 2_500_000_000},
        ooms=[{"time_ns": 5, "verdict": "fragmentation"}, {"time_ns": 6, "verdict": "capacity"},
              {"time_ns": 7, "verdict": "fragmentation"}],
        hotspots=[{"site": "step/fwd", "size_class": "1–2 MiB", "hole_bytes": 9, "out_of_order_frees": 1,
                   "pinned_by": ["step/bwd"]}],
    )  # fmt: skip
    calm = _space(8, [0, 10], [0.0, 0.05], health="ok", health_basis=None, ooms=[],
                  reserved_bytes_peak=3 << 30)  # fmt: skip
    s = RankSummary.of({"rank": 3, "path": "r3", "analysis": _doc(critical, calm)})
    assert (s.health, s.peak_global_frag, s.peak_pid) == ("critical", 0.5, 7)
    assert s.health_basis == {"metric": "global_frag", "value": 0.5, "time_ns": 2_500_000_000}
    assert (s.ooms, s.verdicts) == (3, (("capacity", 1), ("fragmentation", 2)))
    assert s.memory_kind == "mixed" and s.peak_memory_bytes == 4 << 30
    assert terminal.basis_text(s) == "global frag 50.0% at 2.500 s"
    assert terminal.oom_text(s) == "3: 1 capacity, 2 fragmentation"
    assert s.hotspot is not None and s.hotspot.site == "step/fwd"

    document = job_document([_outcome(3, _doc(critical, calm))])
    console = Console(width=160, record=True)
    terminal.render(summaries_of(document), document, console)
    text = console.export_text()
    assert "global frag 50.0% at 2.500 s" in text and "3: 1 capacity, 2 fragmentation" in text
    assert "record no health basis" not in text  # every rank has both
    narrow = Console(width=80, record=True)
    terminal.render(summaries_of(document), document, narrow)
    assert max(len(line) for line in narrow.export_text().splitlines()) <= 80
    page = html.render(summaries_of(document), document)
    assert "global frag 50.0% at 2.500 s" in page and ">fragmentation</td>" in page
    assert "global frag 50.0% at 2.500 s</p>" in page  # prose keeps the report's own form


def test_worst_ties_go_to_the_lower_rank_and_failed_ranks_are_listed() -> None:
    outcomes = [
        _outcome(5, _doc(_space(1, [0, 1], [0.3, 0.2]))),
        _outcome(2, _doc(_space(1, [0, 1], [0.1, 0.3]))),
        _outcome(1, None, "rank1.sqlite: not an SQLite database"),
        _outcome(0, _doc(_space(1, [0, 1], [0.0, 0.1]))),
    ]
    doc = job_document(outcomes)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 5]
    assert doc["ranks"][1] == {"rank": 1, "path": "rank1.sqlite", "error": "rank1.sqlite: not an SQLite database"}
    assert doc["failed_ranks"] == [1]
    assert doc["worst"] == {"rank": 2, "pid": 1, "device": 0, "metric": "peak.global_frag", "value": 0.3}
    frag = doc["skew"]["peak_global_frag"]
    assert (frag["max"], frag["max_rank"], frag["median"]) == (0.3, 2, 0.3)
    assert frag["max_over_median"] == pytest.approx(1.0)


def test_skew_over_a_zero_median_is_null_and_no_space_means_no_worst() -> None:
    doc = job_document([_outcome(0, _doc(_space(1, [0], [0.0]))), _outcome(1, _doc(_space(1, [0], [0.0])))])
    assert doc["skew"]["peak_global_frag"]["max_over_median"] is None
    empty = job_document([_outcome(0, _doc())])
    assert empty["worst"] is None and empty["skew"]["ranks"] == 0
    assert empty["skew"]["peak_global_frag"] == {"max": None, "max_rank": None, "median": None,
                                                "max_over_median": None}  # fmt: skip


def test_heatmap_cells_are_the_highest_value_of_the_step_function_in_each_slice() -> None:
    # Rank 0 runs 0..100 ns: 0.1 from 0, 0.5 from 25 to 30, 0.2 after; rank 1 ends at 50 ns.
    a = _space(1, [1000, 1025, 1030, 1100], [0.1, 0.5, 0.2, 0.2])
    b = _space(1, [7, 57], [0.45, 0.0])
    rows, span = heatmap.heat_rows(
        [{"rank": 0, "analysis": _doc(a)}, {"rank": 1, "analysis": _doc(b)}, {"rank": 2, "error": "x"}],
        columns=10,
    )
    assert span == 100
    assert [r.rank for r in rows] == [0, 1]
    assert rows[0].cells == (0.1, 0.1, 0.5, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2)
    assert rows[1].cells == (0.45, 0.45, 0.45, 0.45, 0.45, 0.0, None, None, None, None)
    svg = heatmap.svg(rows, span)
    # Equal neighbours are one rectangle: 3 runs a rank (then the legend).
    row_rects = re.findall(r'<rect x="\d+" y="(\d+)" width="\d+" height="14"', svg)
    assert row_rects.count("4") == 3 and row_rects.count("18") == 3
    assert heatmap.colour(0.5) == heatmap.COLOURS[-1] and heatmap.colour(0.0) == heatmap.COLOURS[0]
    assert heatmap.colour(0.2) == heatmap.COLOURS[4]  # 20 % (warn) starts a band


def test_a_rank_s_times_count_from_its_input_s_first_event_as_in_its_own_report() -> None:
    space = _space(
        4, [2_000_000_000, 2_500_000_000, 3_000_000_000], [0.1, 0.5, 0.2], health="critical",
        health_basis={"metric": "global_frag", "value": 0.5, "time_ns": 2_500_000_000},
        ooms=[{"time_ns": 2_750_000_000, "verdict": "unknown"}],
    )  # fmt: skip
    recorded = _doc(space)
    recorded["trace"]["first_event_ns"] = 1_900_000_000  # another space's event came first
    s = RankSummary.of({"rank": 0, "path": "r0", "analysis": recorded})
    assert (s.origin_ns, terminal.basis_text(s)) == (1_900_000_000, "global frag 50.0% at 0.600 s")
    # A document from before the key: its timelines' earliest point, each space's first event.
    older = RankSummary.of({"rank": 0, "path": "r0", "analysis": _doc(space)})
    assert (older.origin_ns, terminal.basis_text(older)) == (2_000_000_000, "global frag 50.0% at 0.500 s")

    document = job_document([_outcome(0, recorded)])
    console = Console(width=160, record=True)
    terminal.render(summaries_of(document), document, console)
    assert "at 0.600 s); health" in console.export_text()  # the worst rank's peak
    page = html.render(summaries_of(document), document)
    assert "at 0.600 s); health" in page
    assert '<td class="n">0.850 s</td>' in page  # the OOM
    assert "2.500" not in console.export_text() + page  # never the input's own clock
    rows, span = heatmap.heat_rows(document["ranks"])
    assert span == 1_100_000_000 and rows[0].cells[0] is None  # nothing before the rank's first point


def test_a_snapshot_without_times_tells_entries_not_seconds() -> None:
    space = _space(0, [0, 7, 9], [0.1, 0.5, 0.2], health="critical",
                   health_basis={"metric": "global_frag", "value": 0.5, "time_ns": 7})  # fmt: skip
    entries = _doc(space)
    entries["trace"].update(first_event_ns=0, timestamps=False)
    s = RankSummary.of({"rank": 0, "path": "r0", "analysis": entries})
    assert terminal.basis_text(s) == "global frag 50.0% at entry 7"
    assert terminal.at(s, s.peak_time_ns) == "entry 7"

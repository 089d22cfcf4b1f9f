"""The job's JSON document (schema ``nsysfrag-job/1``): its ranks, the worst rank and the skew.

``{"schema", "ranks": [{"rank", "path", "analysis" | "error"}], "worst", "skew"}``: each rank's
``analysis`` is its single-input document (``nsysfrag/1``) unchanged. The worst rank and the
skew are read from those documents through ``checks.job_ranks.RankSummary``, the same reading
the job's reports (``reporters/job/``) make of a document loaded again.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from nsysfrag.checks.job_ranks import RankSummary
from nsysfrag.job.worker import RankOutcome
from nsysfrag.schemas import JOB as SCHEMA

WORST_METRIC = "peak.global_frag"


def job_document(outcomes: Sequence[RankOutcome]) -> dict[str, Any]:
    """The job's document, ranks in rank order."""
    ranks: list[dict[str, Any]] = []
    for o in sorted(outcomes, key=lambda o: o.rank):
        entry: dict[str, Any] = {"rank": o.rank, "path": o.path}
        if o.document is not None:
            entry["analysis"] = o.document
        else:
            entry["error"] = o.error
        ranks.append(entry)
    summaries = [RankSummary.of(e) for e in ranks]
    return {
        "schema": SCHEMA,
        "ranks": ranks,
        "failed_ranks": [s.rank for s in summaries if not s.ok],
        "worst": worst(summaries),
        "skew": skew(summaries),
    }


def worst(summaries: Sequence[RankSummary]) -> dict[str, Any] | None:
    """The rank with the highest peak global fragmentation; ties go to the lower rank."""
    analyzed = [s for s in summaries if s.ok and s.spaces]
    if not analyzed:
        return None
    top = min(analyzed, key=lambda s: (-s.peak_global_frag, s.rank))
    return {
        "rank": top.rank,
        "pid": top.peak_pid,
        "device": top.peak_device,
        "metric": WORST_METRIC,
        "value": top.peak_global_frag,
    }


def skew(summaries: Sequence[RankSummary]) -> dict[str, Any]:
    """How far the worst rank is from the typical one: max / median across analyzed ranks."""
    analyzed = [s for s in summaries if s.ok and s.spaces]
    kinds = {s.memory_kind for s in analyzed}
    return {
        "ranks": len(analyzed),
        "peak_memory": {
            "metric": {"reserved": "reserved_bytes_peak", "live": "max.live_bytes"}.get(
                kinds.pop() if len(kinds) == 1 else "", "mixed"
            ),
            **_spread([(s.rank, s.peak_memory_bytes) for s in analyzed]),
        },
        "peak_global_frag": _spread([(s.rank, s.peak_global_frag) for s in analyzed]),
    }


def _spread(values: Sequence[tuple[int, float]]) -> dict[str, Any]:
    if not values:
        return {"max": None, "max_rank": None, "median": None, "max_over_median": None}
    rank, top = min(values, key=lambda v: (-v[1], v[0]))
    median = statistics.median(v for _, v in values)
    return {
        "max": top,
        "max_rank": rank,
        "median": median,
        "max_over_median": top / median if median > 0 else None,
    }

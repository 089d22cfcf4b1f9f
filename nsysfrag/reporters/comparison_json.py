"""A run-to-run comparison as JSON (schema ``nsysfrag-compare/1``).

``{"schema", "base", "current", "input", "model", "spaces": [...], "only_in_base",
"only_in_current"}``, or for two jobs ``{"schema", "job": true, "base", "current", "worst",
"ranks": [{"rank", "comparison" | "problem"}], "only_in_base", "only_in_current"}``. Each space:
its health, the verdict (text, and its pieces with the sites marked), every moment's figures in
both runs with their change, each per-site figure's changed sites ranked by the size of their
change, and what one run's document lacks. Keys are stable; new keys may be added.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nsysfrag.checks.comparison import Comparison, SpaceComparison
from nsysfrag.checks.space_changes import FigureChange, SiteFigure
from nsysfrag.checks.verdict import plain

if TYPE_CHECKING:
    from nsysfrag.checks.job_comparison import JobComparison

SCHEMA = "nsysfrag-compare/1"


def document(comparison: Comparison, base_name: str, current_name: str) -> dict[str, Any]:
    words = comparison.words
    return {
        "schema": SCHEMA,
        "base": base_name,
        "current": current_name,
        "input": words.input if words is not None else None,
        "model": words.model if words is not None else None,
        **comparison_document(comparison),
    }


def comparison_document(comparison: Comparison) -> dict[str, Any]:
    """The spaces of one comparison and those only one run has."""
    return {
        "spaces": [space_document(s) for s in comparison.spaces],
        "only_in_base": list(comparison.only_in_base),
        "only_in_current": list(comparison.only_in_current),
    }


def job_document(comparison: JobComparison, base_name: str, current_name: str) -> dict[str, Any]:
    ranks: list[dict[str, Any]] = []
    for r in comparison.ranks:
        entry: dict[str, Any] = {"rank": r.rank}
        if r.comparison is None:
            entry["problem"] = r.problem
        else:
            entry["comparison"] = comparison_document(r.comparison)
        ranks.append(entry)
    return {
        "schema": SCHEMA,
        "job": True,
        "base": base_name,
        "current": current_name,
        "worst": {"base": comparison.base_worst, "current": comparison.current_worst},
        "ranks": ranks,
        "only_in_base": list(comparison.only_in_base),
        "only_in_current": list(comparison.only_in_current),
    }


def space_document(s: SpaceComparison) -> dict[str, Any]:
    return {
        "base_space": s.base_space,
        "current_space": s.current_space,
        "health": {"base": s.base_health, "current": s.current_health},
        "verdict": plain(s.verdict),
        "verdict_pieces": [{"text": p.text, "site": p.site} for p in s.verdict],
        "moments": [
            {
                "moment": m.key,
                "label": m.label,
                "base_time_ns": m.base_time_ns,
                "current_time_ns": m.current_time_ns,
                "figures": [_figure(f) for f in m.figures],
            }
            for m in s.moments
        ],
        "metrics": [
            {
                "metric": d.key,
                "label": d.label,
                "base": d.base,
                "current": d.current,
                "delta": d.delta,
            }
            for d in s.deltas
        ],
        "sites": {f.key: sites_document(f) for f in s.sites},
        "missing": list(s.missing),
    }


def _figure(f: FigureChange) -> dict[str, Any]:
    return {
        "figure": f.key,
        "label": f.label,
        "base": f.base,
        "current": f.current,
        "delta": f.delta,
        "relative": f.relative,
    }


def sites_document(f: SiteFigure) -> dict[str, Any]:
    """The sites whose figure changed, largest change first; ``base``/``current`` is null where
    that run's document did not list the site (it listed only its largest)."""
    changed = [x for x in f.changes if x.delta != 0]
    return {
        "label": f.label,
        "base_total_bytes": f.base_total,
        "current_total_bytes": f.current_total,
        "listed_only": f.listed_only,
        "unchanged_sites": len(f.changes) - len(changed),
        "changes": [
            {
                "site": x.site,
                "base_site": x.base_site,
                "status": x.status,
                "base_bytes": x.base,
                "current_bytes": x.current,
                "delta_bytes": x.delta,
            }
            for x in changed
        ],
    }

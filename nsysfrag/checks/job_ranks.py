"""A job's document read back: each rank reduced to the figures the job's reports show.

``RankSummary.of`` reads one entry of ``ranks`` (``{"rank", "path", "analysis" | "error"}``);
everything comes from the rank's single-input document — health, its basis and the OOM verdicts
included, which the single-input analysis decides — so a job document loaded from disk is
summarized exactly as the job that wrote it. Here, below the reporters, so that the job's
reports and its document (``job/document.py``) both read ranks the one way.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from nsysfrag.checks.document_words import time_origin, time_span
from nsysfrag.checks.gates import HEALTH_ORDER


@dataclass(frozen=True, slots=True)
class Hotspot:
    site: str
    size_class: str
    hole_bytes: int
    out_of_order_frees: int


@dataclass(frozen=True, slots=True)
class RankSummary:
    """One rank, reduced to the figures of the job's table (its worst space for each)."""

    rank: int
    path: str
    error: str | None = None
    model: str = ""
    spaces: int = 0
    health: str = "ok"
    # From the space that set the health; None when ok. The document's own `health_basis`
    # (metric, value, time_ns); `basis_known` is False for a document without that key.
    health_basis: dict[str, Any] | None = None
    basis_known: bool = False
    peak_global_frag: float = 0.0
    peak_pid: int = 0
    peak_device: int = 0
    peak_time_ns: int = 0
    peak_memory_bytes: int = 0
    memory_kind: str = "live"  # "reserved" (snapshots) or "live" (nsys)
    ooms: int = 0
    verdicts: tuple[tuple[str, int], ...] = ()  # (verdict, count), from `ooms[].verdict`
    hotspot: Hotspot | None = None
    warnings: int = 0
    # What the rank's own reports count time from, and whether its times are timestamps
    # (False: entry numbers), so the job says "at 2.028 s" where the rank's report does.
    origin_ns: int = 0
    timestamps: bool = True
    span_ns: int | None = None  # the input's, from origin_ns: the times' resolution

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def of(cls, entry: dict[str, Any]) -> RankSummary:
        rank, path = int(entry["rank"]), str(entry["path"])
        if "analysis" not in entry:
            return cls(rank, path, error=str(entry.get("error") or "not analyzed"))
        doc = entry["analysis"]
        spaces: list[dict[str, Any]] = doc["spaces"]
        trace = doc.get("trace", {})
        summary = cls(
            rank,
            path,
            model=str(doc.get("model", {}).get("name", "observed")),
            spaces=len(spaces),
            warnings=len(trace.get("warnings", [])),
            origin_ns=time_origin(doc),
            timestamps=bool(trace.get("timestamps", True)),
            span_ns=time_span(doc, time_origin(doc)),
        )
        if not spaces:
            return summary
        # Ties go to the first space, in the document's (pid, device) order.
        worst_health = max(spaces, key=lambda s: HEALTH_ORDER[s["health"]])
        peak = max(spaces, key=lambda s: s["peak"]["global_frag"])
        memory = [_peak_memory(s) for s in spaces]
        verdicts: Counter[str] = Counter()
        ooms = 0
        for s in spaces:
            if "ooms" in s:
                ooms += len(s["ooms"])
                verdicts.update(str(o.get("verdict", "unknown")) for o in s["ooms"])
            else:  # a document from before `ooms`: its count, without verdicts
                ooms += len(s.get("oom_events", ())) or int(s["counts"]["failed_allocations"])
        hotspots = [
            Hotspot(h["site"], h["size_class"], int(h["hole_bytes"]), int(h["out_of_order_frees"]))
            for s in spaces
            for h in s["hotspots"][:1]
        ]
        return cls(
            rank,
            path,
            model=summary.model,
            spaces=len(spaces),
            health=str(worst_health["health"]),
            health_basis=worst_health.get("health_basis"),
            basis_known="health_basis" in worst_health,
            peak_global_frag=float(peak["peak"]["global_frag"]),
            peak_pid=int(peak["pid"]),
            peak_device=int(peak["device"]),
            peak_time_ns=int(peak["peak"]["time_ns"]),
            peak_memory_bytes=max(m for m, _ in memory),
            memory_kind=memory[0][1] if len({k for _, k in memory}) == 1 else "mixed",
            ooms=ooms,
            verdicts=tuple(sorted(verdicts.items())),
            hotspot=max(hotspots, key=lambda h: (h.hole_bytes, h.out_of_order_frees), default=None),
            warnings=summary.warnings,
            origin_ns=summary.origin_ns,
            timestamps=summary.timestamps,
            span_ns=summary.span_ns,
        )


def _peak_memory(space: dict[str, Any]) -> tuple[int, str]:
    """Peak reserved memory where the model has it (a snapshot), else peak live bytes."""
    if "reserved_bytes_peak" in space:
        return int(space["reserved_bytes_peak"]), "reserved"
    return int(space["max"]["live_bytes"]), "live"


def summaries_of(document: dict[str, Any]) -> list[RankSummary]:
    return [RankSummary.of(e) for e in document["ranks"]]

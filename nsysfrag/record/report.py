"""What a record adds to a rank's report: the sampled timeline over the whole run (not only the
snapshot's history window), the ratings of the state snapshots, the alerts and the
out-of-memory moments the allocator reported; as the ``recorded`` section of the rank's JSON
document, and as lines under the job's terminal report.

Times in the section are on the rank document's own clock (ns, like every ``time_ns`` of its
spaces: since the snapshot's ``time_origin_unix_us``), so a report places a sample where it
places the snapshot's events; samples before the snapshot's history window come out negative.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.text import Text

from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.inputs.torch_snapshot.facts import facts_beside
from nsysfrag.moments import moment_since
from nsysfrag.record.layout import RankFolder, json_lines
from nsysfrag.record.watch import ALERTS, RATINGS
from nsysfrag.reporters.layout import Prose, outside

POINTS = 2000  # at most this many points per series, as the document's own timeline
TIMELINE_KEYS = ("reserved_bytes", "allocated_bytes", "active_bytes", "device_free_bytes")
RATING_KEYS = ("global_frag", "local_frag", "free_blocks")


def recorded_section(folder: RankFolder, snapshot: Path, document: dict[str, Any]) -> dict[str, Any]:
    """The ``recorded`` section of the rank's document."""
    warnings: list[str] = []
    facts = facts_beside(snapshot, warnings)
    origin = _origin_ns(document)
    samples, ooms = _timeline(folder.timeline)
    if origin is None:  # no times in the snapshot: the record's own first moment is 0
        origin = min((s["time_unix_ns"] for s in samples), default=0)
    ratings = list(_lines(folder.path / RATINGS))
    alerts = list(_lines(folder.path / ALERTS))
    costs = [s["cost_s"] for s in samples if isinstance(s.get("cost_s"), float)]
    state_costs = [s["state_cost_s"] for s in samples if isinstance(s.get("state_cost_s"), float)]
    pauses = _pauses(samples)
    return {
        "folder": folder.path.name,
        "snapshot": snapshot.name,
        "snapshot_reason": facts.reason if facts else None,
        "rank": folder.rank,
        "named_by": facts.named_by if facts else None,
        "attempt": folder.attempt,
        "host": facts.host if facts else None,
        "pid": facts.pid if facts else None,
        "world_size": facts.world_size if facts else None,
        "torch_version": facts.torch_version if facts else None,
        "origin_unix_ns": origin,
        "samples": len({s.get("sample") for s in samples}),
        "sample_cost_s": _spread(costs),
        "state_snapshots": len(state_costs),
        "state_cost_s": _spread(state_costs),
        # What the recorder stopped the program for: each sample, with its state snapshot.
        "pause_s": {"mean": statistics.fmean(pauses), "max": max(pauses)} if pauses else None,
        "states_refused": sum(1 for s in _per_sample(samples) if "state_refused_s" in s),
        "timeline": _columns(samples, origin, ("device", *TIMELINE_KEYS)),
        "ratings": _columns(ratings, origin, ("device", *RATING_KEYS, "pinning_site")),
        "alerts": [
            {
                "time_ns": _int(a.get("time_unix_ns")) - origin,
                "device": a.get("device"),
                "metric": a.get("metric"),
                "value": a.get("value"),
                "level": a.get("level"),
                "pinning_site": a.get("pinning_site"),
            }
            for a in alerts
        ],
        "ooms": [
            {
                "time_ns": _int(o.get("time_unix_ns")) - origin,
                "device": o.get("device"),
                "requested_bytes": o.get("requested_bytes"),
                "device_free_bytes": o.get("device_free_bytes"),
                "snapshot": o.get("snapshot"),
            }
            for o in ooms
        ],
        "warnings": warnings,
    }


def _origin_ns(document: dict[str, Any]) -> int | None:
    for space in document.get("spaces", []):
        us = space.get("time_origin_unix_us")
        if isinstance(us, int):
            return us * 1000
    return None


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a ``.jsonl`` file that say when they were written (every sample,
    rating and alert does; a line without its time places nothing)."""
    return (r for r in json_lines(path) if isinstance(r.get("time_unix_ns"), int))


def _timeline(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    samples: list[dict[str, Any]] = []
    ooms: list[dict[str, Any]] = []
    for record in _lines(path):
        (ooms if record.get("event") == "oom" else samples).append(record)
    return samples, ooms


def _columns(records: Sequence[dict[str, Any]], origin: int, keys: Sequence[str]) -> dict[str, list[Any]]:
    """``time_ns`` and each key as columns, at most POINTS rows (spread evenly, the last
    kept)."""
    rows = list(records)
    if len(rows) > POINTS:
        keep = np.unique(np.linspace(0, len(rows) - 1, POINTS).round().astype(np.int64))
        rows = [rows[i] for i in keep]
    out: dict[str, list[Any]] = {"time_ns": [_int(r["time_unix_ns"]) - origin for r in rows]}
    for key in keys:
        out[key] = [_plain(r.get(key)) for r in rows]
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return value
    return str(value)[:200]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _per_sample(samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per sample (a sample writes a line per device, each with the same costs)."""
    seen: dict[Any, dict[str, Any]] = {}
    for s in samples:
        seen.setdefault(s.get("sample"), s)
    return list(seen.values())


def _pauses(samples: Sequence[dict[str, Any]]) -> list[float]:
    out = []
    for s in _per_sample(samples):
        cost, state = s.get("cost_s"), s.get("state_cost_s", 0.0)
        if isinstance(cost, (int, float)) and isinstance(state, (int, float)):
            out.append(float(cost) + float(state))
    return out


def _spread(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "max": max(values)}


# ---------------------------------------------------------------------- the terminal


def render_recorded(ranks: Sequence[dict[str, Any]], console: Console) -> None:
    """A paragraph per recorded rank of a job document's ``ranks``."""
    recorded = [(e, e["analysis"]["recorded"]) for e in ranks if "recorded" in e.get("analysis", {})]
    if not recorded:
        return
    console.print(Prose(Text("Recorded live (nsysfrag record):", style="bold")))
    for entry, r in recorded:
        doc = entry["analysis"]
        trace = doc.get("trace", {})
        origin = int(trace.get("first_event_ns") or 0)
        console.print(Prose(outside(_rank_words(r, origin))))


def _rank_words(r: dict[str, Any], origin: int) -> str:
    def at(time_ns: int) -> str:
        return moment_since(time_ns, origin)

    parts = [f"rank {r['rank']}" + _named(r)]
    times = r["timeline"]["time_ns"]
    if r["samples"]:
        span = (times[-1] - times[0]) / 1e9 if len(times) > 1 else 0.0
        cost = r["sample_cost_s"]
        samples = _count(r["samples"], "sample")
        parts.append(
            f"{samples} over {span:.1f} s (each {cost['median'] * 1e3:.2f} ms, at most"
            f" {cost['max'] * 1e3:.2f} ms)" if cost else samples
        )
    else:
        parts.append("no samples")
    pause = r.get("pause_s")
    if pause:
        parts.append(
            f"longest pause {pause['max'] * 1e3:.1f} ms (mean {pause['mean'] * 1e3:.2f} ms)"
            + (f", {_count(r['states_refused'], 'state snapshot')} not taken (longer)"
               if r.get("states_refused") else "")
        )  # fmt: skip
    ratings = r["ratings"]
    if ratings["time_ns"]:
        values = ratings["global_frag"]
        k = int(np.argmax(values))
        state = r["state_cost_s"]
        parts.append(
            f"{_count(len(values), 'state rating')}, worst global frag {values[k]:.1%} at"
            f" {at(ratings['time_ns'][k])}"
            + (f" (a state snapshot cost {state['median'] * 1e3:.1f} ms)" if state else "")
        )
    alerts = r["alerts"]
    if alerts:
        first = alerts[0]
        value = first["value"]
        shown = f"{value:.1%}" if first["metric"] != "free_blocks" else f"{value}"
        parts.append(
            f"{len(alerts)} alert{'s' if len(alerts) > 1 else ''}, the first {first['metric']}"
            f" {shown} ({first['level']}) at {at(first['time_ns'])}"
        )
    else:
        parts.append("no alerts")
    ooms = r["ooms"]
    if ooms:
        taken = [o["snapshot"] for o in ooms if o["snapshot"]]
        parts.append(
            f"{len(ooms)} out-of-memory{'s' if len(ooms) > 1 else ''} (first at"
            f" {at(ooms[0]['time_ns'])}, {format_bytes(ooms[0]['requested_bytes'] or 0)}"
            " refused)" + (f", snapshots {', '.join(taken)}" if taken else "")
        )
    parts.append(f"analyzed {r['folder']}/{r['snapshot']}")
    return " · ".join(parts)


def _named(r: dict[str, Any]) -> str:
    """How the rank got its name, where a launcher's ``RANK`` did not give it."""
    by, attempt = r.get("named_by"), r.get("attempt") or 0
    said = {None: "", "RANK": "", "device": " (by its device)", "pid": " (by its pid)"}.get(
        by, f" (${by})"
    )
    return said + (f" attempt {attempt}" if attempt else "")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"

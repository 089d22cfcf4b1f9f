"""What one run of ``record --try`` measured, rank by rank, from its record folder: the
allocator's own figures (``memory_stats()`` in the facts beside each snapshot and in every
timeline line: peak reserved, peak allocated, OOMs, retries), the fragmentation at the moment
of peak memory (the rank's snapshot analyzed as ``analyze`` would), its wall time, and its time
per step where the program reports steps.

Every file is read as hostile input (bounded, each figure checked): a figure that cannot be
read is missing (None), never invented.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsysfrag.inputs.torch_snapshot.facts import FACTS_MAX_BYTES
from nsysfrag.record.bootstrap.nsysfrag_recorder.names import STEPS, TIMELINE, facts_name
from nsysfrag.record.layout import RankFolder, json_lines, process_events, rank_folders

_MAX = 1 << 62


@dataclass(frozen=True, slots=True)
class RankFigures:
    rank: int
    folder: str
    peak_reserved_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    ooms: int = 0
    alloc_retries: int = 0
    frag_at_peak: float | None = None  # global fragmentation at the rank's peak memory
    wall_s: float | None = None  # CUDA initialized → the final snapshot
    step_s: float | None = None  # seconds per monitor().step()
    steps: int = 0
    snapshot: Path | None = None
    document: dict[str, Any] | None = field(default=None, compare=False)  # analyze's, for gates
    analysis_error: str | None = None


def measure_run(folder: Path, granularity: int) -> list[RankFigures]:
    """Every rank of the run's record folder (a rank's second process left out, as ``analyze``
    does), by rank."""
    started = _cuda_started(folder)
    out, seen = [], set()
    for r in rank_folders(folder):
        if r.rank in seen:
            continue
        seen.add(r.rank)
        out.append(_rank(r, started, granularity))
    return out


def _rank(r: RankFolder, started: dict[int, int], granularity: int) -> RankFigures:
    stats = _stats(r)
    final = _read_json(r.final.with_name(facts_name(r.final.name))) if r.final else None
    wall = None
    pid, ended = _int(_get(final, "pid")), _int(_get(final, "time_unix_ns"))
    if pid is not None and ended is not None and pid in started and ended >= started[pid]:
        wall = (ended - started[pid]) / 1e9
    steps, step_s = _steps(r.path / STEPS)
    document, error, frag = None, None, None
    if r.snapshot is not None:
        document, error = _analysis(r, granularity)
        frag = _frag_at_peak(document) if document else None
    return RankFigures(
        rank=r.rank,
        folder=r.path.name,
        peak_reserved_bytes=stats.get("reserved"),
        peak_allocated_bytes=stats.get("allocated"),
        ooms=stats.get("ooms", 0),
        alloc_retries=stats.get("retries", 0),
        frag_at_peak=frag,
        wall_s=wall,
        step_s=step_s,
        steps=steps,
        snapshot=r.snapshot,
        document=document,
        analysis_error=error,
    )


# The allocator's cumulative figures: the largest value any source gives is the run's.
_STATS = {
    "reserved": ("reserved_bytes.all.peak", "reserved_bytes_peak"),
    "allocated": ("allocated_bytes.all.peak", "allocated_bytes_peak"),
    "ooms": ("num_ooms", "ooms"),
    "retries": ("num_alloc_retries", "alloc_retries"),
}


def _stats(r: RankFolder) -> dict[str, int]:
    """The peaks and counts, from the facts of the final and OOM snapshots (``memory_stats()``
    whole) and every timeline line (its chosen keys): one device per rank is the rule; a rank
    on several reports its largest."""
    found: dict[str, int] = {}
    ooms_seen = 0

    def take(values: dict[str, Any], full: bool) -> None:
        for name, (full_key, line_key) in _STATS.items():
            v = _int(values.get(full_key if full else line_key))
            if v is not None:
                found[name] = max(found.get(name, 0), v)

    for snapshot in ([r.final] if r.final else []) + list(r.ooms):
        facts = _read_json(snapshot.with_name(facts_name(snapshot.name)))
        for d in _get(facts, "devices") or []:
            if isinstance(d, dict) and isinstance(d.get("memory_stats"), dict):
                take(d["memory_stats"], True)
    for line in json_lines(r.path / TIMELINE):
        if line.get("event") == "oom":
            ooms_seen += 1
        else:
            take(line, False)
    # An OOM the observer saw counts even when the process died before memory_stats said it.
    found["ooms"] = max(found.get("ooms", 0), ooms_seen)
    return found


def _cuda_started(folder: Path) -> dict[int, int]:
    """pid → when its CUDA started (``processes.jsonl``)."""
    out: dict[int, int] = {}
    for e in process_events(folder):
        pid, t = _int(e.get("pid")), _int(e.get("time_unix_ns"))
        if e.get("event") == "cuda" and pid is not None and t is not None:
            out.setdefault(pid, t)
    return out


def _steps(path: Path) -> tuple[int, float | None]:
    """(the last step reported, seconds per step between the first and last lines)."""
    points = []
    for line in json_lines(path):
        step, at = _int(line.get("step")), _int(line.get("time_unix_ns"))
        if step is not None and at is not None:
            points.append((step, at))
    if not points:
        return 0, None
    (s0, t0), (s1, t1) = min(points), max(points)
    return s1, ((t1 - t0) / 1e9 / (s1 - s0)) if s1 > s0 and t1 >= t0 else None


def _analysis(r: RankFolder, granularity: int) -> tuple[dict[str, Any] | None, str | None]:
    """The rank's snapshot analyzed exactly as ``nsysfrag analyze`` would (its document)."""
    from nsysfrag.job.worker import RankTask, analyze_rank

    assert r.snapshot is not None
    outcome = analyze_rank(RankTask(r.rank, str(r.snapshot), None, granularity))
    return outcome.document, outcome.error


def _frag_at_peak(document: dict[str, Any]) -> float | None:
    """Global fragmentation at the moment of peak memory, the worst of the rank's devices."""
    values = [
        float(s["memory_peak"]["global_frag"])
        for s in document.get("spaces", [])
        if isinstance(s.get("memory_peak"), dict)
    ]
    return max(values) if values else None


# ---------------------------------------------------------------------- bounded reading


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > FACTS_MAX_BYTES:
            return None
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _get(data: dict[str, Any] | None, key: str) -> Any:
    return data.get(key) if isinstance(data, dict) else None


def _int(value: Any) -> int | None:
    """A non-negative integer figure (a bool is not one), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX:
        return None
    return value

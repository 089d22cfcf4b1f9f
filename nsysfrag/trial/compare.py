"""The round compared: each run's figures per rank and for the job, beside what ``whatif``
predicted for its setting and the prediction's error on it; per setting the measured gain over
the baseline and the bar it must clear; the verdict; all of it as the ``nsysfrag-try/1``
document, which the terminal and HTML reports and the ``--fail-on`` gates read.

The verdict rule. A setting is kept only when every run of it ended as the baseline's did (by
itself or by ``--duration``, with no more OOMs), and either it removes out-of-memory errors the
baseline had in every round, or its job's peak reserved memory (the worst rank's: each device
is its own limit) is lower than the baseline's by more than the bar: the run-to-run spread
with ``--repeat`` (the widest of the baseline's and the setting's, max − min over the median),
else the what-if's error on the baseline (how far a replay of that very run is from what it
measured), and never less than 1 %. Of the settings kept, the one that removes the most OOMs,
then saves the most, is the verdict.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nsysfrag import __version__
from nsysfrag.trial.measure import RankFigures
from nsysfrag.trial.predict import Predictions
from nsysfrag.trial.rounds import DURATION, EXIT, Round, RunOutcome
from nsysfrag.trial.settings import BASELINE

SCHEMA = "nsysfrag-try/1"
MIN_GAIN = 0.01  # below this a saving is noise whatever else is known


@dataclass(frozen=True, slots=True)
class Measured:
    """One run: its outcome, its ranks' figures, and why it recorded nothing (if it did not)."""

    outcome: RunOutcome
    ranks: list[RankFigures]
    unrecorded: str | None = None
    # The PYTORCH_CUDA_ALLOC_CONF a rank saw without the run's setting in it (the program
    # replaced the variable itself): the run measured something else.
    overridden: str | None = None


def round_document(
    command: Sequence[str],
    the_round: Round,
    measured: Sequence[Measured],
    predictions: dict[int, Predictions],
    policies: dict[str, str],
    duration_s: float | None,
    repeats: int,
    environment: dict[str, str],
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The ``nsysfrag-try/1`` document. ``predictions`` are by baseline rank, ``policies`` the
    ``whatif`` policy of each setting."""
    runs = [_run(m, predictions, policies.get(m.outcome.plan.label)) for m in measured]
    labels = list(dict.fromkeys(r["setting"] for r in runs))
    base_runs = [r for r in runs if r["setting"] == BASELINE]
    base_error = _baseline_error(base_runs)
    settings = [_setting(s, [r for r in runs if r["setting"] == s], base_runs, base_error, repeats)
                for s in labels if s != BASELINE]  # fmt: skip
    return {
        "schema": SCHEMA,
        "nsysfrag_version": __version__,
        "command": list(command),
        "environment": environment,
        "duration_s": duration_s,
        "repeat": repeats,
        "stopped": the_round.stopped,
        "runs": runs,
        "whatif_baseline_error": base_error,
        "settings": settings,
        "refused": [{"setting": s, "reason": why} for s, why in the_round.refused],
        "verdict": _verdict(settings, base_runs),
        "notes": list(notes),
    }


def _run(m: Measured, predictions: dict[int, Predictions], policy: str | None) -> dict[str, Any]:
    o = m.outcome
    ranks = [_rank(r, predictions.get(r.rank), policy, o.plan.setting is None) for r in m.ranks]
    return {
        "setting": o.plan.label,
        "round": o.plan.repeat,
        "folder": o.plan.folder.name,
        "conf_variable": o.conf_variable,
        "conf": o.conf,
        "exit_code": o.exit_code,
        "ended": o.ended,
        "wall_s": round(o.wall_s, 3),
        "recorded": bool(ranks),
        "unrecorded": m.unrecorded,
        "overridden": m.overridden,
        "policy": policy,
        "ranks": ranks,
        "job": _job(ranks, o.wall_s),
    }


def _rank(
    r: RankFigures, p: Predictions | None, policy: str | None, baseline: bool
) -> dict[str, Any]:
    predicted = None
    if p is not None:
        pick = p.baseline if baseline else p.policies.get(policy or "")
        if pick is not None:
            predicted = {
                "policy": pick.policy,
                "peak_reserved_bytes": pick.peak_reserved_bytes,
                "simulated_ooms": pick.simulated_ooms,
                "error": _error(pick.peak_reserved_bytes, r.peak_reserved_bytes),
            }
    return {
        "rank": r.rank,
        "folder": r.folder,
        "peak_reserved_bytes": r.peak_reserved_bytes,
        "peak_allocated_bytes": r.peak_allocated_bytes,
        "ooms": r.ooms,
        "alloc_retries": r.alloc_retries,
        "frag_at_peak": r.frag_at_peak,
        "wall_s": None if r.wall_s is None else round(r.wall_s, 3),
        "steps": r.steps,
        "step_s": r.step_s,
        "snapshot": None if r.snapshot is None else f"{r.folder}/{r.snapshot.name}",
        "analysis_error": r.analysis_error,
        "predicted": predicted,
        "whatif_error": None if p is None or predicted is not None else p.error,
    }


def _job(ranks: Sequence[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """The job: the worst rank's peaks (each device is its own limit), every rank's OOMs and
    retries, the slowest rank's step."""

    def worst(key: str) -> Any:
        values = [r[key] for r in ranks if r[key] is not None]
        return max(values) if values else None

    predicted = [r["predicted"]["peak_reserved_bytes"] for r in ranks if r["predicted"]]
    peak = worst("peak_reserved_bytes")
    job_prediction = max(predicted) if predicted and len(predicted) == len(ranks) else None
    return {
        "peak_reserved_bytes": peak,
        "peak_allocated_bytes": worst("peak_allocated_bytes"),
        "ooms": sum(r["ooms"] for r in ranks),
        "alloc_retries": sum(r["alloc_retries"] for r in ranks),
        "frag_at_peak": worst("frag_at_peak"),
        "wall_s": round(wall_s, 3),
        "step_s": worst("step_s"),
        "predicted_peak_reserved_bytes": job_prediction,
        "predicted_ooms": sum(r["predicted"]["simulated_ooms"] for r in ranks if r["predicted"])
        if job_prediction is not None
        else None,
        "whatif_error": _error(job_prediction, peak),
    }


def _error(predicted: int | None, measured: int | None) -> float | None:
    """The prediction's error on the measured run: (predicted − measured) / measured."""
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


def _baseline_error(base_runs: Sequence[dict[str, Any]]) -> float | None:
    errors = [abs(e) for r in base_runs if (e := r["job"]["whatif_error"]) is not None]
    return errors[0] if errors else None  # the first round's baseline: the snapshot replayed


def _peaks(runs: Sequence[dict[str, Any]]) -> list[int]:
    return [r["job"]["peak_reserved_bytes"] for r in runs if r["job"]["peak_reserved_bytes"]]


def _spread(values: Sequence[int]) -> float | None:
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def _finished(run: dict[str, Any]) -> bool:
    """Ended by itself with exit code 0, or by --duration."""
    by_itself = run["ended"] == EXIT and run["exit_code"] == 0
    return bool(run["recorded"]) and (run["ended"] == DURATION or by_itself)


def _setting(
    label: str,
    runs: Sequence[dict[str, Any]],
    base_runs: Sequence[dict[str, Any]],
    base_error: float | None,
    repeats: int,
) -> dict[str, Any]:
    peaks, base_peaks = _peaks(runs), _peaks(base_runs)
    measured = round(statistics.median(peaks)) if peaks else None
    base = round(statistics.median(base_peaks)) if base_peaks else None
    gain = (base - measured) / base if measured is not None and base else None
    spreads = [s for s in (_spread(peaks), _spread(base_peaks)) if s is not None]
    spread = max(spreads) if spreads else None
    if repeats > 1:
        bar, basis = max(MIN_GAIN, spread or 0.0), "spread"
    elif base_error is not None:
        bar, basis = max(MIN_GAIN, base_error), "whatif_error"
    else:
        bar, basis = None, None
    ooms = [r["job"]["ooms"] for r in runs]
    base_ooms = [r["job"]["ooms"] for r in base_runs]
    errors = [r["job"]["whatif_error"] for r in runs if r["job"]["whatif_error"] is not None]
    entry: dict[str, Any] = {
        "setting": label,
        "runs": len(runs),
        "peak_reserved_bytes": measured,
        "baseline_peak_reserved_bytes": base,
        "gain": gain,
        "spread": spread,
        "bar": bar,
        "bar_basis": basis,
        "ooms": max(ooms, default=0),
        "baseline_ooms": min(base_ooms, default=0),
        "predicted_peak_reserved_bytes": (
            runs[0]["job"]["predicted_peak_reserved_bytes"] if runs else None
        ),
        "whatif_error": errors[0] if errors else None,
    }
    entry["kept"], entry["why"] = _judge(entry, runs, base_runs)
    return entry


def _judge(
    e: dict[str, Any], runs: Sequence[dict[str, Any]], base_runs: Sequence[dict[str, Any]]
) -> tuple[bool, str]:
    """Kept or not, and why (data: the words are the reports')."""
    if not runs or not all(r["recorded"] for r in runs):
        return False, "unrecorded"
    if any(r["overridden"] is not None for r in runs):
        return False, "overridden"
    if e["ooms"] > e["baseline_ooms"]:
        return False, "more_ooms"
    if not all(_finished(r) for r in runs):
        return False, "failed" if all(_finished(r) for r in base_runs) else "baseline_failed"
    if e["ooms"] < e["baseline_ooms"]:
        return True, "fewer_ooms"
    if e["gain"] is None:
        return False, "unmeasured"
    if e["bar"] is None:
        return False, "no_bar"
    return (True, "gain") if e["gain"] > e["bar"] else (False, "within_bar")


def _verdict(
    settings: Sequence[dict[str, Any]], base_runs: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    kept = [s for s in settings if s["kept"]]
    best = max(kept, key=lambda s: (s["baseline_ooms"] - s["ooms"], s["gain"] or 0.0), default=None)
    return {
        "keep": best["setting"] if best else None,
        "baseline_recorded": any(r["recorded"] for r in base_runs),
        "line": verdict_line(best, settings),
    }


def verdict_line(best: dict[str, Any] | None, settings: Sequence[dict[str, Any]]) -> str:
    from nsysfrag.analysis.metrics import format_bytes

    if best is not None:
        if best["why"] == "fewer_ooms":
            return (f"keep {best['setting']}: it removes the baseline's out-of-memory errors"
                    f" ({best['baseline_ooms']} → {best['ooms']})")  # fmt: skip
        before = format_bytes(best["baseline_peak_reserved_bytes"])
        after = format_bytes(best["peak_reserved_bytes"])
        return (
            f"keep {best['setting']}: peak reserved {before} → {after} ({change(best['gain'])})"
            f" on the worst rank, beyond the {bar_words(best['bar_basis'])} ({best['bar']:.1%})"
        )
    if not settings:
        return "keep the baseline: no setting was run"
    return "keep the baseline: " + "; ".join(f"{s['setting']} {_not_kept(s)}" for s in settings)


def bar_words(basis: str | None) -> str:
    """What a bar was measured from, in words."""
    return "run-to-run spread" if basis == "spread" else "what-if's error on the baseline"


def change(gain: float) -> str:
    """A gain as the change in peak reserved: 0.25 → "-25.0%" (never "-0.0%")."""
    return f"{0.0 - gain + 0.0:+.1%}"



def _not_kept(s: dict[str, Any]) -> str:
    why = s["why"]
    if why == "within_bar":
        return (
            f"changed peak reserved by {change(s['gain'] or 0.0)}, within the"
            f" {bar_words(s['bar_basis'])} ({s['bar']:.1%})"
        )
    return {
        "unrecorded": "recorded nothing",
        "overridden": "never reached the allocator (the program replaced PYTORCH_CUDA_ALLOC_CONF)",
        "failed": "failed (see its exit code)",
        "baseline_failed": "cannot be compared (the baseline failed too)",
        "more_ooms": f"ran out of memory ({s['ooms']} OOMs, the baseline {s['baseline_ooms']})",
        "unmeasured": "has no peak reserved to compare",
        "no_bar": "has no spread or what-if error to weigh its gain against (run with --repeat 3)",
    }.get(why, why)

"""Metrics across stored runs: series per space, sparklines, and the regression check.

Pure functions over ``StoredRun`` values; nothing here reads a database or prints.

Spaces are followed across runs by device, not pid (pids change from run to run): the key of
a space is its device, and when one run has several processes on a device, the n-th of them in
pid order (as ``compare`` pairs spaces); spaces of a model other than observed are kept apart.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.checks.keys import HEALTH, KNOWN, resolve
from nsysfrag.history.store import StoredRun, StoredSpace
from nsysfrag.models.observed import MODEL_NAME

SPARK_CHARS = "▁▂▃▄▅▆▇█"
DEFAULT_METRIC = "global_frag"
# For these a smaller value is the regression.
HIGHER_IS_BETTER = frozenset({"peak.largest_free_bytes", "final.largest_free_bytes"})
# Every numeric key of a space of the analyze JSON (checks.keys), as `--fail-on` takes them;
# pid and device identify a space, they do not trend.
NUMERIC_METRICS = tuple(sorted(k for k in KNOWN if k not in (HEALTH, "pid", "device")))


def resolve_metric(name: str) -> str:
    """The stored path of a metric name: ``global_frag`` -> ``max.global_frag``; the same
    reading as ``--fail-on`` gates."""
    return resolve(name, NUMERIC_METRICS)


def is_ratio(metric: str) -> bool:
    return metric.endswith("_frag") or metric == "alloc_failure_rate"


def format_value(metric: str, value: float) -> str:
    if is_ratio(metric):
        return f"{value:.1%}"
    if metric.endswith("_bytes"):
        return format_bytes(value)
    if metric == "growth_per_s":
        return f"{value * 100:+.4f} pt/s"
    return f"{value:,.0f}"


@dataclass(frozen=True, slots=True, order=True)
class SpaceKey:
    """What a space is followed by across runs: its device, the model (observed first), and
    which process on that device in pid order (1 for the first)."""

    device: int
    not_observed: bool
    model: str
    process: int

    @property
    def label(self) -> str:
        """``device 0``, ``device 0 · process 2``, ``device 0 · pytorch-segments``."""
        text = f"device {self.device}"
        if self.process > 1:
            text += f" · process {self.process}"
        if self.not_observed:
            text += f" · {self.model}"
        return text


def space_keys(run: StoredRun) -> dict[SpaceKey, StoredSpace]:
    """The run's spaces by key, in key order."""
    keyed: dict[SpaceKey, StoredSpace] = {}
    seen: dict[tuple[int, str], int] = {}
    for space in sorted(run.spaces, key=lambda s: (s.device, s.pid)):
        model = str(space.get("model") or MODEL_NAME)
        n = seen[space.device, model] = seen.get((space.device, model), 0) + 1
        keyed[SpaceKey(space.device, model != MODEL_NAME, model, n)] = space
    return dict(sorted(keyed.items()))


def models_words(runs: Sequence[StoredRun]) -> str:
    """What the runs' spaces were replayed in, for a title: ``observed model``, ``observed and
    pytorch-segments models`` (a history holds snapshots' runs beside traces')."""
    models = sorted({str(s.get("model") or MODEL_NAME) for run in runs for s in run.spaces})
    models.sort(key=lambda m: m != MODEL_NAME)
    if not models:
        return f"{MODEL_NAME} model"
    return f"{' and '.join(models)} model{'s' if len(models) > 1 else ''}"


def space_words(space: StoredSpace) -> str:
    """A stored space as the runs table names it: ``dev 0 pid 3310``; a snapshot's device
    (pid 0: a snapshot has no process) ``dev 0``; a model other than observed after it."""
    model = str(space.get("model") or MODEL_NAME)
    text = f"dev {space.device}" + (f" pid {space.pid}" if space.pid else "")
    return text if model == MODEL_NAME else f"{text} · {model}"


def nothing_compared(result: CheckResult, metrics: Sequence[str]) -> str:
    """Why the latest run had nothing to compare with, in words that match what the runs hold:
    its spaces appear in none of the runs before it, or they do but under another model, or
    they do and the runs before record none of ``metrics`` for them."""
    assert result.latest is not None
    ours = space_keys(result.latest)
    earlier = [space_keys(run) for run in result.previous]
    n = len(result.previous)
    shared = [k for k in ours if any(k in e for e in earlier)]
    if shared:
        names = ", ".join(k.label for k in shared)
        return (
            f"run {result.latest.id}: the {n} run(s) before it record no {', '.join(metrics)}"
            f" for {names}; nothing to compare"
        )
    devices = {k.device for k in ours}
    others = sorted({k for e in earlier for k in e if k.device in devices})
    said = ", ".join(k.label for k in ours) or "(no spaces)"
    if others:
        return (
            f"run {result.latest.id}: {said} appears in none of the {n} run(s) before it, which"
            f" hold {', '.join(k.label for k in others)} (another model or process); nothing to"
            " compare"
        )
    return f"run {result.latest.id}: {said} appears in none of the {n} run(s) before it; nothing to compare"


@dataclass(frozen=True, slots=True)
class Series:
    """One space key's values of one metric over runs, oldest first (None: no such space)."""

    key: str
    metric: str
    run_ids: tuple[int, ...]
    values: tuple[float | None, ...]

    @property
    def present(self) -> list[float]:
        return [v for v in self.values if v is not None]


def series(runs_oldest_first: Sequence[StoredRun], metric: str) -> list[Series]:
    """A series per space key seen in any of the runs, in device order."""
    keyed = [space_keys(run) for run in runs_oldest_first]
    keys = sorted({k for spaces in keyed for k in spaces})
    run_ids = tuple(run.id for run in runs_oldest_first)
    out = []
    for key in keys:
        values = tuple(
            None
            if key not in spaces or spaces[key].get(metric) is None
            else float(spaces[key].get(metric))
            for spaces in keyed
        )
        out.append(Series(key.label, metric, run_ids, values))
    return out


def sparkline(values: Sequence[float | None]) -> str:
    """``▁▃█``: each value scaled between the lowest and highest; a space for a gap."""
    present = [v for v in values if v is not None]
    if not present:
        return " " * len(values)
    lo, hi = min(present), max(present)
    top = len(SPARK_CHARS) - 1
    chars = []
    for v in values:
        if v is None:
            chars.append(" ")
        elif hi == lo:
            chars.append(SPARK_CHARS[0])
        else:
            chars.append(SPARK_CHARS[round((v - lo) / (hi - lo) * top)])
    return "".join(chars)


@dataclass(frozen=True, slots=True)
class Regression:
    run: StoredRun
    key: str
    metric: str
    value: float
    median: float
    window: int  # how many earlier runs the median is over
    threshold: float

    @property
    def change(self) -> float:
        return self.value - self.median

    def message(self) -> str:
        label = f" ({self.run.label})" if self.run.label else ""
        return (
            f"regression: run {self.run.id}{label} {self.key}: {self.metric} ="
            f" {format_value(self.metric, self.value)}, median of the previous {self.window}"
            f" run(s) {format_value(self.metric, self.median)}"
            f" ({self.change:+.4g}, threshold {self.threshold:g})"
        )


@dataclass(frozen=True, slots=True)
class CheckResult:
    latest: StoredRun | None
    previous: tuple[StoredRun, ...]
    compared: int  # (space key, metric) pairs that had earlier values
    regressions: tuple[Regression, ...]


def check(
    runs_newest_first: Sequence[StoredRun],
    metrics: Sequence[str],
    window: int,
    threshold: float,
) -> CheckResult:
    """The latest run against the median of the ``window`` runs before it, per space key and
    metric: a regression when it is worse by more than ``threshold`` (absolute)."""
    if not runs_newest_first:
        return CheckResult(None, (), 0, ())
    latest, previous = runs_newest_first[0], tuple(runs_newest_first[1 : 1 + window])
    earlier = [space_keys(run) for run in previous]
    found = []
    compared = 0
    for key, space in space_keys(latest).items():
        for metric in metrics:
            value = space.get(metric)
            history = [
                float(s[key].get(metric))
                for s in earlier
                if key in s and s[key].get(metric) is not None
            ]
            if value is None or not history:
                continue
            compared += 1
            median = float(statistics.median(history))
            worse = median - float(value) if metric in HIGHER_IS_BETTER else float(value) - median
            if worse > threshold:
                found.append(
                    Regression(
                        latest, key.label, metric, float(value), median, len(history), threshold
                    )
                )
    return CheckResult(latest, previous, compared, tuple(found))

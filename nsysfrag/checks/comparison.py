"""Run-to-run comparison of two analyses (their JSON documents): space by space, the key
metrics' changes (which ``--fail-on-regression`` gates), the state at peak memory, at worst
fragmentation and final, the sites' figures, and a verdict in words.

Every document a comparison reads back comes through :func:`read_json` and
:func:`checked_document` (a job's through ``nsysfrag.checks.job_comparison``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.capacity import source_words
from nsysfrag.checks.document_words import Clock, DocumentWords, clock_of, document_words
from nsysfrag.checks.documents import check_analysis, read_json
from nsysfrag.checks.gates import HEALTH_ORDER
from nsysfrag.checks.space_changes import (
    MomentChange,
    SiteFigure,
    missing_moments,
    moment_changes,
    site_figures,
)
from nsysfrag.checks.verdict import Piece, verdict
from nsysfrag.errors import InputError
from nsysfrag.schemas import ANALYSIS as SCHEMA

SECONDS = Clock(0, True, "entry")  # a document whose clock is not known: seconds from 0

# (label, path in a space document, is a fragmentation metric for --fail-on-regression)
METRICS: tuple[tuple[str, str, bool], ...] = (
    ("max global frag", "max.global_frag", True),
    ("max local frag", "max.local_frag", True),
    ("peak global frag", "peak.global_frag", True),
    ("max free blocks", "max.free_blocks", False),
    ("max requested", "max.live_bytes", False),
    ("alloc failure rate", "alloc_failure_rate", False),
    ("internal frag", "internal_frag", True),
    ("growth per s", "growth_per_s", False),
    ("out-of-order frees", "out_of_order_frees", False),
    ("hole-creating frees", "hole_creating_frees", False),
)
COMPARED = tuple(key for _, key, _ in METRICS)


@dataclass(frozen=True, slots=True)
class MetricDelta:
    label: str
    key: str
    base: float
    current: float
    fragmentation: bool

    # (base, current) as the health rates them; None where one run rates no moment of it
    rated: tuple[float, float] | None = None
    rated_note: str = ""  # said after the label when ``rated`` is not the maxima shown

    @property
    def delta(self) -> float:
        return self.current - self.base


@dataclass(frozen=True, slots=True)
class SpaceComparison:
    base_space: str
    current_space: str
    base_health: str
    current_health: str
    deltas: tuple[MetricDelta, ...]
    moments: tuple[MomentChange, ...] = ()
    sites: tuple[SiteFigure, ...] = ()
    verdict: tuple[Piece, ...] = ()
    missing: tuple[str, ...] = ()  # what one run's document lacks, in words
    failures: tuple[int, int] = (0, 0)  # failed allocations, base and current
    # The device memory C of each run, in words, where the two differ in size or in the
    # evidence they come from ("" where they agree): the figures C enters compare unlike things.
    capacity_note: str = ""

    @property
    def health_worse(self) -> bool:
        return HEALTH_ORDER[self.current_health] > HEALTH_ORDER[self.base_health]


@dataclass(frozen=True, slots=True)
class Comparison:
    spaces: tuple[SpaceComparison, ...]
    only_in_base: tuple[str, ...]
    only_in_current: tuple[str, ...]
    words: DocumentWords | None = None  # the current run's (both are of one kind)
    base_clock: Clock = SECONDS
    current_clock: Clock = SECONDS

    def regressions(self, threshold: float) -> list[str]:
        """One line per fragmentation metric that grew by more than ``threshold`` (absolute),
        each taken as the health rates it: a local fragmentation maximum the health does not
        count (it came while almost nothing was free) is no regression, its rated maximum is."""
        lines = []
        for s in self.spaces:
            for d in s.deltas:
                if not d.fragmentation or d.rated is None:
                    continue
                base, current = d.rated
                if current - base > threshold:
                    lines.append(
                        f"regression: {s.current_space}: {d.label}{d.rated_note} grew by"
                        f" {current - base:.4f} (from {base:.4f} to {current:.4f}), more than"
                        f" {threshold}"
                    )
        return lines


def load_document(path: Path) -> dict[str, Any]:
    """Read a `--json` document; raise InputError with a fix when it is not one."""
    return checked_document(read_json(path), path)


def checked_document(doc: Any, path: Path) -> dict[str, Any]:
    """``doc`` when it is an analysis (``nsysfrag/1``) holding every value a comparison reads
    (``checks.documents``); InputError naming ``path`` and the value when not."""
    return check_analysis(doc, path, COMPARED, SCHEMA)


def _name(space: dict[str, Any]) -> str:
    # A snapshot's spaces are its devices (pid 0): their pid says nothing.
    if space["pid"] == 0:
        return f"device {space['device']}"
    return f"pid {space['pid']} device {space['device']}"


def _value(space: dict[str, Any], key: str) -> float:
    node: Any = space
    for part in key.split("."):
        node = node[part]
    return float(node)


def _rated(space: dict[str, Any], key: str) -> float | None:
    """``key``'s value as the health counts it: where the document lists the maximum as not
    counted (``unrated_maxima``: it came while under 5 % of the device was free), the maximum
    over the moments it does count; None where it counts none."""
    value = _value(space, key)
    metric = key.removeprefix("max.")
    for entry in space.get("unrated_maxima") or ():
        if isinstance(entry, dict) and entry.get("metric") == metric and key.startswith("max."):
            rated = entry.get("rated_value")
            return None if rated is None else float(rated)
    return value


def _delta(label: str, key: str, frag: bool, b: dict[str, Any], c: dict[str, Any]) -> MetricDelta:
    base, current = _value(b, key), _value(c, key)
    rated_base, rated_current = _rated(b, key), _rated(c, key)
    rated = None if rated_base is None or rated_current is None else (rated_base, rated_current)
    note = "" if rated == (base, current) else " (the maxima the health rates)"
    return MetricDelta(label, key, base, current, frag, rated, note)


def _match(base: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pair spaces: the same (pid, device) when both runs have it, else the same device in pid
    order (pids change from run to run; devices usually do not)."""
    pairs = []
    by_key = {(s["pid"], s["device"]): s for s in current}
    rest_base = []
    used = set()
    for s in base:
        key = (s["pid"], s["device"])
        if key in by_key:
            pairs.append((s, by_key[key]))
            used.add(key)
        else:
            rest_base.append(s)
    rest_current = [s for s in current if (s["pid"], s["device"]) not in used]
    for device in sorted({s["device"] for s in rest_base}):
        left = [s for s in rest_base if s["device"] == device]
        right = [s for s in rest_current if s["device"] == device]
        pairs.extend(zip(left, right))
    return pairs


def compare(
    base: dict[str, Any], current: dict[str, Any], names: tuple[str, str] = ("the base run", "this run")
) -> Comparison:
    """Pair the spaces of two documents and compute what changed in each (``names``: how the
    runs are named where a figure is missing from one)."""
    try:
        return _compare(base, current, names)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise InputError(
            f"an analysis document lacks or mangles {err}; re-run `nsysfrag analyze --json`"
        ) from None


def _compare(base: dict[str, Any], current: dict[str, Any], names: tuple[str, str]) -> Comparison:
    pairs = _match(base["spaces"], current["spaces"])
    matched_base = {id(b) for b, _ in pairs}
    matched_current = {id(c) for _, c in pairs}
    return Comparison(
        spaces=tuple(_space(b, c, names) for b, c in pairs),
        only_in_base=tuple(_name(s) for s in base["spaces"] if id(s) not in matched_base),
        only_in_current=tuple(_name(s) for s in current["spaces"] if id(s) not in matched_current),
        words=document_words(current),
        base_clock=clock_of(base),
        current_clock=clock_of(current),
    )


def _failures(space: dict[str, Any]) -> int:
    counts = space.get("counts")
    if isinstance(counts, dict) and "failed_allocations" in counts:
        return int(counts["failed_allocations"])
    return len(space.get("ooms") or ())


def _capacity_note(b: dict[str, Any], c: dict[str, Any]) -> str:
    """``1.16 GiB from the recorded OOM → 1.02 GiB from the allocator's OOM retries`` where the
    runs' capacities differ in size or source, else ""."""
    sides = [(int(s["capacity_bytes"]), str(s.get("capacity_source", ""))) for s in (b, c)]
    if sides[0] == sides[1]:
        return ""
    return " → ".join(f"{format_bytes(n)} {source_words(src)}".strip() for n, src in sides)


def _space(b: dict[str, Any], c: dict[str, Any], names: tuple[str, str]) -> SpaceComparison:
    moments = moment_changes(b, c)
    sites, missing = site_figures(b, c, names)
    failures = (_failures(b), _failures(c))
    capacity_note = _capacity_note(b, c)
    return SpaceComparison(
        base_space=_name(b),
        current_space=_name(c),
        base_health=b["health"],
        current_health=c["health"],
        deltas=tuple(_delta(label, key, frag, b, c) for label, key, frag in METRICS),
        moments=moments,
        sites=sites,
        verdict=verdict(
            moments,
            sites,
            (str(b["health"]), str(c["health"])),
            (_value(b, "max.live_bytes"), _value(c, "max.live_bytes")),
            failures,
            capacity_note,
        ),
        missing=tuple(missing_moments(b, c, names) + missing),
        failures=failures,
        capacity_note=capacity_note,
    )

"""What changed in one space from run to run, read from two analysis documents: the state at
peak memory, at worst fragmentation and at the end, figure by figure, and the sites' figures
(live and stranded bytes at peak memory, hole bytes of hotspots) matched site by site.

A document from before a figure existed lacks it: the change of that figure is then not
computed, and ``missing`` says what is not there and in which run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nsysfrag.checks.site_changes import SiteChange, SiteList, site_changes

# (key in a space document, what reports call the moment)
MOMENTS: tuple[tuple[str, str], ...] = (
    ("memory_peak", "at peak memory"),
    ("peak", "at worst fragmentation"),
    ("final", "final"),
)
BYTES, RATIO, COUNT = "bytes", "ratio", "count"
# (key in a state, label, kind): the figures of a moment, in the order reports show them. The
# allocator's figures exist where the model has reserved memory (segments, resident pages);
# "free" is shown only where they do not (it is device free + stranded + releasable otherwise).
FIGURES: tuple[tuple[str, str, str], ...] = (
    ("reserved_bytes", "reserved", BYTES),
    ("allocated_bytes", "allocated", BYTES),
    ("active_bytes", "active", BYTES),
    ("stranded_bytes", "stranded", BYTES),
    ("releasable_bytes", "releasable", BYTES),
    ("device_free_bytes", "device free", BYTES),
    ("largest_free_bytes", "largest usable request", BYTES),
    ("largest_block_bytes", "largest free block", BYTES),
    ("free_bytes", "free", BYTES),
    ("live_bytes", "requested", BYTES),
    ("global_frag", "global frag", RATIO),
    ("local_frag", "local frag", RATIO),
    ("free_blocks", "free blocks", COUNT),
)
LIVE, STRANDED, HOLES = "live_at_memory_peak", "stranded_at_memory_peak", "hole_bytes"
# (key, what reports call the figure, what a document without it lacks)
SITE_FIGURES: tuple[tuple[str, str, str], ...] = (
    (LIVE, "live bytes at peak memory", "per-site live bytes at peak memory"),
    (STRANDED, "stranded bytes at peak memory, by pinning site", "per-site stranded bytes"),
    (HOLES, "hole bytes of out-of-order frees (hotspots)", "hotspots"),
)


@dataclass(frozen=True, slots=True)
class FigureChange:
    key: str
    label: str
    kind: str  # BYTES, RATIO or COUNT
    base: float
    current: float

    @property
    def delta(self) -> float:
        return self.current - self.base

    @property
    def relative(self) -> float | None:
        """The change as a share of the base value; None from 0."""
        return self.delta / self.base if self.base else None


@dataclass(frozen=True, slots=True)
class MomentChange:
    key: str  # "memory_peak", "peak" or "final"
    label: str
    base_time_ns: int
    current_time_ns: int
    figures: tuple[FigureChange, ...]

    def figure(self, key: str) -> FigureChange | None:
        return next((f for f in self.figures if f.key == key), None)


@dataclass(frozen=True, slots=True)
class SiteFigure:
    """One per-site figure in both runs, site by site, largest change first."""

    key: str  # LIVE, STRANDED or HOLES
    label: str
    changes: tuple[SiteChange, ...]
    base_total: int | None  # over every site, where the documents say
    current_total: int | None
    listed_only: bool = False  # a document listed only its largest sites


def moment_changes(base: dict[str, Any], current: dict[str, Any]) -> tuple[MomentChange, ...]:
    """The moments both spaces have, each with the figures both states have."""
    out = []
    for key, label in MOMENTS:
        b, c = base.get(key), current.get(key)
        if not isinstance(b, dict) or not isinstance(c, dict):
            continue
        pools = "reserved_bytes" in b and "reserved_bytes" in c
        figures = tuple(
            FigureChange(k, name, kind, float(b[k]), float(c[k]))
            for k, name, kind in FIGURES
            if k in b and k in c and not (pools and k == "free_bytes")
            and not (k == "active_bytes" and b[k] == b.get("allocated_bytes")
                     and c[k] == c.get("allocated_bytes"))
        )  # fmt: skip
        out.append(MomentChange(key, label, int(b["time_ns"]), int(c["time_ns"]), figures))
    return tuple(out)


def missing_moments(
    base: dict[str, Any], current: dict[str, Any], names: tuple[str, str]
) -> list[str]:
    """What one run's space has of the moments and the other's lacks, in words."""
    out = []
    for key, label in MOMENTS:
        has = [key in base, key in current]
        if any(has) and not all(has):
            out.append(f"the state {label} (not in {names[has.index(False)]})")
    return out


def site_figures(
    base: dict[str, Any], current: dict[str, Any], names: tuple[str, str]
) -> tuple[tuple[SiteFigure, ...], list[str]]:
    """The per-site figures both spaces have, and what is missing where, in words."""
    lists = [_site_lists(base), _site_lists(current)]
    out, missing = [], []
    for key, label, lacking in SITE_FIGURES:
        b, c = lists[0].get(key), lists[1].get(key)
        if b is None or c is None:
            if b is not None or c is not None:
                missing.append(f"{lacking} (not in {names[0 if b is None else 1]})")
            continue
        changes = tuple(site_changes(b, c))
        out.append(
            SiteFigure(
                key, label, changes, b.total_bytes, c.total_bytes,
                listed_only=not (b.complete and c.complete),
            )
        )  # fmt: skip
    return tuple(out), missing


def _site_lists(space: dict[str, Any]) -> dict[str, SiteList]:
    out: dict[str, SiteList] = {}
    sites = space.get("memory_peak_sites")
    if isinstance(sites, dict):
        for key, part in ((LIVE, "live"), (STRANDED, "stranded")):
            entry = sites[part]
            out[key] = SiteList(
                {str(s["site"]): int(s["bytes"]) for s in entry["sites"]},
                int(entry.get("other_sites", 0)),
                int(entry.get("other_bytes", 0)),
                int(entry["total_bytes"]) if "total_bytes" in entry else None,
            )
    if isinstance(space.get("hotspots"), list):
        holes: dict[str, int] = {}
        for h in space["hotspots"]:
            holes[str(h["site"])] = holes.get(str(h["site"]), 0) + int(h["hole_bytes"])
        out[HOLES] = SiteList(
            {s: v for s, v in holes.items() if v > 0}, total_bytes=sum(holes.values())
        )
    return out

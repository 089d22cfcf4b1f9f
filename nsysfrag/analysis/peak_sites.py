"""Where the memory was at the memory peak, by allocation site.

Two figures per site, taken once, at the moment the device held the most for the space:

- **live bytes**: the bytes of the site's blocks live then (they add up to the space's live
  bytes at that moment);
- **stranded bytes**: the stranded memory of every segment (the driver's page, in the observed
  model) that holds one of the site's blocks — what the site's blocks keep reserved. A segment
  holding blocks of two sites counts for both, so these do not add up: each says how much
  stranded memory would stay pinned while that site's blocks live.

Run-to-run comparison ranks sites by how these change (``nsysfrag.checks.site_changes``).
"""

from __future__ import annotations

import numpy as np

from nsysfrag.analysis.results import PeakSites, SiteBytes
from nsysfrag.events import I64
from nsysfrag.models import ModelRun
from nsysfrag.models.series import ALLOCATED, NO_BLOCK, StateSeries, StrandedSegment


def peak_sites(run: ModelRun, point: int) -> PeakSites:
    """The sites' live and stranded bytes right after ``point`` of ``run``'s series."""
    series = run.series
    segments = run.stranded_after(point)
    credited = stranded_by_site(segments, series)
    names = series.site_names
    return PeakSites(
        live=live_by_site(series, point),
        stranded=tuple(SiteBytes(names[code], total) for code, total, _ in credited),
        stranded_bytes=sum(s.stranded_bytes for s in segments),
        segment_bytes=np.fromiter((s.stranded_bytes for s in segments), np.int64, len(segments)),
        segment_sites=tuple(frozenset(names[c] for c in _codes(s, series)) for s in segments),
    )


def live_by_site(series: StateSeries, point: int) -> tuple[SiteBytes, ...]:
    """The bytes of each site's blocks live right after ``point``, most first."""
    # The blocks live when a recording's window opened all count from its first point on:
    # the state after each of their points already holds every one of them.
    placed = np.flatnonzero(series.event[: max(point + 1, series.initial_blocks)] == ALLOCATED)
    removed = series.removed_at[placed]
    alive = placed[(removed > point) | (removed == NO_BLOCK)]
    names = series.site_names
    totals = np.zeros(len(names), dtype=np.int64)
    np.add.at(totals, series.site[alive], series.bytes[alive])  # exact: integer sums
    return _ranked(totals, names)


def stranded_by_site(
    segments: list[StrandedSegment], series: StateSeries
) -> list[tuple[int, int, int]]:
    """``(site code, stranded bytes, segments)`` of every site with an allocated block in
    ``segments``, each credited with the stranded bytes of every segment it has a block in;
    the most bytes first, then the most segments, then by name."""
    totals: dict[int, list[int]] = {}  # site code -> [stranded bytes, segments]
    for segment in segments:
        for code in _codes(segment, series):
            total = totals.setdefault(code, [0, 0])
            total[0] += segment.stranded_bytes
            total[1] += 1
    names = series.site_names
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][0], -kv[1][1], names[kv[0]]))
    return [(code, total, count) for code, (total, count) in ranked]


def _codes(segment: StrandedSegment, series: StateSeries) -> set[int]:
    n = len(series.site)
    return {int(series.site[p]) for p in segment.block_points if 0 <= p < n}


def _ranked(totals: I64, names: list[str]) -> tuple[SiteBytes, ...]:
    codes = np.flatnonzero(totals > 0).tolist()
    codes.sort(key=lambda c: (-int(totals[c]), names[c]))
    return tuple(SiteBytes(names[c], int(totals[c])) for c in codes)

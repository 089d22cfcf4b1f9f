"""Which points of a space's timeline the figures draw, so a line of any length stays bounded
and loses nothing a reader looks for.

Up to ``FULL_RESOLUTION_EVENTS`` points every point is drawn. Above that, a series keeps, in each
of ``TIME_BINS`` equal time bins, its first, last, lowest and highest point (all a plot 1,000
pixels wide can show), and always the landmarks: the first and the last event, the peak, and the
state at each failed allocation. So a line is at most ``4 × TIME_BINS`` points plus the
landmarks, whatever the input's size.

This is the figures' rule only. The JSON timeline has its own (the report's contract, in
``json_report``): it is not changed here.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from nsysfrag.analysis import SpaceAnalysis
from nsysfrag.events import I64

FULL_RESOLUTION_EVENTS = 20_000
TIME_BINS = 2_000


def failure_points(space: SpaceAnalysis) -> I64:
    """For each failed allocation, the index of the point whose state it failed in: the last
    point at or before it. A failure before the first point (the empty arena) has none."""
    t = space.timeline.time_ns
    times = np.fromiter((f.state.time_ns for f in space.ooms), dtype=np.int64, count=len(space.ooms))
    points = np.searchsorted(t, times, side="right").astype(np.int64) - 1
    return np.unique(points[points >= 0])


def landmarks(space: SpaceAnalysis) -> I64:
    """The points every drawn series keeps: first, last, the peak and each failure's state."""
    n = len(space.timeline.time_ns)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    fixed = np.array([0, n - 1, space.peak_index], dtype=np.int64)
    return np.unique(np.concatenate([fixed, failure_points(space)]))


def step_indices(
    time_ns: I64, values: npt.NDArray[np.generic], always: Iterable[int] | I64 = ()
) -> I64:
    """Indices of the points that draw ``values`` as a step function without visible loss:
    every index up to ``FULL_RESOLUTION_EVENTS``; above, each time bin's first, last, lowest and
    highest point, and every index in ``always``."""
    n = len(time_ns)
    if n <= FULL_RESOLUTION_EVENTS:
        return np.arange(n, dtype=np.int64)
    rel = (time_ns - time_ns[0]).astype(np.float64)
    span = rel[-1]
    if span > 0:
        bins = np.minimum((rel / span * TIME_BINS).astype(np.int64), TIME_BINS - 1)
    else:
        bins = np.zeros(n, dtype=np.int64)
    # Events are in time order, so each bin is one contiguous run of indices.
    firsts = np.flatnonzero(np.r_[True, bins[1:] != bins[:-1]])
    lasts = np.r_[firsts[1:] - 1, n - 1]
    runs = np.diff(np.r_[firsts, n])
    keep = [firsts, lasts, np.fromiter(always, dtype=np.int64)]
    for extreme in (np.minimum, np.maximum):
        hits = np.flatnonzero(values == np.repeat(extreme.reduceat(values, firsts), runs))
        keep.append(hits[np.r_[True, bins[hits][1:] != bins[hits][:-1]]])
    return np.unique(np.concatenate(keep)).astype(np.int64)


def drawn_indices(space: SpaceAnalysis, *series: npt.NDArray[np.generic]) -> I64:
    """The points to draw ``series`` of ``space`` with (their union, with the landmarks)."""
    tl = space.timeline
    marks = landmarks(space)
    picked = [step_indices(tl.time_ns, values, marks) for values in series]
    return np.unique(np.concatenate(picked)) if picked else marks

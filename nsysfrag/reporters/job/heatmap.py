"""Rank × time heatmap of global fragmentation, as inline SVG (deterministic, no matplotlib).

Each row is a rank, each column a slice of time since that rank's first event (ranks' clocks
are not comparable: every nsys session and every snapshot has its own origin). A cell is the
highest global fragmentation the rank reached in that slice, read from the step function of its
document's timeline (at most 2,000 points per space, the peak always among them); with several
spaces the rank's row takes the highest. A rank that ended earlier leaves its later cells empty.
A rank of a record (``nsysfrag record``) adds the ratings of its live state snapshots, which
cover the whole run, not only the snapshot's history window: its row starts at the earlier of
its first event and its first rating.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from itertools import pairwise
from typing import Any

import numpy as np

from nsysfrag.checks.document_words import time_origin

# Colour by global fragmentation: the upper bounds of each band (the last is open), YlOrRd;
# 20 % and 40 % are the warn and critical thresholds, so they are band edges.
BANDS = (0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.40, 0.50)
COLOURS = ("#ffffcc", "#ffeda0", "#fed976", "#feb24c", "#fd8d3c", "#fc4e2a", "#e31a1c", "#bd0026",
           "#800026")  # fmt: skip
EMPTY = "#eef0f3"
COLUMNS = 120
LABEL_W, CELL_W = 64, 6


@dataclass(frozen=True, slots=True)
class HeatRow:
    rank: int
    cells: tuple[float | None, ...]  # None: the rank had ended (or had no events) by then
    peak: float


def heat_rows(entries: Sequence[dict[str, Any]], columns: int = COLUMNS) -> tuple[list[HeatRow], int]:
    """One row per analyzed rank of a job document's ``ranks``, and the time span in ns."""
    series = []
    for entry in entries:
        if "analysis" not in entry:
            continue
        timelines = [
            (np.asarray(s["timeline"]["time_ns"], dtype=np.int64),
             np.asarray(s["timeline"]["global_frag"], dtype=np.float64))
            for s in entry["analysis"]["spaces"]
            if s["timeline"]["time_ns"]
        ]  # fmt: skip
        origin = time_origin(entry["analysis"])
        ratings = entry["analysis"].get("recorded", {}).get("ratings", {})
        if ratings.get("time_ns"):
            rated = np.asarray(ratings["time_ns"], dtype=np.int64)
            timelines.append((rated, np.asarray(ratings["global_frag"], dtype=np.float64)))
            origin = min(origin, int(rated.min()))
        series.append((int(entry["rank"]), origin, timelines))
    span = max(
        (max(int(t[-1]) for t, _ in tl) - origin for _, origin, tl in series if tl),
        default=0,
    )
    rows = []
    for rank, origin, timelines in series:
        cells: list[float | None] = [None] * columns
        peak = 0.0
        if timelines:
            for times, values in timelines:
                _fill(cells, times - origin, values, span, columns)
                peak = max(peak, float(values.max()))
        rows.append(HeatRow(rank, tuple(cells), peak))
    return rows, span


def _fill(cells: list[float | None], rel: np.ndarray, values: np.ndarray, span: int, columns: int) -> None:
    """Raise each cell to the step function's highest value within its slice of time: the value
    holding as the slice starts, or any taken inside it."""
    width = span / columns if span > 0 else 1.0
    bins = np.minimum((rel / width).astype(np.int64), columns - 1)
    last = int(bins[-1])
    highest = np.full(last + 1, -np.inf)
    np.maximum.at(highest, bins, values)
    holding = np.searchsorted(rel, np.arange(last + 1) * width, side="right") - 1
    entering = np.where(holding >= 0, values[np.maximum(holding, 0)], -np.inf)
    for i, value in enumerate(np.maximum(entering, highest).tolist()):
        if value > -np.inf:  # a space that starts later than its rank's first event
            current = cells[i]
            cells[i] = value if current is None else max(current, value)


def colour(value: float) -> str:
    for bound, c in zip(BANDS, COLOURS):
        if value < bound:
            return c
    return COLOURS[-1]


def svg(rows: Sequence[HeatRow], span_ns: int, anchor: str = "rank-{rank}") -> str:
    """The heatmap; each row links to ``#rank-N``. Empty string when there are no rows."""
    if not rows:
        return ""
    columns = len(rows[0].cells)
    row_h = 14 if len(rows) <= 48 else max(2, 672 // len(rows))
    label_every = 1 if row_h >= 10 else max(1, (12 + row_h - 1) // row_h)
    top, legend_h = 4, 44
    width = LABEL_W + columns * CELL_W + 8
    height = top + len(rows) * row_h + legend_h
    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}"'
            f' width="{width}" height="{height}" role="img"'
            ' aria-label="global fragmentation by rank over time"'
            ' font-family="system-ui, sans-serif" font-size="10">'
        )
    ]
    for i, row in enumerate(rows):
        y = top + i * row_h
        link = escape(anchor.format(rank=row.rank), quote=True)
        out.append(f'<a href="#{link}"><title>rank {row.rank}: peak global fragmentation'
                   f" {row.peak:.1%}</title>")
        if i % label_every == 0:
            out.append(f'<text x="{LABEL_W - 6}" y="{y + row_h - 3 if row_h >= 10 else y + row_h}"'
                       f' text-anchor="end">rank {row.rank}</text>')
        for start, length, fill in _runs(row.cells):
            out.append(f'<rect x="{LABEL_W + start * CELL_W}" y="{y}" width="{length * CELL_W}"'
                       f' height="{row_h}" fill="{fill}"/>')
        out.append("</a>")
    y = top + len(rows) * row_h + 14
    out.append(f'<text x="{LABEL_W}" y="{y}">0 s</text>')
    out.append(f'<text x="{LABEL_W + columns * CELL_W}" y="{y}" text-anchor="end">'
               f"{span_ns / 1e9:.3f} s since each rank's first event</text>")
    y += 8
    labels = ["<5%", *(f"{lo:.0%}–{hi:.0%}" for lo, hi in pairwise(BANDS)), f"≥{BANDS[-1]:.0%}"]
    x = LABEL_W
    for c, label in zip(COLOURS, labels):
        out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{c}" stroke="#9aa5b1"'
                   ' stroke-width="0.5"/>')
        out.append(f'<text x="{x + 15}" y="{y + 10}">{escape(label)}</text>')
        x += 15 + 7 * len(label) + 10
    out.append("</svg>")
    return "".join(out)


def _runs(cells: Sequence[float | None]) -> list[tuple[int, int, str]]:
    """Adjacent cells of one colour as one rectangle: a thousand ranks stay a small page."""
    runs: list[tuple[int, int, str]] = []
    for i, value in enumerate(cells):
        fill = EMPTY if value is None else colour(value)
        if runs and runs[-1][2] == fill and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, fill)
        else:
            runs.append((i, 1, fill))
    return runs

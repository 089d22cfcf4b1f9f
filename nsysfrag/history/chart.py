"""A metric across runs as a matplotlib ``Figure`` (no pyplot): one line per space key."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from nsysfrag.history.store import StoredRun
from nsysfrag.history.trends import Series, is_ratio, models_words
from nsysfrag.reporters.figure_axes import (
    CRITICAL_BAND,
    DPI,
    FIGSIZE_IN,
    GLOBAL_CRITICAL_PCT,
    GLOBAL_WARN_PCT,
    SITE_COLORS,
    WARN_BAND,
    BytesFormatter,
    BytesLocator,
    save_figure,
    suptitle_lines,
)

MAX_RUN_TICKS = 12
# Above this many runs a marker per run is a smear that hides the line (and 200,000 of them
# took most of the chart's time): the line alone is drawn.
MAX_MARKED_RUNS = 300


def trend_figure(
    runs_oldest_first: Sequence[StoredRun], all_series: Sequence[Series], metric: str
) -> Figure:
    """The metric of every space key over runs (x: runs in recording order, labelled by id).

    ``global_frag`` metrics are drawn on the 20 %/40 % warn and critical bands.
    """
    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    ax = fig.subplots()
    ratio = is_ratio(metric)
    scale = 100.0 if ratio else 1.0
    x = list(range(len(runs_oldest_first)))
    highest = 0.0
    for s, color in zip(all_series, itertools.cycle(SITE_COLORS)):
        points = [(i, v * scale) for i, v in zip(x, s.values, strict=True) if v is not None]
        if not points:
            continue
        highest = max(highest, max(v for _, v in points))
        marked = len(points) <= MAX_MARKED_RUNS
        ax.plot(
            [i for i, _ in points],
            [v for _, v in points],
            marker="o" if marked else "none",
            markersize=3.5,
            linewidth=1.3,
            color=color,
            label=s.key,
            clip_on=False,
        )
    if metric.endswith("global_frag"):
        # Always show both bands, and all of a line that rises past them (span mode can exceed 100 %).
        top = max(GLOBAL_CRITICAL_PCT * 1.25, highest * 1.15)
        ax.axhspan(
            GLOBAL_WARN_PCT, GLOBAL_CRITICAL_PCT, color=WARN_BAND, zorder=0, label="warn (20–40 %)"
        )
        ax.axhspan(
            GLOBAL_CRITICAL_PCT, top, color=CRITICAL_BAND, zorder=0, label="critical (≥ 40 %)"
        )
        ax.set_ylim(0.0, top)
    elif highest > 0:
        ax.set_ylim(0.0, highest * 1.15)
    if ratio:
        ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
    elif metric.endswith("_bytes"):
        ax.yaxis.set_major_locator(BytesLocator())
        ax.yaxis.set_major_formatter(BytesFormatter())
    ax.set_ylabel(f"{metric} (%)" if ratio else metric)
    step = max(1, math.ceil(len(x) / MAX_RUN_TICKS))
    ticks = x[::step]
    ax.set_xticks(ticks, [f"#{runs_oldest_first[i].id}" for i in ticks])
    ax.set_xlim(-0.5, max(len(x) - 0.5, 0.5))
    ax.set_xlabel("run (oldest → newest)")
    ax.grid(True, axis="y", color="#dddddd", linewidth=0.6)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    lines = [f"{metric} across runs · {models_words(runs_oldest_first)}"]
    if runs_oldest_first:
        first, last = runs_oldest_first[0], runs_oldest_first[-1]
        lines.append(
            f"{len(x)} run(s), {first.recorded_at:%Y-%m-%d} → {last.recorded_at:%Y-%m-%d} (UTC)"
        )
    suptitle_lines(fig, *lines)
    return fig


def write_png(figure: Figure, path: Path, option: str = "--png") -> None:
    """The chart as a PNG file at ``path``, through ``nsysfrag.destinations``."""
    from nsysfrag import destinations

    with destinations.writing(option) as batch, batch.open(path, binary=True) as f:
        # dpi="figure" so a user's savefig.dpi rcParam cannot change the pixel size.
        save_figure(figure, f, format="png", dpi="figure")

"""Matplotlib figures of one space's analysis: data in, ``Figure`` out.

Every builder takes a ``SpaceAnalysis`` and returns a ``matplotlib.figure.Figure`` made without
pyplot, so building figures touches no global state and is safe from several threads. Rendering
(PNG files, an HTML page) is the caller's business: iterate ``figure_builders``.

Time series are step functions (each point is the state after an event and holds until the
next), on an x axis of seconds since the input's first event (the report's one time base,
``analysis.time_base``), drawn from the points
``timeline_points`` picks (bounded, every extreme kept); each failed allocation is a red line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from nsysfrag.analysis import Bucket, SpaceAnalysis
from nsysfrag.analysis.metrics import format_bytes, size_class_label
from nsysfrag.analysis.time_base import moment, since_start_s
from nsysfrag.models.series import PoolColumns
from nsysfrag.reporters.address_map import address_map
from nsysfrag.reporters.figure_axes import (
    BYTES_COLOR,
    CAPACITY_COLOR,
    COUNT_COLOR,
    CRITICAL_BAND,
    FREE_BLOCKS_COLOR,
    FREE_BLOCKS_CRITICAL,
    FREE_BLOCKS_WARN,
    FREE_COLOR,
    GLOBAL_COLOR,
    GLOBAL_CRITICAL_PCT,
    GLOBAL_WARN_PCT,
    HOLE_COLOR,
    LARGEST_FREE_COLOR,
    LIVE_COLOR,
    LOCAL_COLOR,
    LOCAL_CRITICAL_PCT,
    LOCAL_WARN_PCT,
    TOP_HOTSPOT_SITES,
    WARN_BAND,
    below_bands,
    bytes_axis,
    count_of,
    figure_title,
    legend_right,
    new_figure,
    say_empty,
    seconds_since_start,
    short_site,
    time_axis,
    zoomed_top,
)
from nsysfrag.reporters.timeline_points import TIME_BINS, drawn_indices

FigureBuilder = Callable[[SpaceAnalysis], Figure]
OOM_COLOR = "#d62728"


def _step(
    ax: Axes, space: SpaceAnalysis, values: npt.NDArray[np.generic], scale: float = 1.0, **kw: Any
) -> None:
    idx = drawn_indices(space, values)
    x = seconds_since_start(space)[idx]
    ax.plot(x, values[idx].astype(np.float64) * scale, drawstyle="steps-post", **kw)


def _failures(ax: Axes, space: SpaceAnalysis) -> None:
    """A red line at each failed allocation (one per time bin: at most ``TIME_BINS`` lines)."""
    if not space.ooms:
        return
    x = np.array([since_start_s(space, f.state.time_ns) for f in space.ooms])
    span = max(float(x.max()), 1e-12)
    _, first = np.unique(np.floor(x / span * TIME_BINS), return_index=True)
    n = len(space.ooms)
    ax.vlines(x[np.sort(first)], 0.0, 1.0, transform=ax.get_xaxis_transform(), color=OOM_COLOR,
              linewidth=0.9, linestyle=(0, (3, 2)), zorder=4,
              label=f"failed allocation{'s' if n > 1 else ''} ({n:,})")  # fmt: skip


def _time_series_done(fig: Figure, ax: Axes, ylabel: str, what: str, space: SpaceAnalysis) -> Figure:
    """The finish every time-series figure shares: failures, y label, grid, legend, title."""
    _failures(ax, space)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", color="#dddddd", linewidth=0.6)
    legend_right(ax)
    figure_title(fig, what, space)
    return fig


def _capacity_line(ax: Axes, space: SpaceAnalysis) -> None:
    """The device's capacity, dashed and labelled at the right, and the time axis."""
    cap = space.capacity_bytes
    ax.axhline(cap, color=CAPACITY_COLOR, linestyle="--", linewidth=1.0,
               label=f"device capacity (C) {format_bytes(cap)}")  # fmt: skip
    time_axis(ax, space)
    ax.text(
        0.995, cap, f"device capacity {format_bytes(cap)}", transform=ax.get_yaxis_transform(),
        ha="right", va="bottom", fontsize=8, color=CAPACITY_COLOR,
    )  # fmt: skip


# ---------------------------------------------------------------- the figures


def fragmentation_timeline(space: SpaceAnalysis) -> Figure:
    """Global and local fragmentation (%) over time, on the global health bands, peak marked."""
    fig, (ax,) = new_figure()
    tl = space.timeline
    ax.axhspan(
        GLOBAL_WARN_PCT, GLOBAL_CRITICAL_PCT, color=WARN_BAND, zorder=0, label="global warn (20–40 %)"
    )
    ax.axhspan(
        GLOBAL_CRITICAL_PCT, 100.0, color=CRITICAL_BAND, zorder=0, label="global critical (≥ 40 %)"
    )
    # The local thresholds differ, so they are lines in the local colour rather than bands.
    local = ((LOCAL_WARN_PCT, "local warn / critical (30 %, > 60 %)"), (LOCAL_CRITICAL_PCT, None))
    for pct, label in local:
        ax.axhline(pct, color=LOCAL_COLOR, linestyle=":", linewidth=0.9, alpha=0.8, label=label)
    words = space.source.words
    _step(ax, space, tl.local_frag, 100.0, color=LOCAL_COLOR, linewidth=1.1,
          label=f"local frag = {words.local_formula}")  # fmt: skip
    _step(ax, space, tl.global_frag, 100.0, color=GLOBAL_COLOR, linewidth=1.6,
          label=f"global frag = {words.global_formula}")  # fmt: skip

    peak_x = since_start_s(space, space.peak.time_ns)
    peak_y = space.peak.global_frag * 100.0
    top = zoomed_top(max(space.max_global_frag, space.max_local_frag) * 100.0, 100.0)
    ax.plot(
        [peak_x], [peak_y], marker="o", markersize=7, color=GLOBAL_COLOR, markeredgecolor="black",
        linestyle="none", label="peak global frag", zorder=5,
    )  # fmt: skip
    time_axis(ax, space)
    x0, x1 = ax.get_xlim()
    right_half = peak_x > x0 + 0.6 * (x1 - x0)
    near_top = peak_y > 0.6 * top
    ax.annotate(
        f"peak {peak_y:.1f} % at {moment(space, space.peak.time_ns)}",
        xy=(peak_x, peak_y),
        xytext=(-12 if right_half else 12, -30 if near_top else 22),
        textcoords="offset points",
        ha="right" if right_half else "left",
        fontsize=9,
        fontweight="bold",
        color=GLOBAL_COLOR,
        arrowprops={"arrowstyle": "->", "color": GLOBAL_COLOR},
        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": GLOBAL_COLOR, "alpha": 0.9},
        zorder=6,
    )
    ax.set_ylim(0.0, top)
    if top < GLOBAL_WARN_PCT:
        below_bands(ax, "global and local stay below their warn levels (20 %, 30 %)")
    ax.yaxis.set_major_formatter(PercentFormatter(100.0))
    return _time_series_done(fig, ax, "fragmentation (%)", "Fragmentation over time", space)


def memory_timeline(space: SpaceAnalysis) -> Figure:
    """Live bytes, free bytes and the largest free block over time, with device capacity; a
    caching allocator's space in its own figures (:func:`_pool_memory`)."""
    if space.timeline.pool is not None:
        return _pool_memory(space, space.timeline.pool)
    fig, (ax,) = new_figure()
    tl = space.timeline
    idx = drawn_indices(space, tl.free_bytes, tl.largest_free_bytes)
    ax.fill_between(
        seconds_since_start(space)[idx],
        tl.largest_free_bytes[idx],
        tl.free_bytes[idx],
        step="post",
        color=FREE_COLOR,
        alpha=0.15,
        linewidth=0,
        label="free outside the largest block (F − L)",
    )
    peak = space.peak
    _step(ax, space, tl.live_bytes, color=LIVE_COLOR, linewidth=1.4,
          label=f"live bytes (U) · max {format_bytes(space.max_live_bytes)}")  # fmt: skip
    _step(ax, space, tl.free_bytes, color=FREE_COLOR, linewidth=1.2,
          label=f"free bytes (F) · {format_bytes(peak.free_bytes)} at peak frag")  # fmt: skip
    largest = format_bytes(peak.largest_free_bytes)
    _step(ax, space, tl.largest_free_bytes, color=LARGEST_FREE_COLOR, linewidth=1.2,
          label=f"largest free block (L) · {largest} at peak frag")  # fmt: skip
    _capacity_line(ax, space)
    top = max(space.capacity_bytes, int(tl.free_bytes.max()), int(tl.live_bytes.max()))
    ax.set_ylim(0, top * 1.08)
    bytes_axis(ax.yaxis)
    return _time_series_done(fig, ax, "device memory (bytes, binary units)", "Memory over time", space)


def _pool_memory(space: SpaceAnalysis, pool: PoolColumns) -> Figure:
    """What a PyTorch user reads memory by: reserved (the segments, or the driver's resident
    pages), allocated and requested, the memory between reserved and allocated shaded, and the
    largest usable request."""
    fig, (ax,) = new_figure()
    tl = space.timeline
    idx = drawn_indices(space, pool.reserved_bytes, pool.allocated_bytes)
    ax.fill_between(
        seconds_since_start(space)[idx], pool.allocated_bytes[idx], pool.reserved_bytes[idx],
        step="post", color=FREE_COLOR, alpha=0.15, linewidth=0,
        label=space.source.words.unallocated,
    )  # fmt: skip
    peak = space.peak
    reserved_peak = format_bytes(int(pool.reserved_bytes.max()))
    _step(ax, space, pool.reserved_bytes, color=FREE_COLOR, linewidth=1.4,
          label=f"reserved · max {reserved_peak}")  # fmt: skip
    _step(ax, space, pool.allocated_bytes, color=LIVE_COLOR, linewidth=1.4,
          label=f"allocated · max {format_bytes(int(pool.allocated_bytes.max()))}")  # fmt: skip
    _step(ax, space, tl.live_bytes, color=LIVE_COLOR, linewidth=0.9, linestyle=":",
          label=f"requested · max {format_bytes(space.max_live_bytes)}")  # fmt: skip
    _step(ax, space, tl.largest_free_bytes, color=LARGEST_FREE_COLOR, linewidth=1.1,
          label=f"largest usable request (L_eff) · {format_bytes(peak.largest_free_bytes)}"
          " at worst frag")  # fmt: skip
    _capacity_line(ax, space)
    top = max(space.capacity_bytes, int(pool.reserved_bytes.max()), int(tl.largest_free_bytes.max()))
    ax.set_ylim(0, top * 1.08)
    bytes_axis(ax.yaxis)
    return _time_series_done(fig, ax, "device memory (bytes, binary units)", "Memory over time", space)


def free_block_count(space: SpaceAnalysis) -> Figure:
    """The number of free blocks (gaps) over time, on the 100 / 500 health bands."""
    fig, (ax,) = new_figure()
    tl = space.timeline
    top = max(float(tl.free_blocks.max()) * 1.15, 5.0)
    ax.axhspan(FREE_BLOCKS_WARN, FREE_BLOCKS_CRITICAL, color=WARN_BAND, zorder=0,
               label="warn (100–500)")  # fmt: skip
    ax.axhspan(FREE_BLOCKS_CRITICAL, max(top, FREE_BLOCKS_CRITICAL * 2.0), color=CRITICAL_BAND,
               zorder=0, label="critical (> 500)")  # fmt: skip
    _step(ax, space, tl.free_blocks, color=FREE_BLOCKS_COLOR, linewidth=1.3, label="free blocks (N)")
    if top < FREE_BLOCKS_WARN:
        below_bands(ax, "the count stays below the warn level (100)")
    time_axis(ax, space)
    ax.set_ylim(0, top)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return _time_series_done(fig, ax, "free blocks (count)", "Free blocks (gaps) over time", space)


def _histogram(ax: Axes, buckets: list[Bucket], title: str, what: str, empty_text: str) -> None:
    ax.set_title(title, fontsize=10)
    if not buckets:
        say_empty(ax, empty_text)
        return
    # Non-empty classes side by side: placed by class, 4 B to 128 GiB leaves no room for labels.
    k = np.arange(len(buckets), dtype=np.float64)
    counts = [b.count for b in buckets]
    nbytes = [b.bytes for b in buckets]
    bars = ax.bar(k - 0.2, counts, width=0.4, color=COUNT_COLOR, label=f"{what} (count, left)")
    ax.set_ylabel(f"{what} (count)", color=COUNT_COLOR)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    twin = ax.twinx()
    twin_bars = twin.bar(k + 0.2, nbytes, width=0.4, color=BYTES_COLOR, label="bytes (right)")
    bytes_axis(twin.yaxis)
    twin.set_ylabel("bytes (binary units)", color=BYTES_COLOR)
    labels = [size_class_label(b.lo_bytes.bit_length() - 1) for b in buckets]
    ax.set_xticks(k, labels, rotation=50, ha="right", rotation_mode="anchor", fontsize=7)
    ax.set_xlim(k.min() - 0.7, k.max() + 0.7)
    ax.set_xlabel("size class (log2 buckets; empty classes left out)")
    ax.legend(handles=[bars, twin_bars], loc="upper left", fontsize=7, frameon=False)


def size_histograms(space: SpaceAnalysis) -> Figure:
    """Allocation sizes by log2 class, and the free blocks at the peak by class."""
    fig, (left, right) = new_figure(2)
    _histogram(
        left, space.size_histogram, "allocation sizes (whole trace)", "allocations", "no allocations"
    )
    _histogram(
        right,
        space.free_block_histogram,
        f"free blocks at peak fragmentation ({moment(space, space.peak.time_ns)})",
        "free blocks",
        "no free memory at the peak",
    )
    figure_title(fig, "Size classes", space)
    return fig


def hotspot_sites(space: SpaceAnalysis) -> list[tuple[str, int, int, int]]:
    """``(site, hole_bytes, hole_creating_frees, out_of_order_frees)`` per site, summed over
    size classes, most hole bytes first (then most out-of-order frees, then site)."""
    totals: dict[str, list[int]] = {}
    for h in space.hotspots:
        row = totals.setdefault(h.site, [0, 0, 0])
        row[0] += h.hole_bytes
        row[1] += h.hole_creating_frees
        row[2] += h.out_of_order_frees
    rows = [(site, b, holes, ooo) for site, (b, holes, ooo) in totals.items()]
    rows.sort(key=lambda r: (-r[1], -r[3], r[0]))
    return rows


def hotspots_chart(space: SpaceAnalysis) -> Figure:
    """Bytes freed into holes per allocation site (top sites), from the out-of-order frees."""
    fig, (ax,) = new_figure()
    every_site = hotspot_sites(space)
    rows = every_site[:TOP_HOTSPOT_SITES]
    if not rows:
        say_empty(
            ax, "no out-of-order frees: every free released the most recently allocated live block"
        )
    else:
        y = np.arange(len(rows))[::-1]
        values = [r[1] for r in rows]
        ax.barh(y, values, height=0.6, color=HOLE_COLOR, label="hole bytes")
        ax.set_yticks(y, [short_site(r[0]) for r in rows], fontsize=8)
        # Keep room for at least 5 bars so one or two do not swell to fill the plot.
        slots = max(len(rows), 5)
        ax.set_ylim(len(rows) - slots - 0.5, len(rows) - 0.5)
        top = max(max(values), 1)
        ax.set_xlim(0, top * 1.6)
        for yi, (_, b, holes, ooo) in zip(y, rows, strict=True):
            text = f"{format_bytes(b)} · {count_of(holes, 'hole')} / {count_of(ooo, 'out-of-order free')}"
            ax.text(b + top * 0.01, yi, text, va="center", fontsize=8)
        bytes_axis(ax.xaxis)
        ax.set_xlabel("bytes of blocks whose out-of-order free left a hole (binary units)")
        ax.set_ylabel(space.source.words.site_label)
        ax.grid(True, axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
    note = f"top {len(rows)} of {len(every_site)} sites" if len(every_site) > len(rows) else ""
    figure_title(fig, "Hole bytes by allocation site", space, note)
    return fig


figure_builders: dict[str, FigureBuilder] = {
    "fragmentation": fragmentation_timeline,
    "memory": memory_timeline,
    "free_blocks": free_block_count,
    "sizes": size_histograms,
    "address_map": address_map,
    "hotspots": hotspots_chart,
}
# The figures whose x axis is time: a space that is one moment (a snapshot without a trace, its
# final state only) has nothing to draw on it.
TIME_FIGURES = frozenset({"fragmentation", "memory", "free_blocks", "address_map"})


def one_moment(space: SpaceAnalysis) -> bool:
    """Every point of the space is at the same time: a time axis would be empty."""
    t = space.timeline.time_ns
    return len(t) == 0 or int(t.max()) == int(t.min())


def figures_for(space: SpaceAnalysis) -> dict[str, FigureBuilder]:
    """The figures worth drawing for ``space``, in ``figure_builders`` order: no time plot
    for a space that is one moment."""
    if not one_moment(space):
        return figure_builders
    return {name: build for name, build in figure_builders.items() if name not in TIME_FIGURES}

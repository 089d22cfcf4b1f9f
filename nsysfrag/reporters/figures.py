"""Matplotlib figures of one space's analysis: data in, ``Figure`` out.

Every builder takes a ``SpaceAnalysis`` and returns a ``matplotlib.figure.Figure`` made without
pyplot, so building figures touches no global state and is safe from several threads. Rendering
(PNG files, an HTML page) is the caller's business: iterate ``figure_builders``.

Time series are step functions (each point is the state after an event and holds until the
next), on an x axis of seconds since the space's first event.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import Formatter, Locator, MaxNLocator, PercentFormatter

from nsysfrag.analysis import Bucket, SpaceAnalysis, Timeline
from nsysfrag.analysis.metrics import F64, format_bytes, size_class_label
from nsysfrag.events import I64
from nsysfrag.models.observed import MODEL_NAME
from nsysfrag.models.series import ALLOCATED

FIGSIZE_IN = (10.0, 4.5)
DPI = 100
MODEL_TITLE = f"{MODEL_NAME} address space"  # the history chart's runs are observed ones

# One colour per quantity, the same in every figure.
GLOBAL_COLOR = "#1f77b4"
LOCAL_COLOR = "#ff7f0e"
LIVE_COLOR = "#2ca02c"
FREE_COLOR = "#9467bd"
LARGEST_FREE_COLOR = "#17becf"
FREE_BLOCKS_COLOR = "#3b3b3b"
CAPACITY_COLOR = "#000000"
COUNT_COLOR = "#5f6b7a"
BYTES_COLOR = "#c9a227"
HOLE_COLOR = "#c44e52"
WARN_BAND = "#fff3b0"
CRITICAL_BAND = "#ffd6d6"
OTHER_SITES_COLOR = "#c8c8c8"
# Sites: ColorBrewer Dark2 without its grey (kept for "other sites") plus two Paired tones, so
# no site takes the global (blue) or local (orange) colour.
SITE_COLORS = (
    "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e",
    "#e6ab02", "#a6761d", "#a6cee3", "#fb9a99",
)  # fmt: skip

# The health thresholds (docs/metrics.md, "Health"), in the units the figures draw.
GLOBAL_WARN_PCT, GLOBAL_CRITICAL_PCT = 20.0, 40.0
LOCAL_WARN_PCT, LOCAL_CRITICAL_PCT = 30.0, 60.0
FREE_BLOCKS_WARN, FREE_BLOCKS_CRITICAL = 100, 500

# Below this many events every event is drawn; above it each line keeps, per time bin, its
# first, last, lowest and highest point, which is all a 1000-pixel-wide plot can show.
FULL_RESOLUTION_EVENTS = 20_000
TIME_BINS = 2_000
MAX_RECTANGLES = 20_000
TOP_SITES = len(SITE_COLORS)
TOP_HOTSPOT_SITES = 10
SITE_LABEL_CHARS = 48

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")

FigureBuilder = Callable[[SpaceAnalysis], Figure]


# ---------------------------------------------------------------- axes helpers


def _binary_unit(magnitude: float) -> tuple[float, str]:
    """The largest binary unit not above ``magnitude`` (bytes for anything under 1 KiB)."""
    scale, name = 1.0, _BINARY_UNITS[0]
    for power, unit in enumerate(_BINARY_UNITS):
        if magnitude >= float(1 << (10 * power)):
            scale, name = float(1 << (10 * power)), unit
    return scale, name


def _view_unit(axis: object) -> tuple[float, str]:
    vmin, vmax = axis.get_view_interval()  # type: ignore[attr-defined]
    return _binary_unit(max(abs(float(vmin)), abs(float(vmax))))


class BytesLocator(Locator):
    """Round ticks in the binary unit of the axis range: 0, 20, 40 GiB rather than 21.47 GB."""

    def __init__(self) -> None:
        self._inner = MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10])

    def __call__(self) -> Sequence[float]:
        vmin, vmax = self.axis.get_view_interval()  # type: ignore[union-attr]
        return self.tick_values(vmin, vmax)

    def tick_values(self, vmin: float, vmax: float) -> Sequence[float]:
        scale, _ = _binary_unit(max(abs(vmin), abs(vmax)))
        self._inner.set_axis(self.axis)
        ticks = [float(t) * scale for t in self._inner.tick_values(vmin / scale, vmax / scale)]
        return self.raise_if_exceeds(ticks)


class BytesFormatter(Formatter):
    """Tick labels in the binary unit of the axis range: ``20 GiB``, ``512 MiB``."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        scale, unit = _view_unit(self.axis)
        return f"{x / scale:.4g} {unit}"


def _bytes_axis(axis: object) -> None:
    axis.set_major_locator(BytesLocator())  # type: ignore[attr-defined]
    axis.set_major_formatter(BytesFormatter())  # type: ignore[attr-defined]


def _new_figure(ncols: int = 1) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    fig.set_dpi(DPI)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def space_label(space: SpaceAnalysis) -> str:
    """``pid 3310 (python3) · device 0 (NVIDIA H100 80GB HBM3, 79.65 GiB)``."""
    process = f" ({space.process_name})" if space.process_name else ""
    label = (
        f"pid {space.pid}{process} · device {space.device}"
        f" ({space.device_name}, {format_bytes(space.capacity_bytes)})"
    )
    if space.span_mode:
        label += " · span mode: addresses exceed device memory, free space over-stated"
    return label


def _title(fig: Figure, what: str, space: SpaceAnalysis, note: str = "") -> None:
    extra = f" · {note}" if note else ""
    model = space.source.words.figure_title
    fig.suptitle(f"{what} · {model}{extra}\n{space_label(space)}", fontsize=11)


def _seconds(space: SpaceAnalysis) -> F64:
    t = space.timeline.time_ns
    seconds: F64 = (t - t[0]).astype(np.float64) / 1e9
    return seconds


def _trace_time(ns: int) -> str:
    return f"{ns / 1e9:.3f} s" if abs(ns) >= 1_000_000 else f"{ns / 1e3:.1f} µs"


def _time_axis(ax: Axes, space: SpaceAnalysis) -> None:
    t = space.timeline.time_ns
    span = float(int(t[-1]) - int(t[0])) / 1e9
    ax.set_xlim(0.0, span if span > 0 else 1.0)
    ax.set_xlabel(
        f"time since the space's first event (s; that event is at {_trace_time(int(t[0]))}"
        " of the trace)"
    )


def step_indices(time_ns: I64, values: npt.NDArray[np.generic]) -> I64:
    """Indices of the points that draw ``values`` as a step function without visible loss.

    Every index when there are at most ``FULL_RESOLUTION_EVENTS``; otherwise, for each of
    ``TIME_BINS`` equal time bins, the first, last, lowest and highest point.
    """
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
    keep = [firsts, lasts]
    for extreme in (np.minimum, np.maximum):
        hits = np.flatnonzero(values == np.repeat(extreme.reduceat(values, firsts), runs))
        keep.append(hits[np.r_[True, bins[hits][1:] != bins[hits][:-1]]])
    return np.unique(np.concatenate(keep)).astype(np.int64)


def _step(
    ax: Axes, space: SpaceAnalysis, values: npt.NDArray[np.generic], scale: float = 1.0, **kw: Any
) -> None:
    idx = step_indices(space.timeline.time_ns, values)
    ax.plot(_seconds(space)[idx], values[idx].astype(np.float64) * scale, drawstyle="steps-post", **kw)


def _zoomed_top(highest: float, full: float) -> float:
    """The y limit: a little above the highest value, so a flat line near 0 still shows its
    shape; never above ``full``."""
    return min(full, max(highest * 1.15, full / 50.0))


def _below_bands(ax: Axes, text: str) -> None:
    # The bands are drawn but out of view: say so, or a zoomed-in plot looks alarming.
    ax.text(
        0.01, 0.97, f"ok: {text}", transform=ax.transAxes, ha="left", va="top", fontsize=8,
        color="#2e7d32",
        bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "#2e7d32", "alpha": 0.9},
    )  # fmt: skip


def _empty(ax: Axes, text: str) -> None:
    ax.text(
        0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=11,
        color="#555555",
    )  # fmt: skip
    ax.set_xticks([])
    ax.set_yticks([])


def _legend_right(ax: Axes, **kw: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, **kw)


def _time_series_done(fig: Figure, ax: Axes, ylabel: str, what: str, space: SpaceAnalysis) -> Figure:
    """The finish every time-series figure shares: y label, grid, legend, title."""
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", color="#dddddd", linewidth=0.6)
    _legend_right(ax)
    _title(fig, what, space)
    return fig


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _short_site(site: str) -> str:
    if len(site) <= SITE_LABEL_CHARS:
        return site
    return "…" + site[-(SITE_LABEL_CHARS - 1) :]


# ---------------------------------------------------------------- the figures


def fragmentation_timeline(space: SpaceAnalysis) -> Figure:
    """Global and local fragmentation (%) over time, on the global health bands, peak marked."""
    fig, (ax,) = _new_figure()
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
    _step(ax, space, tl.local_frag, 100.0, color=LOCAL_COLOR, linewidth=1.1,
          label="local frag = 1 − L / F")  # fmt: skip
    _step(ax, space, tl.global_frag, 100.0, color=GLOBAL_COLOR, linewidth=1.6,
          label="global frag = (F − L) / C")  # fmt: skip

    peak_x = float(int(space.peak.time_ns) - int(tl.time_ns[0])) / 1e9
    peak_y = space.peak.global_frag * 100.0
    top = _zoomed_top(max(space.max_global_frag, space.max_local_frag) * 100.0, 100.0)
    ax.plot(
        [peak_x], [peak_y], marker="o", markersize=7, color=GLOBAL_COLOR, markeredgecolor="black",
        linestyle="none", label="peak global frag", zorder=5,
    )  # fmt: skip
    _time_axis(ax, space)
    x0, x1 = ax.get_xlim()
    right_half = peak_x > x0 + 0.6 * (x1 - x0)
    near_top = peak_y > 0.6 * top
    ax.annotate(
        f"peak {peak_y:.1f} % at {peak_x:.2f} s",
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
        _below_bands(ax, "global and local stay below their warn levels (20 %, 30 %)")
    ax.yaxis.set_major_formatter(PercentFormatter(100.0))
    return _time_series_done(fig, ax, "fragmentation (%)", "Fragmentation over time", space)


def memory_timeline(space: SpaceAnalysis) -> Figure:
    """Live bytes, free bytes and the largest free block over time, with device capacity."""
    fig, (ax,) = _new_figure()
    tl = space.timeline
    idx = np.union1d(
        step_indices(tl.time_ns, tl.free_bytes), step_indices(tl.time_ns, tl.largest_free_bytes)
    )
    ax.fill_between(
        _seconds(space)[idx],
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
    cap = space.capacity_bytes
    ax.axhline(cap, color=CAPACITY_COLOR, linestyle="--", linewidth=1.0,
               label=f"device capacity (C) {format_bytes(cap)}")  # fmt: skip
    _time_axis(ax, space)
    ax.text(
        0.995, cap, f"device capacity {format_bytes(cap)}", transform=ax.get_yaxis_transform(),
        ha="right", va="bottom", fontsize=8, color=CAPACITY_COLOR,
    )  # fmt: skip
    top = max(cap, int(tl.free_bytes.max()), int(tl.live_bytes.max()))
    ax.set_ylim(0, top * 1.08)
    _bytes_axis(ax.yaxis)
    return _time_series_done(fig, ax, "device memory (bytes, binary units)", "Memory over time", space)


def free_block_count(space: SpaceAnalysis) -> Figure:
    """The number of free blocks (gaps) over time, on the 100 / 500 health bands."""
    fig, (ax,) = _new_figure()
    tl = space.timeline
    top = max(float(tl.free_blocks.max()) * 1.15, 5.0)
    ax.axhspan(FREE_BLOCKS_WARN, FREE_BLOCKS_CRITICAL, color=WARN_BAND, zorder=0,
               label="warn (100–500)")  # fmt: skip
    ax.axhspan(FREE_BLOCKS_CRITICAL, max(top, FREE_BLOCKS_CRITICAL * 2.0), color=CRITICAL_BAND,
               zorder=0, label="critical (> 500)")  # fmt: skip
    _step(ax, space, tl.free_blocks, color=FREE_BLOCKS_COLOR, linewidth=1.3, label="free blocks (N)")
    if top < FREE_BLOCKS_WARN:
        _below_bands(ax, "the count stays below the warn level (100)")
    _time_axis(ax, space)
    ax.set_ylim(0, top)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return _time_series_done(fig, ax, "free blocks (count)", "Free blocks (gaps) over time", space)


def _histogram(ax: Axes, buckets: list[Bucket], title: str, what: str, empty_text: str) -> None:
    ax.set_title(title, fontsize=10)
    if not buckets:
        _empty(ax, empty_text)
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
    _bytes_axis(twin.yaxis)
    twin.set_ylabel("bytes (binary units)", color=BYTES_COLOR)
    labels = [size_class_label(b.lo_bytes.bit_length() - 1) for b in buckets]
    ax.set_xticks(k, labels, rotation=50, ha="right", rotation_mode="anchor", fontsize=7)
    ax.set_xlim(k.min() - 0.7, k.max() + 0.7)
    ax.set_xlabel("size class (log2 buckets; empty classes left out)")
    ax.legend(handles=[bars, twin_bars], loc="upper left", fontsize=7, frameon=False)


def size_histograms(space: SpaceAnalysis) -> Figure:
    """Allocation sizes by log2 class, and the free blocks at the peak by class."""
    fig, (left, right) = _new_figure(2)
    _histogram(
        left, space.size_histogram, "allocation sizes (whole trace)", "allocations", "no allocations"
    )
    peak_s = float(int(space.peak.time_ns) - int(space.timeline.time_ns[0])) / 1e9
    _histogram(
        right,
        space.free_block_histogram,
        f"free blocks at peak fragmentation ({peak_s:.2f} s)",
        "free blocks",
        "no free memory at the peak",
    )
    _title(fig, "Size classes", space)
    return fig


def allocation_events(timeline: Timeline) -> npt.NDArray[np.bool_]:
    """Which events placed a block: ``timeline.event`` holds replay outcome codes or, in older
    analyses, their names."""
    event = timeline.event
    if isinstance(event, np.ndarray) and event.dtype.kind in "iu":
        return np.asarray(event == ALLOCATED)
    return np.fromiter((e == "alloc" for e in event), dtype=bool, count=len(timeline.time_ns))


def _site_colors(
    space: SpaceAnalysis, allocs: I64, score: F64
) -> tuple[npt.NDArray[np.object_], list[tuple[str, str]]]:
    """A colour per block: the top sites by summed bytes × lifetime get their own colour."""
    tl = space.timeline
    codes = tl.site[allocs]
    weight = np.bincount(codes, weights=score, minlength=len(tl.site_names))
    present = np.flatnonzero(np.bincount(codes, minlength=len(tl.site_names)))
    ranked = sorted(present.tolist(), key=lambda c: (-weight[c], tl.site_names[c]))
    palette = np.full(len(tl.site_names), OTHER_SITES_COLOR, dtype=object)
    legend = []
    for code, color in zip(ranked[:TOP_SITES], SITE_COLORS, strict=False):
        palette[code] = color
        legend.append((tl.site_names[code], color))
    if len(ranked) > TOP_SITES:
        legend.append((f"{len(ranked) - TOP_SITES} other site(s)", OTHER_SITES_COLOR))
    return palette[codes], legend


def address_map(space: SpaceAnalysis) -> Figure:
    """Live blocks as rectangles: time on x, offset from the arena base on y; gaps stay white.

    At most ``MAX_RECTANGLES`` blocks are drawn, ranked by bytes × lifetime (then bytes), so
    what dominates the picture is kept.
    """
    fig, (ax,) = _new_figure()
    tl = space.timeline
    allocs = np.flatnonzero(allocation_events(tl))
    note = ""
    arena = space.arena_end - space.base_address
    highest = 0
    if len(allocs) == 0:
        _empty(ax, "no live blocks: this space has no allocations")
    else:
        t = tl.time_ns
        ends = tl.removed_at[allocs]
        start_ns = t[allocs]
        end_ns = np.where(ends >= 0, t[np.maximum(ends, 0)], t[-1])
        nbytes = tl.bytes[allocs].astype(np.float64)
        score = nbytes * (end_ns - start_ns).astype(np.float64)
        colors, legend = _site_colors(space, allocs, score)
        if len(allocs) > MAX_RECTANGLES:
            keep = np.lexsort((np.arange(len(allocs)), -nbytes, -score))[:MAX_RECTANGLES]
            keep.sort()
            note = f"largest {MAX_RECTANGLES:,} of {len(allocs):,} blocks (by bytes × lifetime)"
        else:
            keep = np.arange(len(allocs))
        offsets = tl.address[allocs] - np.uint64(space.base_address)
        highest = int((offsets + tl.bytes[allocs].astype(np.uint64)).max())
        t0 = int(t[0])
        x0 = (start_ns[keep] - t0).astype(np.float64) / 1e9
        x1 = (end_ns[keep] - t0).astype(np.float64) / 1e9
        y0 = offsets[keep].astype(np.float64)
        y1 = y0 + nbytes[keep]
        corners = ((x0, y0), (x0, y1), (x1, y1), (x1, y0))
        verts = np.stack([np.column_stack(c) for c in corners], axis=1)
        ax.add_collection(
            PolyCollection(list(verts), facecolors=list(colors[keep]), edgecolors="none", linewidths=0)
        )
        handles = [Patch(facecolor=c, label=_short_site(s)) for s, c in legend]
        _legend_right(ax, handles=handles, title="allocation site", title_fontsize=8)
    if space.span_mode:
        ax.axhline(space.capacity_bytes, color=CAPACITY_COLOR, linestyle="--", linewidth=0.8)
    _time_axis(ax, space)
    top = min(arena, highest * 1.12) if highest > 0 else arena
    ax.set_ylim(0, top)
    if top < arena:
        ax.text(
            0.99, 0.98,
            f"never used above {format_bytes(highest)}; the arena is {format_bytes(arena)}",
            transform=ax.transAxes, ha="right", va="top", fontsize=8, color="#555555",
        )  # fmt: skip
    _bytes_axis(ax.yaxis)
    ax.set_ylabel(f"offset from base 0x{space.base_address:x} (bytes)")
    _title(fig, "Address map: live blocks over time", space, note)
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
    fig, (ax,) = _new_figure()
    every_site = hotspot_sites(space)
    rows = every_site[:TOP_HOTSPOT_SITES]
    if not rows:
        _empty(
            ax, "no out-of-order frees: every free released the most recently allocated live block"
        )
    else:
        y = np.arange(len(rows))[::-1]
        values = [r[1] for r in rows]
        ax.barh(y, values, height=0.6, color=HOLE_COLOR, label="hole bytes")
        ax.set_yticks(y, [_short_site(r[0]) for r in rows], fontsize=8)
        # Keep room for at least 5 bars so one or two do not swell to fill the plot.
        slots = max(len(rows), 5)
        ax.set_ylim(len(rows) - slots - 0.5, len(rows) - 0.5)
        top = max(max(values), 1)
        ax.set_xlim(0, top * 1.6)
        for yi, (_, b, holes, ooo) in zip(y, rows, strict=True):
            text = f"{format_bytes(b)} · {_count(holes, 'hole')} / {_count(ooo, 'out-of-order free')}"
            ax.text(b + top * 0.01, yi, text, va="center", fontsize=8)
        _bytes_axis(ax.xaxis)
        ax.set_xlabel("bytes of blocks whose out-of-order free left a hole (binary units)")
        ax.set_ylabel("allocation site (NVTX)")
        ax.grid(True, axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
    note = f"top {len(rows)} of {len(every_site)} sites" if len(every_site) > len(rows) else ""
    _title(fig, "Hole bytes by allocation site", space, note)
    return fig


figure_builders: dict[str, FigureBuilder] = {
    "fragmentation": fragmentation_timeline,
    "memory": memory_timeline,
    "free_blocks": free_block_count,
    "sizes": size_histograms,
    "address_map": address_map,
    "hotspots": hotspots_chart,
}

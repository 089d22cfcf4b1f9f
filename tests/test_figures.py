"""The PNG figures: each figure's drawn data equals the analysis it shows; files are valid PNGs."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import struct
import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.axes import Axes
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from nsysfrag.analysis import Analysis, SpaceAnalysis, Timeline, analyze
from nsysfrag.analysis.metrics import format_bytes, size_class_label
from nsysfrag.analysis.results import UNKNOWN, Failure, State
from nsysfrag.inputs import open_input
from nsysfrag.inputs.nsys import read_export
from nsysfrag.models.observed.kernel import ALLOCATED, FREED
from nsysfrag.reporters import figure_axes as figures
from nsysfrag.reporters import timeline_points
from nsysfrag.reporters.address_map import (
    FREE_NOTE,
    MIN_BLOCK_NOTE,
    address_map,
    allocation_events,
    block_image,
    drawn_image,
)
from nsysfrag.reporters.address_raster import paint_blocks, pixel_spans
from nsysfrag.reporters.figures import (
    figure_builders,
    fragmentation_timeline,
    free_block_count,
    hotspots_chart,
    memory_timeline,
    size_histograms,
)
from nsysfrag.reporters.png import write_pngs
from nsysfrag.reporters.timeline_points import (
    FULL_RESOLUTION_EVENTS,
    TIME_BINS,
    drawn_indices,
    failure_points,
    step_indices,
)
from nsysfrag.testing.nsys_export import FREE, ApiRow, MemoryRow, NvtxRow
from tests.conftest import BASE, REPO, SAMPLES, MakeTrace, MiB

S = 1_000_000_000  # ns
# CI runs the default; set NSYSFRAG_PROPERTY_EXAMPLES=5000 for a deeper local check.
EXAMPLES = int(os.environ.get("NSYSFRAG_PROPERTY_EXAMPLES", "60"))


@cache
def sample(name: str) -> Analysis:
    return analyze(read_export(SAMPLES / f"{name}.sqlite"))


def inference() -> SpaceAnalysis:
    return sample("inference_serving").spaces[0]


def churn() -> SpaceAnalysis:
    return sample("churn_anomalies").spaces[0]


def small_space(make_trace: MakeTrace) -> SpaceAnalysis:
    """weights | act(2 MiB) | act(1 MiB) over two pages, then the 2 MiB act is freed out of order
    (a 2 MiB hole: weights and the 1 MiB act keep both pages resident), scratch lands in it, and
    weights is freed (out of order: a 1 MiB hole, since scratch keeps page 0)."""
    steps = [  # (seconds, offset, bytes, site or None for a free)
        (1, 0, MiB, "weights"),
        (2, MiB, 2 * MiB, "act"),
        (3, 3 * MiB, MiB, "act"),
        (4, MiB, 0, None),
        (5, MiB, MiB // 2, "scratch"),
        (6, 0, 0, None),
    ]
    memory, api, nvtx = [], [], []
    for corr, (sec, offset, size, site) in enumerate(steps, start=1):
        t = sec * S
        if site is None:
            memory.append(MemoryRow(t, 1, 0, BASE + offset, size, op=FREE))
            continue
        memory.append(MemoryRow(t, 1, 0, BASE + offset, size, correlation_id=corr))
        api.append(ApiRow(t - 100, t + 100, 1, 7, "cudaMalloc_v3020", corr))
        nvtx.append(NvtxRow(t - 500, t + 500, 1, 7, site))
    spaces = analyze(read_export(make_trace(memory, api, nvtx))).spaces
    assert len(spaces) == 1
    return spaces[0]


def only_axes(fig: Figure) -> Axes:
    assert len(fig.axes) == 1
    return fig.axes[0]


def line(ax: Axes, label_start: str) -> Line2D:
    found = [ln for ln in ax.get_lines() if ln.get_label().startswith(label_start)]
    assert len(found) == 1, [ln.get_label() for ln in ax.get_lines()]
    return found[0]


def patch(ax: Axes, label_start: str) -> Patch:
    found = [p for p in ax.patches if str(p.get_label()).startswith(label_start)]
    assert len(found) == 1, [p.get_label() for p in ax.patches]
    return found[0]


def y_extent(ax: Axes, p: Patch) -> tuple[float, float]:
    """A patch's y range in data coordinates (axhspan gives a Rectangle or a Polygon by version)."""
    vertices = p.get_path().transformed(p.get_transform()).vertices
    ys = ax.transData.inverted().transform(vertices)[:, 1]
    return round(float(ys.min()), 6), round(float(ys.max()), 6)


def seconds(space: SpaceAnalysis) -> np.ndarray:
    t = space.timeline.time_ns
    return (t - t[0]) / 1e9


def bar_container(fig: Figure, label_start: str) -> BarContainer:
    found = [c for a in fig.axes for c in a.containers if str(c.get_label()).startswith(label_start)]
    assert found, "no bar container labelled " + label_start
    return found[0]


# ---------------------------------------------------------------- every figure


@pytest.mark.parametrize("name", list(figure_builders))
@pytest.mark.parametrize("space", [inference, churn], ids=["inference_serving", "churn_anomalies"])
def test_every_figure_names_model_space_and_has_a_fixed_size(name: str, space) -> None:  # type: ignore[no-untyped-def]
    s = space()
    fig = figure_builders[name](s)
    assert isinstance(fig, Figure)
    title = fig.get_suptitle()
    assert "observed on the driver's pages" in title
    assert f"pid {s.pid}" in title and f"device {s.device} ({s.device_name}" in title
    assert tuple(fig.get_size_inches() * fig.get_dpi()) == (1000, 450)
    for ax in fig.axes:
        for label in (ax.get_xlabel(), ax.get_ylabel()):
            assert not label or "(" in label  # a labelled axis says its unit


def test_figure_builders_are_the_six_figures_in_file_order() -> None:
    assert list(figure_builders) == ["fragmentation", "memory", "free_blocks", "sizes", "address_map", "hotspots"]


# ---------------------------------------------------------------- fragmentation


def test_fragmentation_lines_are_the_timeline_as_steps() -> None:
    s = inference()
    ax = only_axes(fragmentation_timeline(s))
    g, loc = line(ax, "global frag"), line(ax, "local frag")
    assert len(s.timeline.time_ns) <= FULL_RESOLUTION_EVENTS  # so every event is drawn
    np.testing.assert_array_equal(g.get_ydata(), s.timeline.global_frag * 100)
    np.testing.assert_array_equal(loc.get_ydata(), s.timeline.local_frag * 100)
    np.testing.assert_array_equal(g.get_xdata(), seconds(s))
    assert g.get_drawstyle() == loc.get_drawstyle() == "steps-post"
    assert g.get_color() == figures.GLOBAL_COLOR and loc.get_color() == figures.LOCAL_COLOR
    assert "%" in ax.get_ylabel() and "(s" in ax.get_xlabel()


def test_fragmentation_has_the_global_health_bands() -> None:
    ax = only_axes(fragmentation_timeline(inference()))
    assert y_extent(ax, patch(ax, "global warn")) == (20.0, 40.0)
    assert y_extent(ax, patch(ax, "global critical"))[0] == 40.0


def test_fragmentation_peak_is_marked_and_annotated() -> None:
    s = inference()
    ax = only_axes(fragmentation_timeline(s))
    peak_s = (s.peak.time_ns - s.source.first_event_ns) / 1e9  # the report's one time base
    marker = line(ax, "peak global frag")
    assert list(marker.get_xdata()) == [peak_s]
    assert list(marker.get_ydata()) == [s.peak.global_frag * 100]
    assert marker.get_color() == figures.GLOBAL_COLOR
    texts = [t.get_text() for t in ax.texts]
    assert f"peak {s.peak.global_frag * 100:.1f} % at {peak_s:.3f} s" in texts


def test_fragmentation_of_a_healthy_space_zooms_in_and_says_it_is_ok() -> None:
    s = churn()
    assert s.max_global_frag < 0.2 and s.max_local_frag < 0.3
    ax = only_axes(fragmentation_timeline(s))
    assert ax.get_ylim()[1] < 20
    assert any(t.get_text().startswith("ok:") for t in ax.texts)


def test_fragmentation_of_the_hand_made_trace(make_trace: MakeTrace) -> None:
    s = small_space(make_trace)
    ax = only_axes(fragmentation_timeline(s))
    assert list(line(ax, "global frag").get_xdata()) == [0, 1, 2, 3, 4, 5]
    # After the 2 MiB free: 2 MiB hole + (64 - 4) MiB at the top, of 64 MiB.
    assert line(ax, "global frag").get_ydata()[3] == pytest.approx(2 / 64 * 100)


# ---------------------------------------------------------------- memory


def test_memory_lines_are_the_driver_s_pages_and_capacity_is_drawn() -> None:
    """An nsys space is drawn in the same figures as a snapshot's: reserved (resident pages),
    allocated, requested and the largest usable request, the stranded memory shaded."""
    s = inference()
    ax = only_axes(memory_timeline(s))
    pool = s.timeline.pool
    assert pool is not None
    reserved = line(ax, "reserved")
    at = np.searchsorted(seconds(s), np.asarray(reserved.get_xdata(), dtype=np.float64), side="right") - 1
    np.testing.assert_array_equal(reserved.get_ydata(), pool.reserved_bytes[at])
    np.testing.assert_array_equal(line(ax, "allocated").get_ydata(), pool.allocated_bytes[at])
    assert "stranded in resident pages (reserved − allocated)" in [str(c.get_label()) for c in ax.collections]
    cap = line(ax, "device capacity")
    assert list(cap.get_ydata()) == [s.capacity_bytes] * 2
    assert format_bytes(s.capacity_bytes) in cap.get_label()
    assert any(t.get_text().startswith("device capacity") for t in ax.texts)


def test_a_snapshot_s_memory_is_reserved_allocated_and_requested() -> None:
    """A caching allocator's space is drawn in PyTorch's figures, the cached memory between
    reserved and allocated shaded, and the rated metrics' legends use the glossary's symbols."""
    (s,) = analyze(open_input(SAMPLES / "pressure_gc_snapshot.pickle")).spaces
    pool = s.timeline.pool
    assert pool is not None and int(pool.reserved_bytes.max()) > int(pool.reserved_bytes.min())
    ax = only_axes(memory_timeline(s))
    reserved, allocated = line(ax, "reserved"), line(ax, "allocated")
    x = reserved.get_xdata()
    # Steps drawn from the points timeline_points keeps: every drawn value is the value then.
    at = np.searchsorted(seconds(s), np.asarray(x, dtype=np.float64), side="right") - 1
    np.testing.assert_array_equal(reserved.get_ydata(), pool.reserved_bytes[at])
    assert max(reserved.get_ydata()) == pool.reserved_bytes.max()
    assert max(allocated.get_ydata()) == pool.allocated_bytes.max()
    assert line(ax, "requested").get_ydata().max() == s.max_live_bytes
    assert line(ax, "largest usable request (L_eff)").get_ydata().max() <= s.capacity_bytes
    labels = [str(c.get_label()) for c in ax.collections]
    assert "cached (reserved − allocated)" in labels
    every = [str(h) for h in [*labels, *(ln.get_label() for ln in ax.get_lines())]]
    assert not any(label.startswith(("live bytes", "free bytes (F)")) for label in every)
    frag = [ln.get_label() for ln in only_axes(fragmentation_timeline(s)).get_lines()]
    assert "global frag = (free − L_eff) / C" in frag and "local frag = 1 − L_eff / free" in frag


def test_memory_axis_ticks_are_round_binary_units(make_trace: MakeTrace) -> None:
    s = small_space(make_trace)  # capacity 64 MiB
    ax = only_axes(memory_timeline(s))
    ticks = ax.yaxis.get_major_locator()()
    assert all(t % MiB == 0 for t in ticks)
    labels = ax.yaxis.get_major_formatter().format_ticks(list(ticks))
    assert all(label.endswith(" MiB") for label in labels)
    assert "0 MiB" in labels and "bytes" in ax.get_ylabel()
    assert ax.yaxis.get_major_formatter()(32 * MiB) == "32 MiB"


# ---------------------------------------------------------------- free blocks


def test_free_block_line_and_bands() -> None:
    s = inference()
    ax = only_axes(free_block_count(s))
    ln = line(ax, "free blocks")
    np.testing.assert_array_equal(ln.get_ydata(), s.timeline.free_blocks)
    assert ln.get_drawstyle() == "steps-post"
    assert y_extent(ax, patch(ax, "warn")) == (100.0, 500.0)
    assert y_extent(ax, patch(ax, "critical"))[0] == 500.0
    assert "count" in ax.get_ylabel()


# ---------------------------------------------------------------- histograms


@pytest.mark.parametrize("space", [inference, churn], ids=["inference_serving", "churn_anomalies"])
def test_histogram_bars_are_the_histograms(space) -> None:  # type: ignore[no-untyped-def]
    s = space()
    fig = size_histograms(s)
    counts = bar_container(fig, "allocations")
    assert [b.get_height() for b in counts] == [b.count for b in s.size_histogram]
    sizes = [c for a in fig.axes for c in a.containers if c.get_label() == "bytes (right)"]
    assert [b.get_height() for b in sizes[0]] == [b.bytes for b in s.size_histogram]
    assert [b.get_height() for b in bar_container(fig, "free blocks")] == [
        b.count for b in s.free_block_histogram
    ]
    assert [b.get_height() for b in sizes[1]] == [b.bytes for b in s.free_block_histogram]
    left = fig.axes[0]
    assert [t.get_text() for t in left.get_xticklabels()] == [
        size_class_label(b.lo_bytes.bit_length() - 1) for b in s.size_histogram
    ]
    assert "count" in left.get_ylabel() and "size class" in left.get_xlabel()


def test_histogram_without_free_memory_at_the_peak_says_so(make_trace: MakeTrace) -> None:
    s = small_space(make_trace)
    s = dataclasses.replace(s, free_block_histogram=[])
    fig = size_histograms(s)
    assert any("no free memory" in t.get_text() for a in fig.axes for t in a.texts)


# ---------------------------------------------------------------- address map


def cell(shape: tuple[int, int], x_full: float, y_full: float, x: float, y: float) -> tuple[int, int]:
    """The (row, column) of the image cell at data point (x s, y bytes)."""
    rows, cols = shape
    return int(y / y_full * rows), int(x / x_full * cols)


def test_address_map_paints_every_block_of_the_hand_made_trace(make_trace: MakeTrace) -> None:
    s = small_space(make_trace)
    fig = address_map(s)
    image = drawn_image(fig)
    assert image is not None
    ax = fig.axes[0]
    x_full, y_full = ax.get_xlim()[1], ax.get_ylim()[1]
    assert (x_full, y_full) == (5.0, 4 * MiB)  # the two pages the blocks touched
    rgba = np.asarray(image.get_array())
    shape = rgba.shape[:2]
    codes = block_image(s, x_full, y_full, shape)
    # (start s, end s, offset, bytes) of each block; those live at the end run to the last event.
    blocks = {"weights": (0.0, 5.0, 0, MiB), "act": (1.0, 3.0, MiB, 2 * MiB),
              "act2": (2.0, 5.0, 3 * MiB, MiB), "scratch": (4.0, 5.0, MiB, MiB // 2)}  # fmt: skip
    at = {
        name: codes[cell(shape, x_full, y_full, (a + b) / 2, off + size / 2)]
        for name, (a, b, off, size) in blocks.items()
    }
    assert 0 not in at.values()
    assert at["act"] == at["act2"] != at["weights"]  # both "act" blocks share a colour
    assert len({at["act"], at["weights"], at["scratch"]}) == 3
    assert codes[cell(shape, x_full, y_full, 0.5, 2 * MiB)] == 0  # nothing there before 1 s
    assert codes[cell(shape, x_full, y_full, 0.5, 3.5 * MiB)] == 0  # nothing there before 2 s
    # The figure shows those codes: painted cells opaque, empty cells transparent.
    np.testing.assert_array_equal(rgba[..., 3] > 0, codes > 0)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["act", "weights", "scratch", MIN_BLOCK_NOTE, FREE_NOTE]  # by bytes × lifetime
    assert "address order" in ax.get_ylabel() and "bytes" in ax.get_ylabel()


def test_address_map_draws_a_1_mib_block_of_an_80_gib_arena_at_least_2_px(
    make_trace: MakeTrace,
) -> None:
    # A 70 GiB block for most of the run, and a 1 MiB one just above it for a millisecond,
    # after it is gone: the small block's widening shows over white (over another block's own
    # cells it would not: those show that block).
    memory = [
        MemoryRow(S, 1, 0, BASE, 70 << 30, correlation_id=1),
        MemoryRow(4 * S, 1, 0, BASE, 0, op=FREE),
        MemoryRow(5 * S, 1, 0, BASE + (70 << 30), MiB, correlation_id=2),
        MemoryRow(5 * S + 1_000_000, 1, 0, BASE + (70 << 30), 0, op=FREE),
        MemoryRow(10 * S, 1, 0, BASE + (1 << 40), 0, op=FREE),
    ]
    api = [ApiRow(t - 100, t + 100, 1, 7, "cudaMalloc_v3020", c) for t, c in ((S, 1), (5 * S, 2))]
    nvtx = [NvtxRow(S - 500, S + 500, 1, 7, "weights"), NvtxRow(5 * S - 500, 5 * S + 500, 1, 7, "tiny")]
    s = analyze(read_export(make_trace(memory, api, nvtx))).spaces[0]
    fig = address_map(s)
    image = drawn_image(fig)
    assert image is not None
    rgba = np.asarray(image.get_array())
    x_full, y_full = fig.axes[0].get_xlim()[1], fig.axes[0].get_ylim()[1]
    weights = tuple(rgba[cell(rgba.shape[:2], x_full, y_full, 2.0, 30.0 * (1 << 30))])
    others = {tuple(c) for c in rgba.reshape(-1, 4)} - {weights, (0, 0, 0, 0)}
    assert len(others) == 1  # the tiny block is drawn, in its own colour
    tiny = np.all(rgba == np.array(others.pop(), dtype=rgba.dtype), axis=-1)
    rows, cols = np.nonzero(tiny)
    # At least MIN_BLOCK_PX screen pixels (OVERSAMPLE cells each) high and wide, and no more
    # than that plus a cell of rounding: its true size is a hundredth of a pixel.
    assert 4 <= rows.max() - rows.min() + 1 <= 5 and 4 <= cols.max() - cols.min() + 1 <= 5
    # The image is the plot's size at 2 cells a pixel: a 2-pixel block is 2 px on screen.
    fig.draw_without_rendering()
    box = fig.axes[0].get_window_extent()
    assert abs(rgba.shape[1] - 2 * box.width) <= 1 and abs(rgba.shape[0] - 2 * box.height) <= 1


@given(
    st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=40),
    st.integers(1, 3000),
    st.integers(1, 8),
)
@settings(max_examples=EXAMPLES, deadline=None)
def test_pixel_spans_are_at_least_min_cells_inside_the_grid_and_cover_the_block(
    spans: list[tuple[float, float]], cells: int, least: int
) -> None:
    least = min(least, cells)
    lo = np.array([min(a, b) for a, b in spans]) * 7.0
    hi = np.array([max(a, b) for a, b in spans]) * 7.0
    first, end = pixel_spans(lo, hi, 7.0, cells, least)
    assert np.all(first >= 0) and np.all(end <= cells)
    assert np.all(end - first >= least)
    true_first = np.floor(lo / 7.0 * cells).astype(np.int64)
    true_end = np.ceil(hi / 7.0 * cells).astype(np.int64)
    assert np.all((first <= np.minimum(true_first, cells - least)) & (end >= np.maximum(true_end, least)))


def test_painting_drops_only_duplicates_that_would_not_show() -> None:
    # Three blocks on the same cells: red, blue, red again: the last (red) shows.
    z = np.zeros(3, dtype=np.int64)
    two = np.full(3, 2, dtype=np.int64)
    image = paint_blocks(z, two, z, two, np.array([1, 2, 1], dtype=np.uint8), (4, 4))
    assert np.all(image[:2, :2] == 1) and np.all(image[2:, :] == 0) and np.all(image[:, 2:] == 0)
    image = paint_blocks(z, two, z, two, np.array([1, 1, 2], dtype=np.uint8), (4, 4))
    assert np.all(image[:2, :2] == 2)


def test_address_map_of_a_sample_paints_every_allocation() -> None:
    s = churn()
    fig = address_map(s)
    image = drawn_image(fig)
    assert image is not None
    assert len(allocation_events(s.timeline).nonzero()[0]) == s.counts.allocations
    assert MIN_BLOCK_NOTE in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def events_like(model: Timeline, is_alloc: np.ndarray) -> object:
    """``timeline.event`` in the representation the analysis uses now (codes or names)."""
    if isinstance(model.event, np.ndarray):
        return np.where(is_alloc, ALLOCATED, FREED).astype(model.event.dtype)
    return ["alloc" if a else "free" for a in is_alloc]


def big_space(n: int) -> SpaceAnalysis:
    """A million-event space: half allocations (most still live at the end), half frees."""
    s = inference()
    rng = np.random.default_rng(7)
    time_ns = np.sort(rng.integers(0, 60 * S, n)).astype(np.int64)
    is_alloc = rng.random(n) < 0.5
    removed = np.where(is_alloc & (rng.random(n) < 0.5), n - 1, -1).astype(np.int64)
    removed[is_alloc & (rng.random(n) < 0.3)] = n // 2
    removed[removed <= np.arange(n)] = -1
    return dataclasses.replace(
        s,
        timeline=Timeline(
            time_ns=time_ns,
            event=events_like(s.timeline, is_alloc),
            address=np.uint64(s.base_address) + rng.integers(0, 70 << 30, n).astype(np.uint64),
            bytes=rng.integers(512, 1 << 28, n).astype(np.int64),
            global_frag=rng.random(n) * 0.3,
            local_frag=rng.random(n),
            free_blocks=rng.integers(0, 800, n),
            largest_free_bytes=rng.integers(0, 1 << 30, n),
            free_bytes=rng.integers(1 << 30, 2 << 30, n),
            live_bytes=rng.integers(0, 70 << 30, n),
            removed_at=removed,
            site=rng.integers(0, len(s.timeline.site_names), n),
            site_names=s.timeline.site_names,
        ),
    )


def test_address_map_of_a_million_events_draws_them_all_in_a_bounded_figure() -> None:
    s = big_space(1_000_000)
    fig = address_map(s)
    image = drawn_image(fig)
    assert image is not None
    rgba = np.asarray(image.get_array())
    fig.draw_without_rendering()
    box = fig.axes[0].get_window_extent()
    assert rgba.shape[:2] == (round(2 * box.height), round(2 * box.width))  # the plot, not the input
    assert "largest" not in fig.get_suptitle()  # nothing left out
    assert (rgba[..., 3] > 0).mean() > 0.5  # half the events are blocks, most still live


# ---------------------------------------------------------------- hotspots


def summed_hole_bytes(s: SpaceAnalysis) -> dict[str, int]:
    out: dict[str, int] = {}
    for h in s.hotspots:
        out[h.site] = out.get(h.site, 0) + h.hole_bytes
    return out


@pytest.mark.parametrize("space", [inference, churn], ids=["inference_serving", "churn_anomalies"])
def test_hotspot_bars_are_hole_bytes_summed_by_site(space) -> None:  # type: ignore[no-untyped-def]
    s = space()
    ax = only_axes(hotspots_chart(s))
    bars = list(ax.containers[0])
    sites = [t.get_text() for t in ax.get_yticklabels()]
    expected = summed_hole_bytes(s)
    assert len(bars) == min(10, len(expected))
    by_y = sorted(zip([b.get_y() for b in bars], [b.get_width() for b in bars], strict=True), reverse=True)
    ticks = dict(zip(ax.get_yticks(), sites, strict=True))
    shown = [(ticks[round(y + b.get_height() / 2)], w) for (y, w), b in zip(by_y, bars, strict=True)]
    assert [w for _, w in shown] == sorted(expected.values(), reverse=True)[: len(bars)]
    for site, width in shown:
        assert not site.startswith("…") and expected[site] == width
    assert "bytes" in ax.get_xlabel()


def test_hotspots_of_the_hand_made_trace(make_trace: MakeTrace) -> None:
    s = small_space(make_trace)
    ax = only_axes(hotspots_chart(s))
    labels = {t.get_text(): y for t, y in zip(ax.get_yticklabels(), ax.get_yticks(), strict=True)}
    assert labels["act"] > labels["weights"]  # the 2 MiB hole ranks first, at the top
    assert sorted(b.get_width() for b in ax.containers[0]) == [MiB, 2 * MiB]
    assert any(t.get_text() == "2.00 MiB · 1 hole / 1 out-of-order free" for t in ax.texts)


def test_hotspots_without_out_of_order_frees_say_so(make_trace: MakeTrace) -> None:
    memory = [MemoryRow(S, 1, 0, BASE, MiB), MemoryRow(2 * S, 1, 0, BASE, 0, op=FREE)]
    s = analyze(read_export(make_trace(memory))).spaces[0]
    ax = only_axes(hotspots_chart(s))
    assert not ax.containers
    assert any("no out-of-order frees" in t.get_text() for t in ax.texts)


# ---------------------------------------------------------------- downsampled lines


def test_step_indices_keep_every_bin_extreme_of_a_long_timeline() -> None:
    s = big_space(200_000)
    tl = s.timeline
    idx = step_indices(tl.time_ns, tl.global_frag)
    assert len(idx) <= 4 * TIME_BINS
    assert idx[0] == 0 and idx[-1] == len(tl.time_ns) - 1
    assert tl.global_frag[idx].max() == tl.global_frag.max()
    assert tl.global_frag[idx].min() == tl.global_frag.min()
    assert np.argmax(tl.global_frag) in idx
    ax = only_axes(fragmentation_timeline(s))
    assert line(ax, "global frag").get_ydata().max() == tl.global_frag.max() * 100


def with_failures(space: SpaceAnalysis, times_ns: list[int], peak_index: int) -> SpaceAnalysis:
    empty = State(0, 0.0, 0.0, 0, 0, 0, 0)
    ooms = tuple(Failure(dataclasses.replace(empty, time_ns=t), None, UNKNOWN) for t in times_ns)
    return dataclasses.replace(space, ooms=ooms, peak_index=peak_index)


@given(
    n=st.integers(2, 400),
    seed=st.integers(0, 2**32 - 1),
    failures=st.integers(0, 6),
    full=st.integers(1, 60),
    bins=st.integers(1, 20),
)
@settings(max_examples=EXAMPLES, deadline=None)
def test_drawn_points_keep_first_last_peak_failures_and_each_bin_extreme(
    n: int, seed: int, failures: int, full: int, bins: int
) -> None:
    rng = np.random.default_rng(seed)
    time_ns = np.sort(rng.integers(0, 10 * S, n)).astype(np.int64)
    values = rng.integers(0, 5, n).astype(np.float64)  # few values: ties everywhere
    base = big_space(n)
    space = dataclasses.replace(base, timeline=dataclasses.replace(base.timeline, time_ns=time_ns))
    fail_at = rng.integers(-S, 11 * S, failures).tolist()
    space = with_failures(space, fail_at, int(rng.integers(0, n)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(timeline_points, "FULL_RESOLUTION_EVENTS", full)
        mp.setattr(timeline_points, "TIME_BINS", bins)
        idx = drawn_indices(space, values)
    kept = set(idx.tolist())
    assert {0, n - 1, space.peak_index} <= kept
    for t in fail_at:  # the state each failure happened in: the last point at or before it
        at = np.flatnonzero(time_ns <= t)
        assert len(at) == 0 or at[-1] in kept
    assert len(idx) <= max(n if n <= full else 4 * bins, 0) + 3 + failures
    if n > full:  # each bin's lowest and highest value are drawn
        rel = (time_ns - time_ns[0]).astype(np.float64)
        span = rel[-1] or 1.0
        b = np.minimum((rel / span * bins).astype(np.int64), bins - 1)
        for k in np.unique(b):
            inside = b == k
            drawn = values[[i for i in np.flatnonzero(inside) if i in kept]]
            assert drawn.min() == values[inside].min() and drawn.max() == values[inside].max()
    else:
        assert len(idx) == n


def failed_calls(path: Path) -> int:
    """The failed API calls an export records, counted in SQLite (the sample's failures are all
    allocation calls)."""
    con = sqlite3.connect(path)
    try:
        return int(con.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE returnValue != 0"
        ).fetchone()[0])  # fmt: skip
    finally:
        con.close()


def test_failures_are_drawn_and_their_points_kept() -> None:
    s = inference()
    n = failed_calls(SAMPLES / "inference_serving.sqlite")
    assert n > 20 and len(s.ooms) == n
    points = failure_points(s)
    assert len(points) > 0
    for name in ("fragmentation", "memory", "free_blocks"):
        ax = only_axes(figure_builders[name](s))
        lines = [c for c in ax.collections if str(c.get_label()).startswith("failed allocations")]
        assert len(lines) == 1 and lines[0].get_label() == f"failed allocations ({n})"
        drawn = np.array([float(seg[0, 0]) for seg in lines[0].get_segments()])
        t0 = int(s.timeline.time_ns[0])
        failed = np.array([(f.state.time_ns - t0) / 1e9 for f in s.ooms])
        # One line per time bin that has failures: each failure is within a bin of a line.
        assert len(drawn) <= len(failed) and set(drawn.tolist()) <= set(failed.tolist())
        bin_s = failed.max() / TIME_BINS
        assert all(np.abs(drawn - x).min() <= bin_s for x in failed)
        assert len(drawn) > 20  # they are seconds apart, far more than a bin


# ---------------------------------------------------------------- PNG files


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_write_pngs_writes_six_pngs_per_space(tmp_path: Path) -> None:
    analysis = sample("multi_gpu")
    assert len(analysis.spaces) == 3
    folder = tmp_path / "new" / "figs"
    paths = write_pngs(analysis, folder)
    expected = [
        folder / f"pid{s.pid}_dev{s.device}_{name}.png" for s in analysis.spaces for name in figure_builders
    ]
    assert paths == expected and len(paths) == 18
    assert sorted(folder.iterdir()) == sorted(expected)
    for path in paths:
        assert png_size(path) == (1000, 450)


def test_figures_never_import_pyplot(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from nsysfrag.analysis import analyze\n"
        "from nsysfrag.inputs.nsys import read_export\n"
        "from nsysfrag.reporters.png import write_pngs\n"
        f"write_pngs(analyze(read_export({str(SAMPLES / 'caching_allocator.sqlite')!r})), Path({str(tmp_path)!r}))\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    assert len(list(tmp_path.glob("*.png"))) == 6

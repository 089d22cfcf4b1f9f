"""The address map: every live block over time, time on x and offset from the arena base on y,
coloured by allocation site; gaps stay white.

The blocks are painted into an image the size of the plot, at ``OVERSAMPLE`` cells per pixel
for high-density screens, rather than drawn as one vector rectangle each: the figure then has
the same size and drawing time for ten blocks or ten million, and every block is drawn. A block
thinner than ``MIN_BLOCK_PX`` pixels in time or in address (a 1 MiB block in an 80 GiB arena is
a hundredth of a pixel) is widened to ``MIN_BLOCK_PX``, and the legend says so. Blocks are
painted largest first (bytes × lifetime), so where widened neighbours overlap the small ones
show on top of the large; neighbours that fall on the same pixels merge.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from matplotlib.colors import to_rgba_array
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.patches import Patch

from nsysfrag.analysis import SpaceAnalysis, Timeline
from nsysfrag.analysis.metrics import F64, format_bytes
from nsysfrag.events import I64
from nsysfrag.models.series import ALLOCATED
from nsysfrag.reporters.address_raster import U8, paint_blocks, pixel_spans
from nsysfrag.reporters.figure_axes import (
    CAPACITY_COLOR,
    OTHER_SITES_COLOR,
    SITE_COLORS,
    TOP_SITES,
    bytes_axis,
    drawing,
    figure_title,
    legend_right,
    new_figure,
    say_empty,
    short_site,
    time_axis,
)
from nsysfrag.reporters.time_base import since_start_array, since_start_s

MIN_BLOCK_PX = 2
OVERSAMPLE = 2  # image cells per screen pixel of the plot
MIN_BLOCK_NOTE = f"blocks under {MIN_BLOCK_PX} px are drawn {MIN_BLOCK_PX} px wide and high"


def allocation_events(timeline: Timeline) -> npt.NDArray[np.bool_]:
    """Which events placed a block: ``timeline.event`` holds replay outcome codes or, in older
    analyses, their names."""
    event = timeline.event
    if isinstance(event, np.ndarray) and event.dtype.kind in "iu":
        return np.asarray(event == ALLOCATED)
    return np.fromiter((e == "alloc" for e in event), dtype=bool, count=len(timeline.time_ns))


def site_colours(
    space: SpaceAnalysis, allocs: I64, score: F64
) -> tuple[U8, list[str], list[tuple[str, str]]]:
    """A colour code per block (1-based into the returned colours; 0 is no block), the colours,
    and the legend: the top sites by summed bytes × lifetime get their own colour."""
    tl = space.timeline
    codes = tl.site[allocs]
    weight = np.bincount(codes, weights=score, minlength=len(tl.site_names))
    present = np.flatnonzero(np.bincount(codes, minlength=len(tl.site_names)))
    ranked = sorted(present.tolist(), key=lambda c: (-weight[c], tl.site_names[c]))
    colours = [OTHER_SITES_COLOR]
    by_site = np.ones(len(tl.site_names), dtype=np.uint8)  # 1: other sites
    legend = []
    for code, colour in zip(ranked[:TOP_SITES], SITE_COLORS, strict=False):
        colours.append(colour)
        by_site[code] = len(colours)
        legend.append((tl.site_names[code], colour))
    if len(ranked) > TOP_SITES:
        legend.append((f"{len(ranked) - TOP_SITES} other site(s)", OTHER_SITES_COLOR))
    return by_site[codes], colours, legend


def block_image(space: SpaceAnalysis, x_full: float, y_full: float, shape: tuple[int, int]) -> U8:
    """The colour code of each cell of a ``shape`` (rows, columns) grid over [0, ``x_full``)
    seconds × [0, ``y_full``) bytes from the arena base (row 0 at the base), every block painted
    at least ``MIN_BLOCK_PX × OVERSAMPLE`` cells wide and high."""
    blocks = _Blocks.of(space)
    codes, _, _ = site_colours(space, blocks.allocs, blocks.score)
    return blocks.painted(codes, x_full, y_full, shape)


@dataclass(frozen=True, slots=True)
class _Blocks:
    """The space's allocations: each block's start and end (s), offset and bytes."""

    allocs: I64
    start: F64
    end: F64
    offset: F64
    nbytes: F64

    @classmethod
    def of(cls, space: SpaceAnalysis) -> _Blocks:
        tl = space.timeline
        allocs = np.flatnonzero(allocation_events(tl))
        t = tl.time_ns
        ends = tl.removed_at[allocs]
        end_ns = np.where(ends >= 0, t[np.maximum(ends, 0)], t[-1])
        return cls(
            allocs=allocs,
            # From the left edge of the time axis (the space's first event), in its unit.
            start=since_start_array(space, t[allocs]) - since_start_s(space, int(t[0])),
            end=since_start_array(space, end_ns) - since_start_s(space, int(t[0])),
            offset=(tl.address[allocs] - np.uint64(space.base_address)).astype(np.float64),
            nbytes=tl.bytes[allocs].astype(np.float64),
        )

    @property
    def score(self) -> F64:
        """Bytes × lifetime: what makes a block dominate the picture."""
        score: F64 = self.nbytes * (self.end - self.start)
        return score

    def painted(self, codes: U8, x_full: float, y_full: float, shape: tuple[int, int]) -> U8:
        rows, cols = shape
        least = MIN_BLOCK_PX * OVERSAMPLE
        x0, x1 = pixel_spans(self.start, self.end, x_full, cols, min(least, cols))
        y0, y1 = pixel_spans(self.offset, self.offset + self.nbytes, y_full, rows, min(least, rows))
        # Largest first, so where widened blocks overlap the small ones stay visible on top.
        order = np.lexsort((np.arange(len(codes)), -self.nbytes, -self.score))
        return paint_blocks(x0[order], x1[order], y0[order], y1[order], codes[order], shape)


def _plot_cells(fig: Figure) -> tuple[int, int]:
    """The plot's size in image cells (rows, columns), measured once the layout is done."""
    with drawing(fig):
        fig.draw_without_rendering()
    box = fig.axes[0].get_window_extent()
    return max(1, round(box.height * OVERSAMPLE)), max(1, round(box.width * OVERSAMPLE))


def address_map(space: SpaceAnalysis) -> Figure:
    """Live blocks as rectangles: time on x, offset from the arena base on y; gaps stay white.
    Every block is drawn, at least ``MIN_BLOCK_PX`` pixels wide and high."""
    fig, (ax,) = new_figure()
    tl = space.timeline
    allocs = np.flatnonzero(allocation_events(tl))
    arena = space.arena_end - space.base_address
    highest = 0
    if len(allocs):
        ends = tl.address[allocs] + tl.bytes[allocs].astype(np.uint64)
        highest = int((ends - np.uint64(space.base_address)).max())
    if space.span_mode:
        ax.axhline(space.capacity_bytes, color=CAPACITY_COLOR, linestyle="--", linewidth=0.8)
    time_axis(ax, space)
    top = min(arena, highest * 1.12) if highest > 0 else arena
    ax.set_ylim(0, top)
    if top < arena:
        ax.text(
            0.99, 0.98,
            f"never used above {format_bytes(highest)}; the arena is {format_bytes(arena)}",
            transform=ax.transAxes, ha="right", va="top", fontsize=8, color="#555555",
        )  # fmt: skip
    bytes_axis(ax.yaxis)
    ax.set_ylabel(f"offset from base 0x{space.base_address:x} (bytes)")
    figure_title(fig, "Address map: live blocks over time", space)
    if len(allocs) == 0:
        say_empty(ax, "no live blocks: this space has no allocations")
        return fig
    blocks = _Blocks.of(space)
    codes, colours, legend = site_colours(space, blocks.allocs, blocks.score)
    handles = [Patch(facecolor=c, label=short_site(s)) for s, c in legend]
    handles.append(Patch(facecolor="none", edgecolor="none", label=MIN_BLOCK_NOTE))
    legend_right(ax, handles=handles, title="allocation site", title_fontsize=8)
    x_left, x_right = ax.get_xlim()  # the report's time base: the left edge need not be 0
    # The legend is placed before the plot is measured: it takes room from the plot.
    image = blocks.painted(codes, x_right - x_left, top, _plot_cells(fig))
    rgba = np.zeros((len(colours) + 1, 4), dtype=np.uint8)
    rgba[1:] = np.round(to_rgba_array(colours) * 255).astype(np.uint8)
    # interpolation "none": a vector file keeps the image's own cells, unresampled.
    ax.imshow(rgba[image], origin="lower", extent=(x_left, x_right, 0.0, top), aspect="auto",
              interpolation="none", zorder=1)  # fmt: skip
    return fig


def drawn_image(fig: Figure) -> AxesImage | None:
    """The address map's painted blocks, if it has any."""
    images = fig.axes[0].get_images()
    return images[0] if images else None

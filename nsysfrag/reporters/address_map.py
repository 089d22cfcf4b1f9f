"""The address map: every live block over time, time on x and its place in the pages the blocks
touched on y, coloured by allocation site; free memory inside those pages stays white.

The driver maps pages wherever it likes, so the virtual gaps between the regions of pages a
trace's blocks touched (terabytes apart on a real device) hold no free memory the device could
give: the y axis lays the touched regions end to end in address order and leaves the gaps out
(a thin line marks each cut, when there are few). White beside a block in a region is memory
stranded in a partly used page (or, in a snapshot, free inside a segment).

The blocks are painted into an image the size of the plot, at ``OVERSAMPLE`` cells per pixel
for high-density screens, rather than drawn as one vector rectangle each: the figure then has
the same size and drawing time for ten blocks or ten million, and every block is drawn. A block
thinner than ``MIN_BLOCK_PX`` pixels in time or in address (a 1 MiB block in an 80 GiB arena is
a hundredth of a pixel) is widened to ``MIN_BLOCK_PX``, and the legend says so; the widening
fills only cells no block's own extent covers, so hundreds of one-page blocks between large
ones never paint the large ones out. Blocks are painted largest first (bytes × lifetime), so
the small ones show on top of the large; neighbours that fall on the same pixels merge.
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
from nsysfrag.analysis.metrics import F64
from nsysfrag.analysis.time_base import since_start_array, since_start_s
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

MIN_BLOCK_PX = 2
OVERSAMPLE = 2  # image cells per screen pixel of the plot
MIN_BLOCK_NOTE = f"blocks under {MIN_BLOCK_PX} px are drawn {MIN_BLOCK_PX} px wide and high"
REGION_PAGE_BYTES = 2 << 20  # what the regions are rounded to where the model has no page size
CUTS_DRAWN = 40  # more cuts than this would hide the blocks: then none is drawn
FREE_NOTE = "white: free inside those pages"


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
    seconds × [0, ``y_full``) bytes of the map (row 0 at its bottom), every block painted at
    least ``MIN_BLOCK_PX × OVERSAMPLE`` cells wide and high."""
    blocks = _Blocks.of(space)
    codes, _, _ = site_colours(space, blocks.allocs, blocks.score)
    return blocks.painted(codes, x_full, y_full, shape)


@dataclass(frozen=True, slots=True)
class Regions:
    """The regions of pages a space's blocks touched, in address order: each one's first
    address, and where it starts on the map (the regions before it laid end to end)."""

    start: npt.NDArray[np.uint64]
    placed: I64
    height: int  # every region's bytes

    @classmethod
    def of(cls, address: npt.NDArray[np.uint64], nbytes: I64, page: int) -> Regions:
        if len(address) == 0:
            return cls(np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64), 0)
        p = np.uint64(page)
        lo = address - address % p
        # A block's last page; an end past 2**64 (a damaged address) stays on the top page.
        hi = np.maximum(lo + p, (address + np.maximum(nbytes, 1).astype(np.uint64) + p - np.uint64(1)) // p * p)
        order = np.argsort(lo, kind="stable")
        lo, hi = lo[order], np.maximum.accumulate(hi[order])
        new = np.ones(len(lo), dtype=np.bool_)
        new[1:] = lo[1:] > hi[:-1]
        starts = lo[new]
        ends = np.append(hi[np.flatnonzero(new)[1:] - 1], hi[-1])
        sizes = (ends - starts).astype(np.int64)
        placed = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        return cls(starts, placed, int(sizes.sum()))

    def offsets(self, address: npt.NDArray[np.uint64]) -> F64:
        """Where each address lies on the map."""
        i = np.searchsorted(self.start, address, side="right") - 1
        within = (address - self.start[i]).astype(np.float64)
        return self.placed[i].astype(np.float64) + within


@dataclass(frozen=True, slots=True)
class _Blocks:
    """The space's allocations: each block's start and end (s), place on the map and bytes."""

    allocs: I64
    start: F64
    end: F64
    offset: F64
    nbytes: F64
    regions: Regions

    @classmethod
    def of(cls, space: SpaceAnalysis) -> _Blocks:
        tl = space.timeline
        allocs = np.flatnonzero(allocation_events(tl))
        t = tl.time_ns
        ends = tl.removed_at[allocs]
        end_ns = np.where(ends >= 0, t[np.maximum(ends, 0)], t[-1])
        address = tl.address[allocs].astype(np.uint64)
        regions = Regions.of(address, tl.bytes[allocs], space.page_bytes or REGION_PAGE_BYTES)
        return cls(
            allocs=allocs,
            # From the left edge of the time axis (the space's first event), in its unit.
            start=since_start_array(space, t[allocs]) - since_start_s(space, int(t[0])),
            end=since_start_array(space, end_ns) - since_start_s(space, int(t[0])),
            offset=regions.offsets(address),
            nbytes=tl.bytes[allocs].astype(np.float64),
            regions=regions,
        )

    @property
    def score(self) -> F64:
        """Bytes × lifetime: what makes a block dominate the picture."""
        score: F64 = self.nbytes * (self.end - self.start)
        return score

    def painted(self, codes: U8, x_full: float, y_full: float, shape: tuple[int, int]) -> U8:
        """Every block widened to ``MIN_BLOCK_PX``, then every block at its own size (a cell
        at least) over them: a widened block shows beside its neighbours, but never over a
        block's own cells (hundreds of one-page blocks between large ones would otherwise
        paint the large ones out)."""
        rows, cols = shape
        least = MIN_BLOCK_PX * OVERSAMPLE
        # Largest first, so where widened blocks overlap the small ones stay visible on top.
        order = np.lexsort((np.arange(len(codes)), -self.nbytes, -self.score))
        spans = []
        for wide in (least, 1):
            x0, x1 = pixel_spans(self.start, self.end, x_full, cols, min(wide, cols))
            y0, y1 = pixel_spans(self.offset, self.offset + self.nbytes, y_full, rows, min(wide, rows))
            spans.append((x0[order], x1[order], y0[order], y1[order]))
        x0, x1, y0, y1 = (np.concatenate(parts) for parts in zip(*spans, strict=True))
        return paint_blocks(x0, x1, y0, y1, np.concatenate([codes[order]] * 2), shape)


def _plot_cells(fig: Figure) -> tuple[int, int]:
    """The plot's size in image cells (rows, columns), measured once the layout is done."""
    with drawing(fig):
        fig.draw_without_rendering()
    box = fig.axes[0].get_window_extent()
    return max(1, round(box.height * OVERSAMPLE)), max(1, round(box.width * OVERSAMPLE))


def address_map(space: SpaceAnalysis) -> Figure:
    """Live blocks as rectangles: time on x, their place in the pages the blocks touched on y
    (virtual gaps left out); free memory stays white. Every block is drawn, at least
    ``MIN_BLOCK_PX`` pixels wide and high."""
    fig, (ax,) = new_figure()
    time_axis(ax, space)
    figure_title(fig, "Address map: live blocks over time", space)
    blocks = _Blocks.of(space)
    if len(blocks.allocs) == 0:
        ax.set_ylim(0, 1)
        say_empty(ax, "no live blocks: this space has no allocations")
        return fig
    regions = blocks.regions
    top = float(regions.height)
    ax.set_ylim(0, top)
    bytes_axis(ax.yaxis)
    cuts = len(regions.start) - 1
    gaps = f"; {cuts} virtual gap{'s' if cuts > 1 else ''} left out" if cuts else ""
    ax.set_ylabel(f"pages the blocks touched, in address order (bytes{gaps})")
    if 0 < cuts <= CUTS_DRAWN:
        for y in regions.placed[1:].tolist():
            ax.axhline(y, color=CAPACITY_COLOR, linestyle=":", linewidth=0.6, zorder=2)
    codes, colours, legend = site_colours(space, blocks.allocs, blocks.score)
    handles = [Patch(facecolor=c, label=short_site(s)) for s, c in legend]
    handles.append(Patch(facecolor="none", edgecolor="none", label=MIN_BLOCK_NOTE))
    handles.append(Patch(facecolor="none", edgecolor="none", label=FREE_NOTE))
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

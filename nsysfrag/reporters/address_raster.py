"""Blocks painted into a pixel grid: the address map's drawing, the same size for ten blocks or
ten million.

Each block is a rectangle in data units (time, offset). :func:`pixel_spans` turns one side of
every rectangle into whole cells of the grid, at least ``min_cells`` wide, so a block far thinner
than a pixel still shows; :func:`paint_blocks` paints them in the order given, the last painted
showing where widened blocks overlap. Blocks that land on the same cells in the same colour are
painted once: the picture is the same, and the work is bounded by what can be seen.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from nsysfrag import interpreted, jit
from nsysfrag.analysis.metrics import F64
from nsysfrag.events import I64


U8 = npt.NDArray[np.uint8]
# Cells per side are packed into 13 bits and colours into 8 when duplicates are found.
MAX_CELLS = 1 << 13
_CELL_BITS, _COLOUR_BITS = 13, 8


def pixel_spans(lo: F64, hi: F64, full: float, cells: int, min_cells: int) -> tuple[I64, I64]:
    """``[lo, hi)`` of each block, in data units of an axis running from 0 to ``full``, as the
    cells ``[first, end)`` of a grid of ``cells`` that it touches, widened evenly on both sides
    (and moved back inside the grid) to at least ``min_cells``."""
    scale = cells / full if full > 0 else 0.0
    first = np.floor(lo * scale).astype(np.int64)
    end = np.ceil(hi * scale).astype(np.int64)
    short = np.maximum(min_cells - (end - first), 0)
    first -= short // 2
    end += short - short // 2
    past_start = np.maximum(-first, 0)
    first += past_start
    end += past_start
    past_end = np.maximum(end - cells, 0)
    first = np.maximum(first - past_end, 0)
    end -= past_end
    return first, end


@jit.njit(cache=True, nogil=True)
def _paint(x0, x1, y0, y1, colour, image):  # type: ignore[no-untyped-def]
    for k in range(len(colour)):
        c = colour[k]
        for row in range(y0[k], y1[k]):
            for col in range(x0[k], x1[k]):
                image[row, col] = c


def paint_blocks(x0: I64, x1: I64, y0: I64, y1: I64, colour: U8, shape: tuple[int, int]) -> U8:
    """A ``shape`` (rows, columns) grid of colour codes (0: no block) with each block's cells
    ``[x0, x1) × [y0, y1)`` painted in its ``colour``, in the order given (the last one shows
    where they overlap)."""
    rows, cols = shape
    if rows >= MAX_CELLS or cols >= MAX_CELLS:
        raise ValueError(f"a grid of {rows} × {cols} cells is larger than {MAX_CELLS} a side")
    image = np.zeros(shape, dtype=np.uint8)
    if len(colour) == 0:
        return image
    keep = _last_of_each_duplicate(x0, x1, y0, y1, colour)
    paint = interpreted.chosen(_paint, len(colour))
    paint(x0[keep], x1[keep], y0[keep], y1[keep], colour[keep], image)
    return image


def _last_of_each_duplicate(x0: I64, x1: I64, y0: I64, y1: I64, colour: U8) -> I64:
    """The indices, in order, of the blocks to paint: of blocks with the same cells and colour
    only the last, which is the one whose paint would show (so dropping the others changes
    nothing)."""
    key = x0
    for part, bits in ((x1, _CELL_BITS), (y0, _CELL_BITS), (y1, _CELL_BITS), (colour, _COLOUR_BITS)):
        key = (key << bits) | part.astype(np.int64)
    _, first_from_end = np.unique(key[::-1], return_index=True)
    return np.sort(len(key) - 1 - first_from_end)

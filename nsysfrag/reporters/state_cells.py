"""The state table the terminal and the HTML report both show: the peak, final and maximum of a
space, each cell its text and, for a rated metric, its health level.

A space whose states carry reserved memory (the caching allocator's segments of the
pytorch-segments model, the driver's pages of the observed one) is told in those words, one row
per figure (reserved, allocated, stranded, releasable, device free, largest usable) and one
column per moment: at peak memory, at worst fragmentation, final, and the maxima. Any other
space keeps one row per moment with free, largest free and live. Which one follows from the
data, not the input.
"""

from __future__ import annotations

from dataclasses import dataclass

from nsysfrag.analysis import SpaceAnalysis, State
from nsysfrag.analysis.metrics import (
    MATERIAL_SHARE,
    Health,
    basis_words,
    format_bytes,
    free_blocks_health,
    global_frag_health,
    local_frag_health,
)
from nsysfrag.analysis.time_base import moment

# The columns after the row's label and its time (a space without allocator figures).
HEADINGS = ("global frag", "local frag", "free blocks", "largest free", "free", "live")
# The columns of a space with reserved memory (a caching allocator's segments, the driver's
# pages): one per moment, each named for what it is, and the maxima.
MOMENTS = ("at peak memory", "at worst fragmentation", "final", "max")
# A table with a device free row counts device free as one more free block (free_blocks, N),
# though "largest free block" (L) is a block inside the reserved memory: the row says so, or
# "free blocks 1" beside "largest free block 0 B" reads as a contradiction.
FREE_BLOCKS_ROW = "free blocks (+ device free)"
RATED_ROWS = ("global frag", "local frag", FREE_BLOCKS_ROW)


@dataclass(frozen=True, slots=True)
class Cell:
    text: str
    level: Health | None = None  # rated metrics only


@dataclass(frozen=True, slots=True)
class StateTable:
    """Column headings after the row labels, and (label, cells) rows."""

    headings: tuple[str, ...]
    rows: list[tuple[str, list[Cell]]]


def percent(value: float) -> str:
    """The reports' ratio format: ``0.4567`` -> ``45.7%``."""
    return f"{value:.1%}"


def health_reason(space: SpaceAnalysis) -> str:
    """What set the space's health level: the metric, its value and when."""
    b = space.health_basis
    if b is None:
        return "every rated metric stayed in range"
    return f"{basis_words(b.metric, b.value)} at {moment(space, b.time_ns)}"


def _rated(
    global_frag: float, local_frag: float, free_blocks: int, material: bool = True
) -> list[Cell]:
    """The three rated cells; local frag and free blocks at a moment the health does not count
    them (under MATERIAL_SHARE of the device free) carry no level: a red cell there would
    contradict the rating beside it."""
    return [
        Cell(percent(global_frag), global_frag_health(global_frag)),
        Cell(percent(local_frag), local_frag_health(local_frag) if material else None),
        Cell(str(free_blocks), free_blocks_health(free_blocks) if material else None),
    ]


def _of_state(space: SpaceAnalysis, s: State) -> list[Cell]:
    counted = s.free_bytes >= MATERIAL_SHARE * space.capacity_bytes
    return _rated(s.global_frag, s.local_frag, s.free_blocks, counted)


def _of_maxima(space: SpaceAnalysis) -> list[Cell]:
    """The maxima's cells: a maximum the health does not count (``space.unrated``) is shown
    without a level."""
    unrated = {u.metric for u in space.unrated}
    cells = _rated(space.max_global_frag, space.max_local_frag, space.max_free_blocks)
    for i, name in ((1, "local_frag"), (2, "free_blocks")):
        if name in unrated:
            cells[i] = Cell(cells[i].text)
    return cells


def state_table(space: SpaceAnalysis) -> StateTable:
    """The peak, final and max of ``space``, in its model's words."""
    if space.peak.pool is not None and space.final.pool is not None:
        return _allocator_table(space)
    return StateTable(("at", *HEADINGS), state_rows(space))


def _state(space: SpaceAnalysis, s: State) -> list[Cell]:
    return [
        Cell(moment(space, s.time_ns)),
        *_of_state(space, s),
        Cell(format_bytes(s.largest_free_bytes)),
        Cell(format_bytes(s.free_bytes)),
        Cell(format_bytes(s.live_bytes)),
    ]


def state_rows(space: SpaceAnalysis) -> list[tuple[str, list[Cell]]]:
    """(label, cells) of the peak, final and max rows (a space without allocator figures)."""
    maximum = [
        Cell(""),
        *_of_maxima(space),
        Cell(""),
        Cell(""),
        Cell(format_bytes(space.max_live_bytes)),
    ]
    return [
        ("peak", _state(space, space.peak)),
        ("final", _state(space, space.final)),
        ("max", maximum),
    ]


def _allocator_table(space: SpaceAnalysis) -> StateTable:
    """One column per moment — peak memory (where the space has one), worst fragmentation,
    final — and the maxima; one row per figure."""
    moments = [s for s in (space.memory_peak, space.peak, space.final) if s is not None]
    headings = MOMENTS if space.memory_peak is not None else MOMENTS[1:]
    pools = [s.pool for s in moments]
    assert all(p is not None for p in pools)
    rated = list(
        zip(
            *(_of_state(space, s) for s in moments),
            _of_maxima(space),
            strict=True,
        )
    )

    def sizes(values: list[int], maximum: str = "") -> list[Cell]:
        return [*(Cell(format_bytes(v)) for v in values), Cell(maximum)]

    def figure(name: str) -> list[int]:
        return [getattr(p, name) for p in pools]

    rows = [
        ("at", [*(Cell(moment(space, s.time_ns)) for s in moments), Cell("")]),
        *((name, list(cells)) for name, cells in zip(RATED_ROWS, rated, strict=True)),
        ("reserved", sizes(figure("reserved_bytes"))),
        ("allocated", sizes(figure("allocated_bytes"))),
        # PyTorch's active bytes, shown where freed blocks still wait on other streams
        *(
            [("active", sizes(figure("active_bytes")))]
            if figure("active_bytes") != figure("allocated_bytes")
            else []
        ),
        ("stranded", sizes(figure("stranded_bytes"))),
        ("releasable", sizes(figure("releasable_bytes"))),
        ("device free", sizes(figure("device_free_bytes"))),
        ("largest free block", sizes(figure("largest_block_bytes"))),
        ("largest usable", sizes([s.largest_free_bytes for s in moments])),
        (
            "requested",
            sizes([s.live_bytes for s in moments], format_bytes(space.max_live_bytes)),
        ),
    ]
    return StateTable(headings, rows)

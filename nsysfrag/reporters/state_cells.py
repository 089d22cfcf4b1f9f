"""The state table the terminal and the HTML report both show: the peak, final and maximum of a
space, each cell its text and, for a rated metric, its health level.

A space whose states carry a caching allocator's figures (the pytorch-segments model) is told
in that allocator's words, one row per figure (reserved, allocated, stranded, releasable,
device free, largest usable) and one column per moment; any other space keeps one row per
moment with free, largest free and live. Which one follows from the data, not the input.
"""

from __future__ import annotations

from dataclasses import dataclass

from nsysfrag.analysis import SpaceAnalysis, State
from nsysfrag.analysis.metrics import (
    Health,
    basis_words,
    format_bytes,
    free_blocks_health,
    global_frag_health,
    local_frag_health,
)
from nsysfrag.reporters.time_base import moment

# The columns after the row's label and its time (a space without allocator figures).
HEADINGS = ("global frag", "local frag", "free blocks", "largest free", "free", "live")
# The columns of a space with a caching allocator's figures: one per moment.
MOMENTS = ("peak", "final", "max")


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


def _rated(global_frag: float, local_frag: float, free_blocks: int) -> list[Cell]:
    return [
        Cell(percent(global_frag), global_frag_health(global_frag)),
        Cell(percent(local_frag), local_frag_health(local_frag)),
        Cell(str(free_blocks), free_blocks_health(free_blocks)),
    ]


def state_table(space: SpaceAnalysis) -> StateTable:
    """The peak, final and max of ``space``, in its model's words."""
    if space.peak.pool is not None and space.final.pool is not None:
        return _allocator_table(space)
    return StateTable(("at", *HEADINGS), state_rows(space))


def _state(space: SpaceAnalysis, s: State) -> list[Cell]:
    return [
        Cell(moment(space, s.time_ns)),
        *_rated(s.global_frag, s.local_frag, s.free_blocks),
        Cell(format_bytes(s.largest_free_bytes)),
        Cell(format_bytes(s.free_bytes)),
        Cell(format_bytes(s.live_bytes)),
    ]


def state_rows(space: SpaceAnalysis) -> list[tuple[str, list[Cell]]]:
    """(label, cells) of the peak, final and max rows (a space without allocator figures)."""
    maximum = [
        Cell(""),
        *_rated(space.max_global_frag, space.max_local_frag, space.max_free_blocks),
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
    peak, final = space.peak, space.final
    assert peak.pool is not None and final.pool is not None
    p, f = peak.pool, final.pool
    rated = list(
        zip(
            _rated(peak.global_frag, peak.local_frag, peak.free_blocks),
            _rated(final.global_frag, final.local_frag, final.free_blocks),
            _rated(space.max_global_frag, space.max_local_frag, space.max_free_blocks),
            strict=True,
        )
    )

    def sizes(at_peak: int, at_final: int, maximum: str = "") -> list[Cell]:
        return [Cell(format_bytes(at_peak)), Cell(format_bytes(at_final)), Cell(maximum)]

    rows = [
        ("at", [Cell(moment(space, peak.time_ns)), Cell(moment(space, final.time_ns)), Cell("")]),
        *((name, list(cells)) for name, cells in zip(HEADINGS[:3], rated, strict=True)),
        ("reserved", sizes(p.reserved_bytes, f.reserved_bytes)),
        ("allocated", sizes(p.allocated_bytes, f.allocated_bytes)),
        # PyTorch's active bytes, shown where freed blocks still wait on other streams
        *(
            [("active", sizes(p.active_bytes, f.active_bytes))]
            if (p.active_bytes, f.active_bytes) != (p.allocated_bytes, f.allocated_bytes)
            else []
        ),
        ("stranded", sizes(p.stranded_bytes, f.stranded_bytes)),
        ("releasable", sizes(p.releasable_bytes, f.releasable_bytes)),
        ("device free", sizes(p.device_free_bytes, f.device_free_bytes)),
        ("largest free block", sizes(p.largest_block_bytes, f.largest_block_bytes)),
        ("largest usable", sizes(peak.largest_free_bytes, final.largest_free_bytes)),
        (
            "requested",
            sizes(peak.live_bytes, final.live_bytes, format_bytes(space.max_live_bytes)),
        ),
    ]
    return StateTable(MOMENTS, rows)

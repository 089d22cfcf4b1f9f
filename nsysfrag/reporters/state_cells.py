"""The state table the terminal and the HTML report both show: the peak, final and maximum of a
space, each cell its text and, for a rated metric, its health level."""

from __future__ import annotations

from dataclasses import dataclass

from nsysfrag.analysis import SpaceAnalysis, State
from nsysfrag.analysis.metrics import (
    Health,
    format_bytes,
    free_blocks_health,
    global_frag_health,
    local_frag_health,
)

# The columns after the row's label and its time.
HEADINGS = ("global frag", "local frag", "free blocks", "largest free", "free", "live")


@dataclass(frozen=True, slots=True)
class Cell:
    text: str
    level: Health | None = None  # rated metrics only


def percent(value: float) -> str:
    """The reports' ratio format: ``0.4567`` -> ``45.7%``."""
    return f"{value:.1%}"


def seconds(ns: int) -> str:
    return f"{ns / 1e9:.3f} s"


def health_reason(space: SpaceAnalysis) -> str:
    """What set the space's health level: the metric, its value and when."""
    b = space.health_basis
    if b is None:
        return "every rated metric stayed in range"
    value = str(b.value) if b.metric == "free_blocks" else percent(b.value)
    return f"{b.metric.replace('_', ' ')} {value} at {seconds(b.time_ns)}"


def _rated(global_frag: float, local_frag: float, free_blocks: int) -> list[Cell]:
    return [
        Cell(percent(global_frag), global_frag_health(global_frag)),
        Cell(percent(local_frag), local_frag_health(local_frag)),
        Cell(str(free_blocks), free_blocks_health(free_blocks)),
    ]


def _state(s: State) -> list[Cell]:
    return [
        Cell(seconds(s.time_ns)),
        *_rated(s.global_frag, s.local_frag, s.free_blocks),
        Cell(format_bytes(s.largest_free_bytes)),
        Cell(format_bytes(s.free_bytes)),
        Cell(format_bytes(s.live_bytes)),
    ]


def state_rows(space: SpaceAnalysis) -> list[tuple[str, list[Cell]]]:
    """(label, cells) of the peak, final and max rows."""
    maximum = [
        Cell(""),
        *_rated(space.max_global_frag, space.max_local_frag, space.max_free_blocks),
        Cell(""),
        Cell(""),
        Cell(format_bytes(space.max_live_bytes)),
    ]
    return [("peak", _state(space.peak)), ("final", _state(space.final)), ("max", maximum)]

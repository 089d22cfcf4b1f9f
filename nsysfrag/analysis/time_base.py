"""One time base for every report: seconds since the input's first event.

Every table, sentence and figure of a report places a moment with these functions, so a peak
at "2.028 s" in a table is at 2.028 on a figure's x axis too. The origin is the input's first
event over all its spaces (``SourceInfo.first_event_ns``), not a space's own first event, so
spaces of one input share it. A snapshot recorded without timestamps numbers its entries
instead; its moments are told as entry numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from nsysfrag.moments import GROWTH_SPAN_NS, decimals, moment_since

if TYPE_CHECKING:
    from nsysfrag.analysis.results import SpaceAnalysis

F64 = npt.NDArray[np.float64]


def _unit(space: SpaceAnalysis) -> float:
    # Without timestamps the input's times are entry numbers, one apart.
    return 1e9 if space.timestamps else 1.0


def _origin(space: SpaceAnalysis) -> int:
    # A space without times numbers its own entries from 0, whatever its siblings' clocks say.
    return space.source.first_event_ns if space.timestamps else 0


def since_start_s(space: SpaceAnalysis, time_ns: int) -> float:
    """``time_ns`` (the input's own clock) in seconds since the input's first event (entries
    since the first one, without timestamps): a figure's x for that moment."""
    return (int(time_ns) - _origin(space)) / _unit(space)


def since_start_array(space: SpaceAnalysis, time_ns: npt.NDArray[np.int64]) -> F64:
    """:func:`since_start_s` of every element (a figure's x values)."""
    x: F64 = (time_ns - _origin(space)).astype(np.float64) / _unit(space)
    return x


def span_ns(space: SpaceAnalysis) -> int:
    """From the input's first event to the space's last: what its times' resolution follows."""
    t = space.timeline.time_ns
    return int(t[-1]) - _origin(space) if len(t) else 0


def moment(space: SpaceAnalysis, time_ns: int) -> str:
    """``1.234 s`` since the input's first event (``0.000835 s`` where the input spans under a
    second), or ``entry 17`` (``event 17``) without timestamps."""
    untimed = space.source.words.untimed
    return moment_since(time_ns, _origin(space), space.timestamps, untimed, span_ns(space))


def growth_words(space: SpaceAnalysis) -> str:
    """The growth of global fragmentation as reports say it: ``+1.104 points/s``, or why it is
    not shown (no times; a span too short for a rate per second to mean anything)."""
    if not space.timestamps:
        return "not measured (no times)"
    span = span_ns(space)
    if span < GROWTH_SPAN_NS:
        return f"not shown (the input spans {span / 1e9:.{decimals(span)}f} s, under a second)"
    text = f"{space.growth_per_s * 100:+.3f} points/s"
    # A rate that rounds to nothing is said as such, never as "-0.000".
    return "±0.000 points/s" if float(text.split()[0]) == 0 else text


def axis_label(space: SpaceAnalysis) -> str:
    """The x-axis label of every time figure."""
    if not space.timestamps:
        return space.source.words.untimed_axis
    return "time since the input's first event (s)"

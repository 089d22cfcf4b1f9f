"""A moment as every report says it, from plain numbers: ``1.234 s`` since an origin, or
``entry 17`` for an input without timestamps. ``analysis.time_base`` says the same from a
space's analysis; a report made from a JSON document (a job's rank, a comparison, a record)
says it from here without loading the analysis."""

from __future__ import annotations

# Below this span a report's times are told to the microsecond (a snapshot of a few hundred
# microseconds would otherwise put every moment "at 0.000 s"), from it to the millisecond.
SHORT_SPAN_NS = 1_000_000_000
# Growth per second over a span shorter than this means nothing (a 1 ms snapshot's +38443
# points/s): it is not shown.
GROWTH_SPAN_NS = 1_000_000_000


def decimals(span: int | None) -> int:
    """Decimals of a second for times over ``span`` ns (None: not known, milliseconds)."""
    return 6 if span is not None and span < SHORT_SPAN_NS else 3


def moment_since(
    time_ns: int,
    origin_ns: int,
    timestamps: bool = True,
    untimed: str = "entry",
    span: int | None = None,
) -> str:
    """:func:`moment` from its parts, for a report that has a JSON document rather than the
    analysis (a job's rank: ``trace.first_event_ns``, ``trace.timestamps``); ``span``, the
    input's in ns, sets the resolution."""
    if not timestamps:
        return f"{untimed} {int(time_ns) - origin_ns}"
    return f"{(int(time_ns) - origin_ns) / 1e9:.{decimals(span)}f} s"

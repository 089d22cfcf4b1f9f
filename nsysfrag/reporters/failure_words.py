"""Each failed allocation in words, for the terminal and the HTML report alike.

A failure is told with its own moment, request and state, never with another moment's (the
peak, say): when it happened, what it asked for, what was free then, and its verdict in plain
words, with the sites whose blocks stranded memory when the verdict is fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass

from nsysfrag.analysis import SpaceAnalysis
from nsysfrag.analysis.advice import CAPACITY_REMEDY, fragmentation_remedy
from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.analysis.results import CAPACITY, FRAGMENTATION, Failure
from nsysfrag.analysis.time_base import moment

# The failures the terminal shows per space; the JSON and the HTML list every one.
TERMINAL_SHOWN = 10
VERDICT_WORDS = {
    CAPACITY: "out of capacity",
    FRAGMENTATION: "fragmentation",
}
UNKNOWN_WORDS = "verdict unknown"


@dataclass(frozen=True, slots=True)
class FailureText:
    """One failure: its figures as (label, value) pairs, the same labels for every failure of a
    space, and what it means."""

    cells: tuple[tuple[str, str], ...]  # at, requested, the state then, verdict
    explanation: str  # the verdict in a sentence; "" when the verdict is unknown
    requested_at: str | None  # where the request was made, where the input records it
    stranded: tuple[tuple[str, str], ...]  # (site, "798.56 MiB in 11 segments"), largest first
    callers: tuple[str, ...] = ()  # the program's frames that led to requested_at, innermost first


def verdict_words(f: Failure) -> str:
    return VERDICT_WORDS.get(f.verdict, UNKNOWN_WORDS)


def failure_text(space: SpaceAnalysis, f: Failure) -> FailureText:
    st = f.state
    requested = (
        format_bytes(f.requested_bytes)
        if f.requested_bytes is not None
        else space.source.words.size_unknown
    )
    head = [("at", moment(space, st.time_ns)), ("requested", requested)]
    pool = st.pool
    if pool is None or f.requested_bytes is None:
        # No size, no verdict: what was free then, in the state table's words.
        state = (
            [("free", format_bytes(st.free_bytes)), ("free blocks", str(st.free_blocks)),
             ("largest free block", format_bytes(st.largest_free_bytes))]
            if pool is None
            else [("device free", format_bytes(pool.device_free_bytes)),
                  ("stranded", format_bytes(pool.stranded_bytes)),
                  ("largest usable", format_bytes(st.largest_free_bytes))]
        ) + [("live", format_bytes(st.live_bytes))]  # fmt: skip
        cells = (*head, *state, ("verdict", verdict_words(f)))
        return FailureText(cells, "", f.site, (), f.stack[1:])
    device_free = (
        f.recorded_device_free_bytes
        if f.recorded_device_free_bytes is not None
        else pool.device_free_bytes
    )
    state = [
        ("device free", format_bytes(device_free)),
        ("reserved", format_bytes(pool.reserved_bytes)),
        ("allocated", format_bytes(pool.allocated_bytes)),
        *(
            [("active", format_bytes(pool.active_bytes))]
            if pool.active_bytes != pool.allocated_bytes
            else []
        ),
        ("stranded", format_bytes(pool.stranded_bytes)),
        ("releasable", format_bytes(pool.releasable_bytes)),
        ("largest free block", format_bytes(pool.largest_block_bytes)),
        ("largest usable", format_bytes(st.largest_free_bytes)),
    ]
    could = device_free + pool.stranded_bytes + pool.releasable_bytes
    asked = format_bytes(f.requested_bytes)
    if f.verdict == CAPACITY:
        explanation = (
            f"Out of capacity: {asked} is more than device free + stranded + releasable"
            f" ({format_bytes(could)}), so even with no fragmentation at all it would not have"
            f" fit; {CAPACITY_REMEDY}."
        )
    else:
        held = " in segments that also hold blocks from the sites below" if f.stranded_sites else ""
        explanation = (
            f"Fragmentation: device free + stranded + releasable ({format_bytes(could)}) would"
            f" have held {asked}, but no single free range did (the largest usable was"
            f" {format_bytes(st.largest_free_bytes)}); {format_bytes(pool.stranded_bytes)} was"
            f" stranded{held}: {fragmentation_remedy(space)}."
        )
    stranded = tuple(
        (x.site, f"{format_bytes(x.stranded_bytes)} in {x.segments} segment"
         + ("" if x.segments == 1 else "s"))
        for x in f.stranded_sites
    )  # fmt: skip
    cells = (*head, *state, ("verdict", verdict_words(f)))
    return FailureText(cells, explanation, f.site, stranded, f.stack[1:])


def failure_table(texts: list[FailureText]) -> tuple[list[str], list[list[str]]]:
    """Headings and rows of the failures' figures; where no failure has a recorded size (so
    every verdict is unknown, as the section's title says), without those two columns."""
    said = {"requested", "verdict"} if not any(t.explanation for t in texts) else set()
    labels = [label for label, _ in texts[0].cells if label not in said] if texts else []
    rows = [[value for label, value in t.cells if label not in said] for t in texts]
    return labels, rows


def unknown_note(space: SpaceAnalysis) -> str:
    """Said once under failures whose verdict is unknown (no request size)."""
    return (
        "Without the request's size a failure cannot be told apart: fragmentation or a full"
        " device. The state at it still says how large a request could have succeeded then (its"
        f" {space.source.words.largest_meaning})."
    )


def failures_title(space: SpaceAnalysis) -> str:
    """``Failed allocations: 3 (2 out of capacity, 1 fragmentation)``."""
    n = len(space.ooms)
    if all(f.requested_bytes is None for f in space.ooms):
        return f"Failed allocations: {n} ({space.source.words.size_unknown}, {UNKNOWN_WORDS})"
    kinds: dict[str, int] = {}
    for f in space.ooms:
        kinds[verdict_words(f)] = kinds.get(verdict_words(f), 0) + 1
    split = ", ".join(f"{count} {words}" for words, count in kinds.items())
    return f"Failed allocations: {n} ({split})"

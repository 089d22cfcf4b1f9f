"""The what-if report in the terminal: per space a ranked table fitted to the console's width,
the recommendation, and the validation table."""

from __future__ import annotations

from rich import box
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from nsysfrag.analysis.metrics import (
    Health,
    format_bytes,
    free_blocks_health,
    global_frag_health,
    local_frag_health,
)
from nsysfrag.printable import printable
from nsysfrag.reporters.layout import Prose, outside
from nsysfrag.reporters.whatif.driver_words import failures_phrase
from nsysfrag.reporters.whatif.words import (
    VALIDATION_COLUMNS,
    change,
    error,
    match,
    oom_list,
    ratio,
    recommendation_text,
    reference_text,
    release_bursts_text,
    space_meta,
    space_title,
    when,
)
from nsysfrag.whatif import (
    VALIDATION_TARGET_MATCH,
    VALIDATION_TARGET_PEAK,
    SpaceComparison,
    Validation,
    WhatifReport,
)

STYLE = {Health.OK: "green", Health.WARN: "yellow", Health.CRITICAL: "bold red"}

TERMINAL_COLUMNS = (
    "#", "policy", "peak\nreserved", "vs\nbaseline", "sim.\nOOMs", "1st OOM",
    "R/U at\npeak", "max\nglobal", "max\nlocal", "max free\nblocks", "health",
)  # fmt: skip
_VALIDATION_DROP = ("empty\ncache", "OOM paths\nrec. → sim.", "simulated", "matched\nin order", "device")


def render_terminal(report: WhatifReport, console: Console) -> None:
    head = Text()
    head.append("What if: ", style="bold")
    head.append(f"{printable(report.input_path)}\n")
    head.append(f"{report.input_kind} · {report.request_level}", style="dim")
    console.print(Prose(head))
    for note in report.notes:
        console.print(Prose(outside(f"note: {note}", style="dim")))
    for s in report.spaces:
        console.print()
        _terminal_space(s, console)
    if report.validation is not None:
        console.print()
        _terminal_validation(report.validation, console)


def _fitted_table(
    console: Console,
    title: str,
    columns: tuple[str, ...],
    rows: list[list[RenderableType]],
    drop_order: tuple[str, ...],
    shown: list[str] | None = None,
) -> Table:
    """The table with as many columns as the console's width allows: the columns in
    ``drop_order`` go first, in that order, so the key figures always show whole. ``shown``,
    when given, is left holding the columns that fit (what a footnote may define)."""
    shown = shown if shown is not None else []
    shown[:] = columns
    while True:
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                      collapse_padding=True)  # fmt: skip
        for c in shown:
            left = c in ("policy", "compared")
            table.add_column(c, justify="left" if left else "right", no_wrap=True)
        for row in rows:
            table.add_row(*(cell for c, cell in zip(columns, row, strict=True) if c in shown))
        width = Measurement.get(console, console.options.update(max_width=100_000), table).maximum
        droppable = [c for c in drop_order if c in shown]
        if width <= console.width or not droppable:
            return table
        shown.remove(droppable[0])


_TERMINAL_DROP = ("1st OOM", "R/U at\npeak", "max free\nblocks", "health", "max\nlocal", "#",
                  "max\nglobal")  # fmt: skip


def _terminal_space(s: SpaceComparison, console: Console) -> None:
    console.print(Prose(outside(space_title(s), style="bold")))
    for k, v in space_meta(s):
        console.print(Prose(outside(f"  {k}: {v}")))
    for w in s.warnings:
        console.print(Prose(outside(f"warning: {w}", style="yellow")))
    base = s.baseline
    rows: list[list[RenderableType]] = []
    for i, o in enumerate(s.outcomes, 1):
        style = "bold" if o.baseline else ""
        rows.append([
            str(i),
            # one option a line: a long policy name never folds inside a word
            Text("\n").join(outside(part, style=style) for part in _options(o.name)),
            Text(format_bytes(o.peak_reserved_bytes), style=style),
            change(o, base),
            Text(str(o.simulated_ooms), style="bold red" if o.simulated_ooms else "green"),
            when(o.first_oom_time_ns, s),
            ratio(o.reserved_over_requested_at_peak),
            Text(f"{o.max_global_frag:.1%}", style=STYLE[global_frag_health(o.max_global_frag)]),
            Text(f"{o.max_local_frag:.1%}", style=STYLE[local_frag_health(o.max_local_frag)]),
            Text(str(o.max_free_blocks), style=STYLE[free_blocks_health(o.max_free_blocks)]),
            Text(o.health.label, style=STYLE[o.health]),
        ])  # fmt: skip
    title = "Policies, ranked (fewest simulated OOMs, then least peak reserved)"
    shown: list[str] = []
    console.print(_fitted_table(console, title, TERMINAL_COLUMNS, rows, _TERMINAL_DROP, shown))
    console.print(Prose(Text(footnote(shown), style="dim")))
    for o in s.outcomes:
        if o.simulated_ooms:
            console.print(
                Prose(
                    outside(
                        f"{o.name}: {o.simulated_ooms} {failures_phrase(o)[0]}, the first at"
                        f" {when(o.first_oom_time_ns, s)}; {failures_phrase(o)[1]}:"
                        f" {oom_list(o.largest_free_at_oom_bytes, 4)}",
                        style="dim",
                    )
                )
            )
    rec = s.recommendation
    console.print(
        Prose(Text.assemble(("Recommendation: ", "bold"), printable(recommendation_text(rec))))
    )
    reference = reference_text(rec)
    if reference:
        console.print(Prose(outside(reference, style="dim")))


# What each column means, for the footnote: only the columns the console shows are defined.
# Each clause ends alike however many are shown ("sim. OOMs", never dropped, comes last), so a
# narrow report says nothing a wide one does not.
_MEANINGS = {
    "1st OOM": "1st OOM: when the first happened, since the input's first event",
    "R/U at\npeak": "R/U at peak: reserved over requested bytes when reserved peaks (Johnstone &"
    " Wilson)",
    "sim.\nOOMs": "sim. OOMs: requests the policy could not place on this capacity",
}
_MAXIMA = {"max\nglobal": "global frag", "max\nlocal": "local frag", "max free\nblocks": "free blocks"}


def footnote(shown: list[str]) -> str:
    """The footnote under the policy table: a definition of each column ``shown``, no other."""
    parts = []
    maxima = [name for column, name in _MAXIMA.items() if column in shown]
    if maxima:
        named = maxima[0] if len(maxima) == 1 else ", ".join(maxima[:-1]) + " and " + maxima[-1]
        parts.append(
            f"the maxima over the run of {named}, as analyze defines the metrics, over"
            " everything free on the device (its memory outside what the policy reserved, and"
            " the free bytes inside)"
        )
    if "health" in shown:
        parts.append("health: analyze's rating of them")
    parts += [text for column, text in _MEANINGS.items() if column in shown]
    return "; ".join(parts) + "."


def _options(name: str) -> list[str]:
    """``torch:a=1,b=2`` as ``["torch:a=1,", "b=2"]``: the lines a policy name takes."""
    parts = name.split(",")
    return [p + "," for p in parts[:-1]] + parts[-1:]


def _terminal_validation(v: Validation, console: Console) -> None:
    rows: list[list[RenderableType]] = [
        [
            str(d.device), d.action.replace("segment_", ""), str(d.recorded_segment_allocs),
            str(d.simulated_segment_allocs), str(d.matched_segment_allocs),
            match(d.segment_alloc_match), format_bytes(d.peak_reserved_recorded_bytes),
            format_bytes(d.peak_reserved_simulated_bytes), error(d.peak_error),
            f"{d.recorded_oom_paths} → {d.simulated_oom_paths}", str(d.empty_cache_calls),
        ]
        for d in v.devices
    ]
    title = f"Validation of the torch model against the recorded segments ({printable(v.settings)})"
    table = _fitted_table(console, title, VALIDATION_COLUMNS, rows, _VALIDATION_DROP)
    console.print(table)
    verdict = {True: ("meets the target", "green"), False: ("misses the target", "bold red"),
               None: ("no segment events to compare", "yellow")}[v.meets_target]  # fmt: skip
    verdict_line = Text.assemble(
        ("Validation: ", "bold"),
        f"segment allocations reproduced {match(v.segment_alloc_match)}, peak reserved"
        f" {format_bytes(v.peak_reserved_simulated_bytes)} simulated vs"
        f" {format_bytes(v.peak_reserved_recorded_bytes)} recorded ({error(v.peak_error)}): ",
        verdict,
        f" (≥ {VALIDATION_TARGET_MATCH:.0%} reproduced, peak within {VALIDATION_TARGET_PEAK:.0%})",
    )
    console.print(Prose(verdict_line))
    for d in v.devices:
        said = release_bursts_text(d)
        if said:
            console.print(Prose(Text(said, style="dim")))

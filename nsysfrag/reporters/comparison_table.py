"""The terminal report of a run-to-run comparison: per space the verdict, the state side by
side (at peak memory, at worst fragmentation, final, over the run) and the sites whose figures
changed most."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.text import Text

from nsysfrag.checks.comparison import Comparison, SpaceComparison
from nsysfrag.checks.verdict import plain, signed_bytes
from nsysfrag.reporters.comparison_cells import (
    BETTER,
    WORSE,
    Change,
    capacity_footnote,
    site_rows,
    state_sections,
    unchanged_words,
)
from nsysfrag.reporters.layout import Cell, Column, FittedTable, Layout, Prose, Site, outside

_STYLE = {WORSE: "red", BETTER: "green"}
_STATE_COLUMNS = (
    Column("", kind="words"),
    Column("base", justify="right"),
    Column("current", justify="right"),
    Column("change", justify="right"),
)


def _site_columns(site_label: str) -> tuple[Column, ...]:
    return (Column(site_label, kind="site"), *_SITE_FIGURES)


_SITE_FIGURES = (
    Column("base", justify="right"),
    Column("current", justify="right"),
    Column("change", justify="right", kind="words"),
)


def _change(c: Change) -> Text:
    if c.text == "=":
        return Text("=", style="dim")
    return Text(c.text, style=_STYLE.get(c.tone, ""))


def render(comparison: Comparison, base_name: str, current_name: str, console: Console) -> None:
    for s in comparison.spaces:
        render_space(comparison, s, base_name, current_name, console)
    unpaired(comparison.only_in_base, comparison.only_in_current, base_name, current_name, console)
    if not comparison.spaces:
        console.print(Text("No matching spaces to compare.", style="yellow"))


def title(comparison: Comparison, s: SpaceComparison, base_name: str, current_name: str) -> str:
    """``pytorch-segments address space · device 0 (a.json) → device 0 (b.json)``."""
    words = comparison.words
    what = f"{words.space_title} · " if words is not None else ""
    return f"{what}{s.base_space} ({base_name}) → {s.current_space} ({current_name})"


def render_space(
    comparison: Comparison, s: SpaceComparison, base_name: str, current_name: str, console: Console
) -> None:
    console.print(Prose(outside(title(comparison, s, base_name, current_name), style="bold")))
    if s.verdict:
        console.print(Prose(outside(plain(s.verdict))))
    for lacking in s.missing:
        console.print(Prose(outside(f"not compared: {lacking}", style="yellow")))
    rows: list[list[Cell]] = []
    ends: set[int] = set()
    for section in state_sections(comparison, s):
        for r in section:
            label = Text(r.label, style="bold") if r.heading else Text("  " + r.label)
            rows.append([label, r.base, r.current, _change(r.change)])
        ends.add(len(rows) - 1)
    console.print(FittedTable(None, Layout(_STATE_COLUMNS, rows, frozenset(ends))))
    if footnote := capacity_footnote(s):
        console.print(Prose(outside(footnote, style="yellow")))
    site_label = comparison.words.site_label if comparison.words is not None else "site"
    for figure in s.sites:
        shown, more, more_delta = site_rows(figure)
        if not shown:
            console.print(Prose(Text(unchanged_words(figure), style="dim")))
            continue
        cells: list[list[Cell]] = [
            [
                Site(r.site),
                r.base,
                r.current,
                _change(
                    Change(" ".join(filter(None, (r.change.text, r.short_status))), r.change.tone)
                ),
            ]
            for r in shown
        ]
        heading = Text(figure.label[:1].upper() + figure.label[1:], style="bold")
        console.print(FittedTable(heading, Layout(_site_columns(site_label), cells)))
        if more:
            console.print(
                Prose(
                    Text(
                        f"… and {more} more sites changed, {signed_bytes(more_delta)} in all",
                        style="dim",
                    )
                )
            )


def unpaired(
    only_in_base: Sequence[str],
    only_in_current: Sequence[str],
    base_name: str,
    current_name: str,
    console: Console,
) -> None:
    """What only one side has (spaces, or a job's ranks), one line each."""
    for name in only_in_base:
        console.print(Prose(outside(f"only in {base_name}: {name}", style="yellow")))
    for name in only_in_current:
        console.print(Prose(outside(f"only in {current_name}: {name}", style="yellow")))

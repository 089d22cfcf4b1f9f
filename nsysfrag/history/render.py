"""The history in the terminal (a table of runs, sparklines) and as JSON for dashboards."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from nsysfrag.history.store import StoredRun
from nsysfrag.history.trends import Series, format_value, models_words, space_words, sparkline
from nsysfrag.printable import printable
from nsysfrag.reporters.layout import Cell, Column, FittedTable, Layout, Prose, outside

JSON_SCHEMA = "nsysfrag-history/1"
HEALTH_STYLE = {"ok": "green", "warn": "yellow", "critical": "bold red"}


_COLUMNS = (
    Column("run", justify="right"),
    Column("recorded (UTC)", kind="words"),
    Column("label", kind="name"),
    Column("tags", kind="name"),
    Column("trace", kind="name"),
    Column("space", kind="words"),
    Column("global", justify="right"),
    Column("local", justify="right"),
    Column("free blocks", justify="right"),
    Column("health"),
)
# For a narrow terminal: the run's number, label, tags and trace in one column, given room
# before the date and the space wrap.
_NARROW_COLUMNS = (
    Column("run", kind="name", floor=22),
    Column("recorded (UTC)", kind="words"),
    *_COLUMNS[5:],
)


def runs_table(runs: Sequence[StoredRun], where: str) -> FittedTable:
    """One row per space; a run's own columns on its first row, runs newest first."""
    rows: list[list[Cell]] = []
    narrow: list[list[Cell]] = []
    ends: set[int] = set()
    for run in runs:
        label = outside(run.label or "")
        tags = Text("\n").join(outside(f"{k}={v}") for k, v in sorted(run.tags.items()))
        name = run.trace_name if run.rank is None else f"{run.trace_name} (rank {run.rank})"
        trace = outside(name)
        recorded = run.recorded_at.strftime("%Y-%m-%d %H:%M")
        about = Text("\n").join(t for t in (Text(str(run.id)), label, tags, trace) if t.plain)
        spaces: list[list[Cell]] = [
            [
                outside(space_words(space)),
                f"{float(space.get('max.global_frag')):.1%}",
                f"{float(space.get('max.local_frag')):.1%}",
                f"{int(space.get('max.free_blocks')):,}",
                outside(space.health, style=HEALTH_STYLE.get(space.health, "")),
            ]
            for space in run.spaces
        ] or [["(no spaces)", "", "", "", ""]]
        for i, space_cells in enumerate(spaces):
            head: list[Cell] = [str(run.id), recorded, label, tags, trace] if i == 0 else [""] * 5
            rows.append([*head, *space_cells])
            narrow.append([*([about, recorded] if i == 0 else ["", ""]), *space_cells])
        ends.add(len(rows) - 1)
    title = outside(
        f"{len(runs)} run(s) in {where}, newest first · {models_words(runs)} · global/local"
        " fragmentation and free blocks: maxima over each trace"
    )
    return FittedTable(
        title,
        Layout(_COLUMNS, rows, frozenset(ends)),
        alternatives=[Layout(_NARROW_COLUMNS, narrow, frozenset(ends))],
    )


def render_runs(runs: Sequence[StoredRun], where: str, console: Console) -> None:
    if not runs:
        console.print(
            Prose(
                outside(
                    f"no recorded runs match in {where}; record one with `nsysfrag analyze TRACE"
                    " --record`"
                )
            )
        )
        return
    console.print(runs_table(runs, where))


def trend_lines(
    runs_oldest_first: Sequence[StoredRun], all_series: Sequence[Series], metric: str
) -> list[Text]:
    """A heading, then ``device 0  ▁▃▅█  12.0% → 45.0%  (min …, max …)`` per space key."""
    if not runs_oldest_first:
        return [Text("no recorded runs match; nothing to draw")]
    first, last = runs_oldest_first[0], runs_oldest_first[-1]
    lines = [
        Text(
            f"{printable(metric)} over {len(runs_oldest_first)} run(s), oldest first"
            f" (run {first.id} {first.recorded_at:%Y-%m-%d} → run {last.id}"
            f" {last.recorded_at:%Y-%m-%d}) · {printable(models_words(runs_oldest_first))}",
            style="bold",
        )
    ]
    keys = [printable(s.key) for s in all_series]  # a space's key names its model: stored text
    width = max((len(k) for k in keys), default=0)
    for s, key in zip(all_series, keys, strict=True):
        present = s.present
        line = outside(f"{key:<{width}}  ")
        line.append(sparkline(s.values), style="cyan")
        if present:
            line.append(
                f"  {format_value(metric, present[0])} → {format_value(metric, present[-1])}"
                f"  (min {format_value(metric, min(present))},"
                f" max {format_value(metric, max(present))}, {len(present)} run(s))"
            )
        lines.append(line)
    return lines


def json_document(runs: Sequence[StoredRun], where: str) -> dict[str, Any]:
    return {"schema": JSON_SCHEMA, "database": where, "runs": [r.document() for r in runs]}


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def write_json(runs: Iterable[StoredRun], where: str, out: TextIO) -> None:
    """``dumps(json_document(runs, where))``, byte for byte, written one run at a time: the
    document of 200,000 runs is never one string (nor its runs one list) in memory."""
    head = dumps({"schema": JSON_SCHEMA, "database": where, "runs": []})
    opening, closing = head.rsplit('"runs": []', 1)
    out.write(opening + '"runs": [')
    first = True
    for run in runs:
        text = json.dumps(run.document(), indent=2, ensure_ascii=False)
        # One level deeper: JSON text holds no raw newline inside a string, so every line
        # of the run's text is a line of the document.
        out.write(("\n" if first else ",\n") + "    " + text.replace("\n", "\n    "))
        first = False
    out.write(("]" if first else "\n  ]") + closing)

"""The history in the terminal (a table of runs, sparklines) and as JSON for dashboards."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from nsysfrag.history.store import StoredRun
from nsysfrag.history.trends import Series, format_value, sparkline

JSON_SCHEMA = "nsysfrag-history/1"
HEALTH_STYLE = {"ok": "green", "warn": "yellow", "critical": "bold red"}


def runs_table(runs: Sequence[StoredRun], where: str) -> Table:
    """One row per space; a run's own columns on its first row, runs newest first."""
    table = Table(
        title=f"{len(runs)} run(s) in {where}, newest first · observed address space"
        " · global/local fragmentation and free blocks: maxima over each trace",
        title_justify="left",
    )
    columns = (
        ("run", "right", True),
        ("recorded (UTC)", "left", True),
        ("label", "left", False),
        ("tags", "left", False),
        ("trace", "left", False),
        ("space", "left", True),
        ("global", "right", True),
        ("local", "right", True),
        ("free blocks", "right", True),
        ("health", "left", True),
    )
    for name, justify, no_wrap in columns:
        # Fold rather than cut a long trace name or label: the cut part is what tells runs apart.
        table.add_column(name, justify=justify, no_wrap=no_wrap, overflow="fold")  # type: ignore[arg-type]
    for run in runs:
        head = [
            str(run.id),
            run.recorded_at.strftime("%Y-%m-%d %H:%M"),
            run.label or "",
            "\n".join(f"{k}={v}" for k, v in sorted(run.tags.items())),
            run.trace_name if run.rank is None else f"{run.trace_name} (rank {run.rank})",
        ]
        blank = [""] * len(head)
        if not run.spaces:
            table.add_row(*head, "(no spaces)", "", "", "", "", end_section=True)
        for i, space in enumerate(run.spaces):
            table.add_row(
                *(head if i == 0 else blank),
                f"dev {space.device} pid {space.pid}",
                f"{float(space.get('max.global_frag')):.1%}",
                f"{float(space.get('max.local_frag')):.1%}",
                f"{int(space.get('max.free_blocks')):,}",
                Text(space.health, style=HEALTH_STYLE.get(space.health, "")),
                end_section=i == len(run.spaces) - 1,
            )
    return table


def render_runs(runs: Sequence[StoredRun], where: str, console: Console) -> None:
    if not runs:
        console.print(
            f"no recorded runs match in {where}; record one with `nsysfrag analyze TRACE --record`"
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
            f"{metric} over {len(runs_oldest_first)} run(s), oldest first"
            f" (run {first.id} {first.recorded_at:%Y-%m-%d} → run {last.id}"
            f" {last.recorded_at:%Y-%m-%d}) · observed address space",
            style="bold",
        )
    ]
    width = max((len(s.key) for s in all_series), default=0)
    for s in all_series:
        present = s.present
        line = Text(f"{s.key:<{width}}  ")
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

"""The round in the terminal: one table, a section per run (each rank, then the job), each
setting beside the baseline and beside what ``whatif`` predicted (and its error), then a line
per setting's gain against its bar, and the verdict. Read from the ``nsysfrag-try/1`` document
only, every string from it printed as text (``reporters.layout``)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.reporters.layout import Cell, Column, FittedTable, Layout, Prose, outside, right
from nsysfrag.trial.compare import bar_words, change

COLUMNS = (
    Column("setting", kind="name"),
    *right("rank", "peak reserved", "peak allocated", "OOMs", "frag at peak", "retries", "wall",
           "per step", "what-if peak (error)"),
)

# The same rows for a narrow terminal: two figures to a cell.
NARROW = (
    Column("setting", kind="name"),
    *right("rank", "peak reserved\nallocated", "OOMs\nretries", "frag at\npeak", "wall\nper step",
           "what-if\n(error)"),
)

ENDED = {  # how a run ended, when not by itself
    "duration": "ended by --duration",
    "killed": "killed past --duration",
    "stopped": "stopped",
}


def render(doc: dict[str, Any], console: Console) -> None:
    runs = doc["runs"]
    console.print(Prose(outside(
        f"nsysfrag record --try · {len(runs)} run{'s' if len(runs) != 1 else ''}"
        + (f", {doc['repeat']} rounds" if doc["repeat"] > 1 else "")
        + (f", each ended after {doc['duration_s']:g} s at the latest"
           if doc["duration_s"] else ""),
        style="bold",
    )))
    rows: list[list[Cell]] = []
    ends = set()
    for run in runs:
        rows += _run_rows(run, doc["repeat"])
        ends.add(len(rows) - 1)
    narrow = [_narrow(row) for row in rows]
    console.print(FittedTable(None, Layout(COLUMNS, rows, frozenset(ends)),
                              alternatives=[Layout(NARROW, narrow, frozenset(ends))]))  # fmt: skip
    for run in runs:
        label = _label(run, doc["repeat"])
        if run["unrecorded"]:
            _warn(console, f"{label}: nothing recorded, {run['unrecorded']}")
        if run["overridden"]:
            _warn(console, f"{label}: the setting never reached the allocator, {run['overridden']}")
    for r in doc["refused"]:
        _warn(console, f"{r['setting']}: not run, {r['reason']}")
    for s in doc["settings"]:
        console.print(Prose(outside(setting_line(s))))
    if doc["whatif_baseline_error"] is not None:
        console.print(Prose(Text(
            f"The what-if's error on the baseline run: {doc['whatif_baseline_error']:.1%} (its"
            " replay of the baseline's snapshot against the peak the run measured).", style="dim",
        )))
    for note in doc["notes"]:
        console.print(Prose(outside(note, style="dim")))
    verdict = doc["verdict"]
    style = "bold green" if verdict["keep"] else "bold"
    console.print(Prose(outside(f"verdict: {verdict['line']}", style=style)))


def _warn(console: Console, line: str) -> None:
    console.print(Prose(outside(line, style="yellow")))


def _label(run: dict[str, Any], repeats: int) -> str:
    return run["setting"] + (f" #{run['round']}" if repeats > 1 else "")


def _run_rows(run: dict[str, Any], repeats: int) -> list[list[Cell]]:
    label = _label(run, repeats)
    ended = ENDED.get(run["ended"])
    if run["exit_code"] and run["ended"] == "exit":
        ended = f"exit code {run['exit_code']}"
    head = Text(label)
    if ended:
        head.append(f"\n{ended}", style="dim")
    if not run["ranks"]:
        return [[head, *["—"] * 6, _seconds(run["wall_s"]), "—", "—"]]
    rows = [_row(head if i == 0 else "", str(r["rank"]), r, r["wall_s"], r["predicted"])
            for i, r in enumerate(run["ranks"])]  # fmt: skip
    if len(run["ranks"]) > 1:
        job = run["job"]
        predicted = None
        if job["predicted_peak_reserved_bytes"] is not None:
            predicted = {
                "peak_reserved_bytes": job["predicted_peak_reserved_bytes"],
                "simulated_ooms": job["predicted_ooms"],
                "error": job["whatif_error"],
            }
        rows.append(_row("", "job", job, job["wall_s"], predicted))
    return rows


def _row(
    head: Cell, rank: str, f: dict[str, Any], wall: float | None, predicted: dict[str, Any] | None
) -> list[Cell]:
    return [
        head,
        rank,
        _bytes(f["peak_reserved_bytes"]),
        _bytes(f["peak_allocated_bytes"]),
        Text(str(f["ooms"]), style="bold red" if f["ooms"] else ""),
        "—" if f["frag_at_peak"] is None else f"{f['frag_at_peak']:.1%}",
        str(f["alloc_retries"]),
        _seconds(wall),
        "—" if f["step_s"] is None else f"{f['step_s'] * 1e3:.1f} ms",
        _predicted(predicted),
    ]


def _narrow(row: list[Cell]) -> list[Cell]:
    """A wide row's cells two to a cell: (reserved, allocated), (OOMs, retries), (wall, step)."""

    def pair(a: Cell, b: Cell) -> Text:
        top = a.copy() if isinstance(a, Text) else Text(a)
        top.append("\n")
        top.append(b if isinstance(b, Text) else Text(b, style="dim"))
        return top

    head, rank, reserved, allocated, ooms, frag, retries, wall, step, predicted = row
    return [head, rank, pair(reserved, allocated), pair(ooms, retries), frag, pair(wall, step),
            predicted]  # fmt: skip


def _predicted(p: dict[str, Any] | None) -> Cell:
    if p is None:
        return "—"
    text = Text(format_bytes(p["peak_reserved_bytes"]))
    if p["error"] is not None:
        text.append(f"\n({p['error']:+.1%})", style="dim")
    if p["simulated_ooms"]:
        text.append(f"\n{p['simulated_ooms']} OOMs", style="red")
    return text


def setting_line(s: dict[str, Any]) -> str:
    parts = [s["setting"]]
    if s["gain"] is not None:
        parts.append(
            f"peak reserved {format_bytes(s['baseline_peak_reserved_bytes'])} →"
            f" {format_bytes(s['peak_reserved_bytes'])} ({change(s['gain'])})"
        )
    if s["bar"] is not None:
        parts.append(f"bar {s['bar']:.1%} ({bar_words(s['bar_basis'])})")
    if s["predicted_peak_reserved_bytes"] is not None:
        error = f", error {s['whatif_error']:+.1%}" if s["whatif_error"] is not None else ""
        predicted = format_bytes(s["predicted_peak_reserved_bytes"])
        parts.append(f"what-if predicted {predicted}{error}")
    parts.append("kept" if s["kept"] else "not kept")
    return " · ".join(parts)


def _bytes(n: int | float | None) -> str:
    return "—" if n is None else format_bytes(n)


def _seconds(s: float | None) -> str:
    return "—" if s is None else f"{s:.1f} s"



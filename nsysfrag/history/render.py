"""The history in the terminal (a table of runs, sparklines) and as JSON for dashboards."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from nsysfrag.history.store import StoredRun, StoredSpace
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


def render_runs(runs: Sequence[StoredRun], where: str, console: Console, left_out: int = 0) -> None:
    """The runs table; ``left_out`` older matching runs are said, not shown."""
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
    if left_out:
        console.print(
            Prose(
                outside(
                    f"… and {left_out:,} older matching run(s) not shown: the table shows the"
                    f" newest {len(runs):,}; `nsysfrag history --json FILE` writes them all"
                )
            )
        )


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
        out.write(("\n    " if first else ",\n    ") + run_json(run, 2))
        first = False
    out.write(("]" if first else "\n  ]") + closing)


# ---------------------------------------------------------------- a run's JSON text, fast
#
# json.dumps with an indent runs the json module's pure-Python encoder: 2 s of every 9 s of
# --json. A run's document always has one shape, and a space's the shape of its paths, so each
# is written from a template made once per shape; only its scalars are encoded, each the way
# json.dumps encodes it. tests/test_history_scale.py holds the text equal to json.dumps's.

_ESCAPE = json.encoder.encode_basestring  # ensure_ascii=False's, in C where it can be


def _float(value: float) -> str:
    if value - value == 0:  # finite
        return float.__repr__(value)
    return "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"


# By exact type, as json.dumps tells them apart (a bool is not written as an int).
_ENCODE: dict[type, Callable[[Any], str]] = {
    str: _ESCAPE,
    int: int.__repr__,
    float: _float,
    bool: lambda v: "true" if v else "false",
    type(None): lambda v: "null",
}


def _scalar(value: Any) -> str:
    """A scalar as ``json.dumps`` writes it (allow_nan: its NaN and Infinity)."""
    encode = _ENCODE.get(type(value))
    if encode is None:
        raise TypeError(f"not a JSON scalar: {type(value).__name__}")
    return encode(value)


class _Slot:
    """Where a template takes a value."""


_SLOT = _Slot()
_CUT = '"\\u0000"'  # a slot as json.dumps writes it: default() gives "\0", escaped


def _template(document: Any, level: int) -> str:
    """``json.dumps(document, indent=2, ensure_ascii=False)`` with its lines indented
    ``2 * level`` more, as a ``%`` format with a ``%s`` at each ``_SLOT``."""
    text = json.dumps(document, indent=2, ensure_ascii=False,
                      default=lambda o: "\0" if isinstance(o, _Slot) else None)  # fmt: skip
    return text.replace("\n", "\n" + "  " * level).replace("%", "%%").replace(_CUT, "%s")


def _items(texts: list[str], level: int, brackets: str) -> str:
    """A list or object of ``texts`` whose opening bracket is ``level`` deep, as json.dumps."""
    if not texts:
        return brackets
    inner = "\n" + "  " * (level + 1)
    return brackets[0] + inner + ("," + inner).join(texts) + "\n" + "  " * level + brackets[1]


_SPACE_TEMPLATES: dict[tuple[tuple[str, ...], int], str] = {}
_RUN_TEMPLATES: dict[tuple[tuple[str, ...], int], str] = {}
_TAGS, _SPACES = _Slot(), _Slot()


def _space_json(space: StoredSpace, level: int) -> str:
    key = (tuple(space.values), level)
    parts = _SPACE_TEMPLATES.get(key)
    if parts is None:
        parts = _SPACE_TEMPLATES[key] = _template(
            StoredSpace(dict.fromkeys(space.values, _SLOT)).document(), level
        )
    try:
        return parts % tuple([_ENCODE[type(v)](v) for v in space.values.values()])
    except KeyError:  # a value of a type json.dumps does not write as a scalar
        return parts % tuple(map(_scalar, space.values.values()))


def _leaves(node: dict[str, Any], into: list[Any]) -> list[Any]:
    for value in node.values():
        if type(value) is dict:
            _leaves(value, into)
        else:
            into.append(value)
    return into


def _slotted(node: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _slotted(v) if isinstance(v, dict) else v if isinstance(v, _Slot) else _SLOT
        for k, v in node.items()
    }


def run_json(run: StoredRun, level: int = 0) -> str:
    """``json.dumps(run.document(), indent=2, ensure_ascii=False)`` with its lines indented
    ``2 * level`` more (as in a document that holds it ``level`` deep)."""
    # The run's own fields; its tags and spaces, which vary in number, go in whole.
    head = run.document(spaces=False)
    head["tags"], head["spaces"] = _TAGS, _SPACES
    key = (tuple(head), level)
    parts = _RUN_TEMPLATES.get(key)
    if parts is None:
        parts = _RUN_TEMPLATES[key] = _template(_slotted(head), level)
    texts = []
    for value in _leaves(head, []):
        if value is _TAGS:
            tags = [f"{_ESCAPE(k)}: {_scalar(v)}" for k, v in run.tags.items()]
            texts.append(_items(tags, level + 1, "{}"))
        elif value is _SPACES:
            texts.append(_items([_space_json(s, level + 2) for s in run.spaces], level + 1, "[]"))
        else:
            texts.append(_scalar(value))
    return parts % tuple(texts)

"""``nsysfrag history``: the runs recorded with ``--record``, their trends, and a regression check."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TextIO

import click

from nsysfrag.commands.params import Delta
from nsysfrag.errors import EXIT_GATE, InputError
from nsysfrag.history import RunQuery, StoredRun, open_store, parse_tags
from nsysfrag.history.render import render_runs, trend_lines, write_json
from nsysfrag.history.trends import DEFAULT_METRIC, check, nothing_compared, resolve_metric, series
from nsysfrag.pipeline.feedback import say
from nsysfrag.pipeline.outputs import Output, check_destinations, report_console, write_with

TABLE_RUNS = 20
# The most runs the terminal table shows, whatever --limit asks: 200,000 runs' rows are read
# by nobody and took minutes to fit; the rest are counted, and --json writes them all.
TABLE_MAX_RUNS = 1000
TREND_RUNS = 50
DEFAULT_WINDOW = 5
DEFAULT_THRESHOLD = 0.05
# A bound SQL's LIMIT can take on every database; far more runs than any history holds.
MAX_RUNS = 1_000_000_000
_DATE_ONLY = re.compile(r"\s*\d{4}-\d{2}-\d{2}\s*")


class Moment(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """A date (``2025-06-01``) or a time (``2025-06-01T14:30``, ``… 14:30:00+02:00``), UTC unless
    it says otherwise. As an upper bound a bare date includes that whole day."""

    name = "DATE"

    def __init__(self, *, end_of_day: bool = False) -> None:
        self.end_of_day = end_of_day

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            return value
        text = str(value).strip()
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            self.fail(f"{value!r} is not a date; write 2025-06-01 or 2025-06-01T14:30", param, ctx)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        if self.end_of_day and _DATE_ONLY.fullmatch(text):
            moment += timedelta(days=1)
        return moment


@click.command("history")
@click.option("--db", metavar="URL",
              help="The history database: an SQLite path or URL, or postgresql+psycopg://USER@HOST/DB"
              " (default: $NSYSFRAG_DB, else $XDG_DATA_HOME/nsysfrag/history.sqlite).")
@click.option("--tag", "tags", multiple=True, metavar="K=V",
              help="Only runs with this tag (repeatable: every tag must match).")
@click.option("--label", metavar="TEXT", help="Only runs whose label contains TEXT (any case).")
@click.option("--since", type=Moment(), help="Only runs recorded at or after DATE (UTC).")
@click.option("--until", type=Moment(end_of_day=True),
              help="Only runs recorded before DATE (UTC); a bare date includes that day.")
@click.option("--limit", type=click.IntRange(min=1, max=MAX_RUNS), metavar="N",
              help=f"At most the N newest runs (default {TABLE_RUNS} in the table, which shows"
              f" at most {TABLE_MAX_RUNS:,}; {TREND_RUNS} in a trend; all in --json).")
@click.option("--trend", "trend_metric", metavar="METRIC",
              help="Draw METRIC per device over the runs as a sparkline: any numeric key of"
              " the analyze JSON (e.g. global_frag, memory_peak.reserved_bytes, ooms.count;"
              " `nsysfrag analyze --help` lists them).")
@click.option("--png", "png_path", type=click.Path(path_type=Path),
              help="With --trend: also write a line chart to this PNG file.")
@click.option("--check", is_flag=True,
              help="Exit 1 when the newest run is worse than the median of the runs before it.")
@click.option("--metric", "metrics", multiple=True, metavar="METRIC",
              help=f"With --check: the metric to check (repeatable; default {DEFAULT_METRIC}).")
@click.option("--window", type=click.IntRange(min=1, max=MAX_RUNS), metavar="N",
              help=f"With --check: how many earlier runs the median is over (default {DEFAULT_WINDOW}).")
@click.option("--threshold", type=Delta(), metavar="DELTA",
              help=f"With --check: how much worse is a regression, absolute (default {DEFAULT_THRESHOLD},"
              " i.e. 5 points of a ratio).")
@click.option("--json", "json_path", type=click.Path(path_type=Path),
              help="Write the matching runs and their spaces as JSON ('-' for stdout).")
def history_command(
    db: str | None,
    tags: tuple[str, ...],
    label: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int | None,
    trend_metric: str | None,
    png_path: Path | None,
    check: bool,
    metrics: tuple[str, ...],
    window: int | None,
    threshold: float | None,
    json_path: Path | None,
) -> None:
    """List the runs recorded with `analyze --record`, draw a metric's trend, or check the
    newest run for a regression.

    Runs are listed newest first, one row per space (process and device). Spaces are followed
    across runs by device, since pids change. The check compares the newest matching run with
    the median of the --window runs before it (same filters), per device and metric, and exits
    1 with one line per regression.

    Examples:

    \b
        nsysfrag analyze run.sqlite --record --label "nightly #412" --tag model=llama-8b
        nsysfrag history --tag model=llama-8b
        nsysfrag history --trend global_frag --tag model=llama-8b --png trend.png
        nsysfrag history --check --window 5 --threshold 0.05
    """
    if png_path is not None and trend_metric is None:
        raise InputError("--png goes with --trend METRIC: say which metric to draw")
    if not check and (metrics or window is not None or threshold is not None):
        raise InputError("--metric, --window and --threshold go with --check")
    outputs = [Output("--json", json_path)] if json_path is not None else []
    if png_path is not None:
        outputs.append(Output("--png", png_path, stdout_ok=False))
    check_destinations(outputs, db=db)
    trend = resolve_metric(trend_metric) if trend_metric is not None else None
    checked = [resolve_metric(m) for m in metrics or (DEFAULT_METRIC,)]
    query = RunQuery(tags=parse_tags(tags), label=label, since=since, until=until)
    console = report_console()
    to_screen = not any(o.to_stdout for o in outputs)

    with open_store(db, create=False) as store:
        where = store.location
        if store.note is not None:
            _note(store.note)
        if json_path is not None:
            runs = store.iter_runs(_limited(query, limit), values=False)
            _write_whole(outputs[0], lambda out: write_json(runs, where, out))
        if trend is not None:
            # Only the metric drawn: 200,000 runs' 10 M values are not read for one of them.
            runs = store.runs(_limited(query, limit or TREND_RUNS), values=frozenset({trend}))[::-1]
            all_series = series(runs, trend)
            if to_screen:
                for line in trend_lines(runs, all_series, trend):
                    console.print(line)
            if png_path is not None:
                from nsysfrag.history.chart import trend_figure, write_png  # matplotlib: slow

                try:
                    write_png(trend_figure(runs, all_series, trend), png_path)
                except OSError as err:
                    raise InputError(f"--png {png_path}: cannot write ({err.strerror})") from None
        elif to_screen and not check:
            asked = limit or TABLE_RUNS
            table = store.runs(_limited(query, min(asked, TABLE_MAX_RUNS)), values=False)
            left_out = 0
            if asked > TABLE_MAX_RUNS and len(table) == TABLE_MAX_RUNS:
                left_out = store.count(_limited(query, asked)) - len(table)
            render_runs(table, where, console, left_out)
        if check:
            window = window or DEFAULT_WINDOW
            result = _check(
                store.runs(_limited(query, window + 1)),
                checked,
                window,
                DEFAULT_THRESHOLD if threshold is None else threshold,
            )
            if result:
                raise click.exceptions.Exit(EXIT_GATE)


def _write_whole(output: Output, write: Callable[[TextIO], object]) -> None:
    """``write_with``, but to stdout only once ``write`` is done: a value refused in the
    200,000th run must not leave 199,999 runs of a document on stdout, with no end, for a
    dashboard to take. The document is staged in a temporary file (it can be GBs; a file
    destination is written to a temporary name and renamed already)."""
    if not output.to_stdout:
        write_with(output, write)
        return
    try:
        staged = tempfile.TemporaryFile("w+", encoding="utf-8", newline="")
    except OSError as err:
        raise InputError(
            f"{output.option} -: cannot make a temporary file in {tempfile.gettempdir()}"
            f" ({err.strerror}); set TMPDIR to a writable folder or write to a file"
        ) from None
    with staged:
        try:
            write(staged)
            staged.seek(0)
        except OSError as err:
            raise InputError(
                f"{output.option} -: cannot stage the document in {tempfile.gettempdir()}"
                f" ({err.strerror}); set TMPDIR to a folder with room or write to a file"
            ) from None
        write_with(output, lambda out: shutil.copyfileobj(staged, out, 1 << 20))


def _limited(query: RunQuery, limit: int | None) -> RunQuery:
    return RunQuery(query.tags, query.label, query.since, query.until, limit)


def _check(runs: list[StoredRun], metrics: list[str], window: int, threshold: float) -> bool:
    """Print the verdict on stderr; True when a metric regressed."""
    result = check(runs, metrics, window, threshold)
    names = ", ".join(metrics)
    if result.latest is None:
        _note("no recorded runs match; nothing to check")
    elif not result.previous:
        _note(f"run {result.latest.id} is the first matching run; nothing to compare it with")
    elif result.compared == 0:
        _note(nothing_compared(result, metrics))
    for regression in result.regressions:
        _note(regression.message())
    if result.latest is not None and result.compared and not result.regressions:
        _note(
            f"run {result.latest.id}: no regression of {names} against the median of the"
            f" {len(result.previous)} run(s) before it (threshold {threshold:g})"
        )
    return bool(result.regressions)


def _note(message: str) -> None:
    say(message)

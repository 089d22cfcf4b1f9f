"""The analysis and report options shared by ``analyze`` and ``profile``."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from nsysfrag.analysis import DEFAULT_GRANULARITY, Analysis, analyze
from nsysfrag.checks.comparison import compare, load_document
from nsysfrag.checks.gates import Gate, evaluate, parse_gate
from nsysfrag.errors import EXIT_GATE, InputError
from nsysfrag.history import RunRecord, database_url, open_store, parse_tags
from nsysfrag.inputs.nsys.reader import read_trace
from nsysfrag.inputs.nsys.records import ProgressCallback
from nsysfrag.models.observed import kernel as replay
from nsysfrag.reporters import comparison_table, csv_report, json_report, terminal

F = TypeVar("F", bound=Callable[..., Any])

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 10**6, "mb": 10**6,
          "mib": 1 << 20, "g": 10**9, "gb": 10**9, "gib": 1 << 30, "t": 10**12, "tb": 10**12,
          "tib": 1 << 40}
STDOUT = Path("-")


class ByteSize(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """A byte count: ``85899345920``, ``80GiB``, ``512``, ``2MiB``."""

    name = "BYTES"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            self.fail(f"{value!r} is not a size; write e.g. 85899345920, 80GiB or 512", param, ctx)
        size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
        if size < 1:
            self.fail(f"{value!r} must be at least 1 byte", param, ctx)
        return size


@dataclass(frozen=True)
class ReportRequest:
    """What the user asked to compute and where to put it."""

    json_path: Path | None = None
    csv_path: Path | None = None
    html_path: Path | None = None
    png_dir: Path | None = None
    capacity: int | None = None
    granularity: int = DEFAULT_GRANULARITY
    quiet: bool = False
    gates: tuple[Gate, ...] = ()
    baseline: Path | None = None
    fail_on_regression: float | None = None
    record: bool = False
    label: str | None = None
    tags: tuple[tuple[str, str], ...] = ()
    db: str | None = None

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> ReportRequest:
        json_path, html_path, output = (
            options.pop("json_path"),
            options.pop("html_path"),
            options.pop("output"),
        )
        if output is not None:
            suffix = output.suffix.lower()
            if suffix == ".json":
                json_path = json_path or output
            elif suffix in (".html", ".htm"):
                html_path = html_path or output
            else:
                raise InputError(f"{output}: unknown report format; use a .json or .html path with -o")
        baseline, regression = options.pop("baseline"), options.pop("fail_on_regression")
        if regression is not None and baseline is None:
            raise InputError("--fail-on-regression needs --baseline BASE.json to compare against")
        record, label, db = options.pop("record"), options.pop("label"), options.pop("db")
        tags = parse_tags(options.pop("tags"))
        if not record and (label is not None or tags or db is not None):
            raise InputError("--label, --tag and --db go with --record (store this run in the history)")
        if record:
            database_url(db)  # a malformed URL fails now, not after the analysis
        return cls(
            record=record,
            label=label,
            tags=tags,
            db=db,
            json_path=json_path,
            csv_path=options.pop("csv_path"),
            html_path=html_path,
            png_dir=options.pop("png_dir"),
            capacity=options.pop("capacity"),
            granularity=options.pop("granularity"),
            quiet=options.pop("quiet"),
            gates=tuple(parse_gate(g) for g in options.pop("fail_on")),
            baseline=baseline,
            fail_on_regression=regression,
        )

    def outputs(self) -> list[Path]:
        files = (self.json_path, self.csv_path, self.html_path)
        return [p for p in files if p is not None and p != STDOUT]


def report_options(f: F) -> F:
    """Decorate a command with the analysis and report options."""
    options = [
        click.option("--json", "json_path", type=click.Path(path_type=Path),
                     help="Write the SPEC JSON document here ('-' for stdout, which replaces the report)."),
        click.option("-o", "--output", "output", type=click.Path(path_type=Path),
                     help="Write a report whose format follows the suffix (.json)."),
        click.option("--csv", "csv_path", type=click.Path(path_type=Path),
                     help="Write the full-resolution timeline, one row per event."),
        click.option("--capacity", type=ByteSize(), default=None,
                     help="Device memory per space, overriding the trace's TARGET_INFO_GPU (e.g. 80GiB)."),
        click.option("--granularity", type=ByteSize(), default=DEFAULT_GRANULARITY, show_default=True,
                     help="Allocation rounding: a block's footprint is its size rounded up to this."),
        click.option("--html", "html_path", type=click.Path(path_type=Path),
                     help="Write a self-contained HTML report (plots inline, works offline)."),
        click.option("--png", "png_dir", type=click.Path(path_type=Path),
                     help="Write six PNG plots per space into this folder."),
        click.option("--fail-on", "fail_on", multiple=True, metavar="EXPR",
                     help="Exit 1 when any space meets EXPR, e.g. 'global_frag>0.3', 'health=critical'. Repeatable."),
        click.option("--baseline", type=click.Path(path_type=Path),
                     help="Compare with an earlier run's --json document."),
        click.option("--fail-on-regression", type=float, default=None, metavar="DELTA",
                     help="With --baseline: exit 1 when a fragmentation ratio grew by more than DELTA (e.g. 0.05)."),
        click.option("-q", "--quiet", is_flag=True, help="Print no terminal report."),
        click.option("--record", is_flag=True,
                     help="Store this run's summary in the history database (see `nsysfrag history`)."),
        click.option("--label", metavar="TEXT", help="With --record: a label for the run, e.g. 'nightly #412'."),
        click.option("--tag", "tags", multiple=True, metavar="K=V",
                     help="With --record: tag the run, e.g. model=llama-8b (repeatable)."),
        click.option("--db", metavar="URL",
                     help="With --record: the history database (SQLite path or URL, or postgresql+psycopg://…;"
                     " default $NSYSFRAG_DB, else $XDG_DATA_HOME/nsysfrag/history.sqlite)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def check_outputs(request: ReportRequest, trace: Path) -> None:
    """Fail before any work when an output would clobber the trace or cannot be written."""
    for path in request.outputs() + ([request.png_dir] if request.png_dir else []):
        if path.exists() and trace.exists() and path.resolve() == trace.resolve():
            raise InputError(f"{path}: refusing to overwrite the input trace; choose another path")
    for path in request.outputs():
        if not path.parent.exists():
            raise InputError(f"{path}: folder {path.parent} does not exist; create it first")
    if request.png_dir is not None and request.png_dir.exists() and not request.png_dir.is_dir():
        raise InputError(f"{request.png_dir}: not a folder; --png takes a folder for the plots")
    if request.baseline is not None:
        load_document(request.baseline)  # fail now, not after a long analysis


def _write_text(path: Path, text: str) -> None:
    if path == STDOUT:
        click.echo(text, nl=False)
        return
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot write ({err.strerror}); choose a writable path") from None


def analyze_sqlite(
    sqlite_path: Path, request: ReportRequest, *, show_progress: bool = True
) -> Analysis:
    """``show_progress=False``: no bar even on a terminal (a job's workers share the coordinator's)."""
    # Loading the compiled replay takes a moment; SQLite reads without the GIL, so overlap them.
    warming = threading.Thread(target=replay.warm_up, daemon=True)
    warming.start()
    with progress_bar() if show_progress else nullcontext(None) as progress:
        trace = read_trace(sqlite_path, progress=progress)
        warming.join()
        return analyze(
            trace,
            capacity_bytes=request.capacity,
            granularity_bytes=request.granularity,
            progress=progress,
        )


@contextmanager
def progress_bar() -> Iterator[ProgressCallback | None]:
    """A transient bar per phase (loading rows, replaying events) on stderr, only when stderr is
    a terminal; small traces finish before it would show."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield update


def emit_reports(analysis: Analysis, request: ReportRequest) -> int:
    """Write every requested report; return the exit code (gates decide it)."""
    document = json_report.document(analysis)
    if request.json_path is not None:
        _write_text(request.json_path, json_report.dumps(document))
    if request.html_path is not None:
        from nsysfrag.reporters import html  # matplotlib is slow to import: only when asked

        _write_text(request.html_path, html.render(analysis))
    if request.png_dir is not None:
        from nsysfrag.reporters import png

        try:
            png.write_pngs(analysis, request.png_dir)
        except OSError as err:
            raise InputError(f"{request.png_dir}: cannot write plots ({err.strerror})") from None
    if request.csv_path is not None:
        try:
            csv_report.write(analysis, request.csv_path)
        except OSError as err:
            raise InputError(f"{request.csv_path}: cannot write ({err.strerror})") from None
    to_screen = not request.quiet and STDOUT not in (request.json_path, request.html_path)
    console = Console(width=int(os.environ.get("NSYSFRAG_WIDTH", "0")) or None, soft_wrap=False)
    if to_screen:
        terminal.render(analysis, console)
    code = 0
    if request.baseline is not None:
        comparison = compare(load_document(request.baseline), document)
        if to_screen:
            comparison_table.render(comparison, str(request.baseline), "this run", console)
        if request.fail_on_regression is not None:
            for line in comparison.regressions(request.fail_on_regression):
                click.echo(f"nsysfrag: {line}", err=True)
                code = EXIT_GATE
    for trip in evaluate(list(request.gates), document):
        click.echo(f"nsysfrag: {trip.message()}", err=True)
        code = EXIT_GATE
    if request.record:
        record_run(document, request)
    return code


def record_run(document: dict[str, Any], request: ReportRequest, rank: int | None = None) -> None:
    """Store the analysis in the history database and say under which run number."""
    run = RunRecord.from_document(
        document,
        Path(document["trace"]["path"]),
        label=request.label,
        tags=request.tags,
        capacity_override_bytes=request.capacity,
        rank=rank,
    )
    with open_store(request.db) as store:
        outcome = store.record(run)
        where = store.location
    whose = f"rank {rank}: " if rank is not None else ""
    if outcome.created:
        click.echo(f"nsysfrag: {whose}recorded as run {outcome.run_id} in {where}", err=True)
    else:
        click.echo(
            f"nsysfrag: {whose}already recorded as run {outcome.run_id} in {where} (same trace"
            " and analysis options); not recorded again",
            err=True,
        )

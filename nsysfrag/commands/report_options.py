"""The analysis and report options shared by ``analyze`` and ``profile``."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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

from nsysfrag.analysis import Analysis, analyze
from nsysfrag.checks.comparison import compare, load_document
from nsysfrag.checks.gates import Gate, evaluate, parse_gate
from nsysfrag.commands.output import STDOUT, check_output_paths, write_text
from nsysfrag.errors import EXIT_GATE, InputError
from nsysfrag.events import ProgressCallback
from nsysfrag.inputs import InputOptions, format_of
from nsysfrag.models.observed import DEFAULT_GRANULARITY
from nsysfrag.reporters import (
    REPORTERS,
    Reporter,
    comparison_table,
    json_report,
    reporter_for_suffix,
    terminal,
)

F = TypeVar("F", bound=Callable[..., Any])

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 10**6, "mb": 10**6,
          "mib": 1 << 20, "g": 10**9, "gb": 10**9, "gib": 1 << 30, "t": 10**12, "tb": 10**12,
          "tib": 1 << 40}


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

    reports: tuple[tuple[Reporter, Path], ...] = ()  # in REPORTERS order
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
        paths: dict[str, Path] = {}
        for r in REPORTERS:
            if (path := options.pop(_dest(r))) is not None:
                paths[r.name] = path
        output = options.pop("output")
        if output is not None:
            chosen = reporter_for_suffix(output)
            if chosen is None:
                kinds = " or ".join(r.suffixes[0] for r in REPORTERS if r.suffixes)
                raise InputError(f"{output}: unknown report format; use a {kinds} path with -o")
            paths.setdefault(chosen.name, output)
        baseline, regression = options.pop("baseline"), options.pop("fail_on_regression")
        if regression is not None and baseline is None:
            raise InputError("--fail-on-regression needs --baseline BASE.json to compare against")
        record, label, db = options.pop("record"), options.pop("label"), options.pop("db")
        raw_tags = options.pop("tags")
        if not record and (label is not None or raw_tags or db is not None):
            raise InputError("--label, --tag and --db go with --record (store this run in the history)")
        tags: tuple[tuple[str, str], ...] = ()
        if record:
            from nsysfrag.history import database_url, parse_tags  # only --record needs it

            tags = parse_tags(raw_tags)
            database_url(db)  # a malformed URL fails now, not after the analysis
        return cls(
            reports=tuple((r, paths[r.name]) for r in REPORTERS if r.name in paths),
            record=record,
            label=label,
            tags=tags,
            db=db,
            capacity=options.pop("capacity"),
            granularity=options.pop("granularity"),
            quiet=options.pop("quiet"),
            gates=tuple(parse_gate(g) for g in options.pop("fail_on")),
            baseline=baseline,
            fail_on_regression=regression,
        )

    def writes_to_stdout(self, text_only: bool = False) -> bool:
        """Whether a report (with ``text_only``, a text report) goes to stdout."""
        return any(p == STDOUT and (r.render or not text_only) for r, p in self.reports)


def _dest(r: Reporter) -> str:
    return f"{r.name}_path"


def report_options(f: F) -> F:
    """Decorate a command with the analysis and report options."""
    suffixes = ", ".join(x for r in REPORTERS for x in r.suffixes)
    options = [
        *(
            click.option(f"--{r.name}", _dest(r), type=click.Path(path_type=Path), help=r.help)
            for r in REPORTERS
        ),
        click.option("-o", "--output", "output", type=click.Path(path_type=Path),
                     help=f"Write a report whose format follows the suffix ({suffixes})."),
        click.option("--capacity", type=ByteSize(), default=None,
                     help="Device memory per space, overriding the trace's TARGET_INFO_GPU (e.g. 80GiB)."),
        click.option("--granularity", type=ByteSize(), default=DEFAULT_GRANULARITY, show_default=True,
                     help="Allocation rounding: a block's footprint is its size rounded up to this."),
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


def check_outputs(request: ReportRequest, source: Path) -> None:
    """Fail before any work when an output would clobber the input or cannot be written."""
    check_output_paths((p for r, p in request.reports if not r.folder), source)
    check_output_paths((p for r, p in request.reports if r.folder), source, folders=True)
    for r, path in request.reports:
        if r.folder and path.exists() and not path.is_dir():
            raise InputError(f"{path}: not a folder; --{r.name} takes a folder")
    if request.baseline is not None:
        load_document(request.baseline)  # fail now, not after a long analysis


def analyze_input(path: Path, request: ReportRequest) -> Analysis:
    """Read ``path`` with the input format that claims it and analyze every space."""
    fmt = format_of(path)
    # Loading compiled code takes a moment; SQLite reads without the GIL, so overlap them.
    warming = threading.Thread(target=fmt.warm_up, daemon=True) if fmt.warm_up else None
    if warming is not None:
        warming.start()
    with progress_bar() as progress:
        options = InputOptions(request.capacity, request.granularity, progress)
        recording = fmt.open(path, options)
        if warming is not None:
            warming.join()
        return analyze(recording, progress)


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


def emit_reports(analysis: Analysis, request: ReportRequest, source: Path) -> int:
    """Write every requested report of ``source`` (the file analyzed); return the exit code
    (gates decide it)."""
    document = json_report.document(analysis)
    for r, path in request.reports:
        if r.render is not None:
            write_text(path, r.renderer()(analysis))
            continue
        try:
            r.writer()(analysis, path)
        except OSError as err:
            raise InputError(f"{path}: cannot write ({err.strerror}); choose a writable path") from None
    to_screen = not request.quiet and not request.writes_to_stdout(text_only=True)
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
        record_run(document, request, source)
    return code


def record_run(document: dict[str, Any], request: ReportRequest, source: Path) -> None:
    """Store the analysis of ``source`` in the history database and say under which run
    number. The file itself, not the document's path: that is written for people, with the
    bytes of a name that is not UTF-8 escaped."""
    from nsysfrag.history import RunRecord, open_store

    run = RunRecord.from_document(
        document,
        source,
        label=request.label,
        tags=request.tags,
        capacity_override_bytes=request.capacity,
    )
    with open_store(request.db) as store:
        outcome = store.record(run)
        where = store.location
    if outcome.created:
        click.echo(f"nsysfrag: recorded as run {outcome.run_id} in {where}", err=True)
    else:
        click.echo(
            f"nsysfrag: already recorded as run {outcome.run_id} in {where} (same trace and"
            " analysis options); not recorded again",
            err=True,
        )

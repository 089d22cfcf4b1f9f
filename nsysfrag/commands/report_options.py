"""The analysis and report options shared by ``analyze`` and ``profile``."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

import click

from nsysfrag.analysis import DEFAULT_GRANULARITY, Analysis, analyze
from nsysfrag.checks.comparison import compare, load_document
from nsysfrag.checks.gates import Gate, evaluate, parse_gate
from nsysfrag.commands.feedback import feedback, say
from nsysfrag.commands.outputs import (
    STDOUT,
    Kept,
    Output,
    check_destinations,
    history_kept,
    report_console,
    write_text,
)
from nsysfrag.commands.params import ByteSize, Delta
from nsysfrag.errors import EXIT_GATE, InputError
from nsysfrag.history import RunRecord, database_url, open_store, parse_tags
from nsysfrag.inputs.nsys.reader import read_trace
from nsysfrag.models.observed import kernel as replay
from nsysfrag.reporters import comparison_table, csv_report, json_report, terminal

F = TypeVar("F", bound=Callable[..., Any])


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
    o_format: str | None = None  # "json" or "html" when -o named that report

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> ReportRequest:
        json_path, html_path, output = (
            options.pop("json_path"),
            options.pop("html_path"),
            options.pop("output"),
        )
        o_format = None
        if output is not None:
            o_format = _format_of(output)
            if (json_path if o_format == "json" else html_path) is not None:
                raise InputError(
                    f"-o {output} and --{o_format} both ask for the {o_format.upper()} report;"
                    " keep one"
                )
            if o_format == "json":
                json_path = output
            else:
                html_path = output
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
            o_format=o_format,
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

    def outputs(self) -> list[Output]:
        """Every output asked for, named by the option that asked."""
        named = (
            ("-o" if self.o_format == "json" else "--json", self.json_path),
            ("-o" if self.o_format == "html" else "--html", self.html_path),
            ("--csv", self.csv_path),
        )
        found = [Output(option, path) for option, path in named if path is not None]
        if self.png_dir is not None:
            found.append(Output("--png", self.png_dir, folder=True))
        return found

    def output(self, path: Path | None) -> Output:
        return next(o for o in self.outputs() if o.path == path)

    def uses_stdout(self) -> bool:
        return any(o.to_stdout for o in self.outputs())

    def to_screen(self) -> bool:
        """The terminal report is printed unless -q, or a report goes to stdout instead."""
        return not self.quiet and not self.uses_stdout()


def _format_of(output: Path) -> str:
    suffix = output.suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in (".html", ".htm"):
        return "html"
    if output == STDOUT:
        raise InputError("-o -: -o picks the format from the suffix; use --json - or --html -")
    raise InputError(f"-o {output}: unknown report format; use a .json or .html path with -o")


def report_options(f: F) -> F:
    """Decorate a command with the analysis and report options."""
    options = [
        click.option("--json", "json_path", type=click.Path(path_type=Path),
                     help="Write the JSON document here ('-' for stdout, which replaces the terminal report)."),
        click.option("-o", "--output", "output", type=click.Path(path_type=Path),
                     help="Write the report whose format the suffix names: .json or .html."),
        click.option("--csv", "csv_path", type=click.Path(path_type=Path),
                     help="Write the full-resolution timeline, one row per event ('-' for stdout)."),
        click.option("--capacity", type=ByteSize(), default=None,
                     help="Device memory per space, overriding the trace's TARGET_INFO_GPU (e.g. 80GiB)."),
        click.option("--granularity", type=ByteSize(), default=DEFAULT_GRANULARITY, show_default=True,
                     help="Allocation rounding: a block's footprint is its size rounded up to this."),
        click.option("--html", "html_path", type=click.Path(path_type=Path),
                     help="Write a self-contained HTML report (plots inline, works offline; '-' for stdout)."),
        click.option("--png", "png_dir", type=click.Path(path_type=Path),
                     help="Write six PNG plots per space into this folder (created if missing; its parent must exist)."),
        click.option("--fail-on", "fail_on", multiple=True, metavar="EXPR",
                     help="Exit 1 when any space meets EXPR, e.g. 'global_frag>0.3', 'health=critical'. Repeatable."),
        click.option("--baseline", type=click.Path(path_type=Path),
                     help="Compare with an earlier run's --json document."),
        click.option("--fail-on-regression", type=Delta(), default=None, metavar="DELTA",
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
    """Fail before any work when an output would clobber a file the run needs or has, or cannot
    be written, or when the baseline cannot be read."""
    kept = [Kept("the input trace", trace)]
    if request.baseline is not None:
        kept.append(Kept("the --baseline document", request.baseline))
    outputs = request.outputs()
    check_destinations(outputs, kept + history_kept(outputs, request.db))
    if request.baseline is not None:
        load_document(request.baseline)  # fail now, not after a long analysis


# What the first run after installing spends compiling (benchmarks/bench_startup.py, 2 cores).
REPLAY_COMPILE_S = 5


def analyze_sqlite(sqlite_path: Path, request: ReportRequest) -> Analysis:
    with feedback() as shown, shown.compiling("the replay kernels", REPLAY_COMPILE_S):
        # Loading the compiled replay takes a moment; SQLite reads without the GIL: overlap them.
        warming = threading.Thread(target=replay.warm_up, daemon=True)
        warming.start()
        trace = read_trace(sqlite_path, progress=shown.progress)
        warming.join()
        return analyze(
            trace,
            capacity_bytes=request.capacity,
            granularity_bytes=request.granularity,
            progress=shown.progress,
        )


def emit_reports(analysis: Analysis, request: ReportRequest) -> int:
    """Write every requested report; return the exit code (gates decide it)."""
    document = json_report.document(analysis)
    if request.json_path is not None:
        write_text(request.output(request.json_path), json_report.dumps(document))
    if request.html_path is not None:
        from nsysfrag.reporters import html  # matplotlib is slow to import: only when asked

        write_text(request.output(request.html_path), html.render(analysis))
    if request.png_dir is not None:
        from nsysfrag.reporters import png

        try:
            png.write_pngs(analysis, request.png_dir)
        except OSError as err:
            raise InputError(f"--png {request.png_dir}: cannot write plots ({err.strerror})") from None
    if request.csv_path is not None:
        destination: Path | TextIO = request.csv_path
        if request.csv_path == STDOUT:
            destination = sys.stdout
        try:
            csv_report.write(analysis, destination)
        except OSError as err:
            raise InputError(f"--csv {request.csv_path}: cannot write ({err.strerror})") from None
    to_screen = request.to_screen()
    console = report_console()
    if to_screen:
        terminal.render(analysis, console)
    code = 0
    if request.baseline is not None:
        comparison = compare(load_document(request.baseline), document)
        if to_screen:
            comparison_table.render(comparison, str(request.baseline), "this run", console)
        if request.fail_on_regression is not None:
            for line in comparison.regressions(request.fail_on_regression):
                say(line)
                code = EXIT_GATE
    for trip in evaluate(list(request.gates), document):
        say(trip.message())
        code = EXIT_GATE
    if request.record:
        record_run(document, request)
    return code


def record_run(document: dict[str, Any], request: ReportRequest) -> None:
    """Store the analysis in the history database and say under which run number."""
    run = RunRecord.from_document(
        document,
        Path(document["trace"]["path"]),
        label=request.label,
        tags=request.tags,
        capacity_override_bytes=request.capacity,
    )
    with open_store(request.db) as store:
        outcome = store.record(run)
        where = store.location
    if outcome.created:
        said = f"recorded as run {outcome.run_id} in {where}"
    elif outcome.updated:
        said = (
            f"already recorded as run {outcome.run_id} in {where} (same trace and analysis"
            f" options); updated its {_changes(outcome.updated, request.label)}"
        )
    else:
        said = (
            f"already recorded as run {outcome.run_id} in {where} (same trace and analysis"
            " options); not recorded again"
        )
    say(said)


def _changes(updated: tuple[str, ...], label: str | None) -> str:
    """``label ('nightly #413') and tags model=x, gpu=h100``."""
    parts = [f"label ({label!r})" for name in updated if name == "label"]
    tags = [name for name in updated if name != "label"]
    if tags:
        parts.append(f"tag{'s' if len(tags) > 1 else ''} {', '.join(tags)}")
    return " and ".join(parts)

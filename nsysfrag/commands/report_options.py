"""The analysis and report options shared by ``analyze`` and ``profile``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from nsysfrag import destinations
from nsysfrag.analysis import Analysis, analyze
from nsysfrag.checks.comparison import compare, load_document
from nsysfrag.checks.document_words import document_words, other_kinds, same_model
from nsysfrag.checks.gates import Gate, evaluate, parse_gate
from nsysfrag.commands.feedback import feedback, say, say_tripped
from nsysfrag.commands.outputs import (
    STDOUT,
    Kept,
    Output,
    check_destinations,
    report_console,
    write_text,
    write_with,
)
from nsysfrag.commands.params import ByteSize, Delta
from nsysfrag.errors import InputError
from nsysfrag.events import ProgressCallback
from nsysfrag.inputs import InputFormat, InputOptions, format_of
from nsysfrag.inputs.files import check_regular_file
from nsysfrag.models.observed import DEFAULT_GRANULARITY, DEFAULT_PAGE_BYTES
from nsysfrag.reporters import (
    REPORTERS,
    Reporter,
    comparison_table,
    json_report,
    reporter_for_suffix,
    terminal,
)

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ReportRequest:
    """What the user asked to compute and where to put it."""

    reports: tuple[tuple[Reporter, Path], ...] = ()  # in REPORTERS order
    capacity: int | None = None
    granularity: int = DEFAULT_GRANULARITY
    page_bytes: int = DEFAULT_PAGE_BYTES
    quiet: bool = False
    gates: tuple[Gate, ...] = ()
    baseline: Path | None = None
    fail_on_regression: float | None = None
    record: bool = False
    label: str | None = None
    tags: tuple[tuple[str, str], ...] = ()
    db: str | None = None
    o_format: str | None = None  # the name of the reporter -o chose

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> ReportRequest:
        paths: dict[str, Path] = {}
        for r in REPORTERS:
            if (path := options.pop(_dest(r))) is not None:
                paths[r.name] = path
        output = options.pop("output")
        o_format = None
        if output is not None:
            chosen = _reporter_for_output(output)
            if chosen.name in paths:
                raise InputError(
                    f"-o {output} and --{chosen.name} both ask for the {chosen.name.upper()}"
                    " report; keep one"
                )
            paths[chosen.name] = output
            o_format = chosen.name
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
            o_format=o_format,
            record=record,
            label=label,
            tags=tags,
            db=db,
            capacity=options.pop("capacity"),
            granularity=options.pop("granularity"),
            page_bytes=options.pop("page_bytes"),
            quiet=options.pop("quiet"),
            gates=tuple(parse_gate(g) for g in options.pop("fail_on")),
            baseline=baseline,
            fail_on_regression=regression,
        )

    def outputs(self) -> list[Output]:
        """Every output asked for, in REPORTERS order, named by the option that asked."""
        return [
            Output(
                "-o" if r.name == self.o_format else f"--{r.name}",
                path,
                folder=r.folder,
                stdout_ok=not r.folder,
            )
            for r, path in self.reports
        ]

    def uses_stdout(self) -> bool:
        return any(o.to_stdout for o in self.outputs())

    def to_screen(self) -> bool:
        """The terminal report is printed unless -q, or a report goes to stdout instead."""
        return not self.quiet and not self.uses_stdout()


def _dest(r: Reporter) -> str:
    return f"{r.name}_path"


def _reporter_for_output(output: Path) -> Reporter:
    """The format ``-o output`` asks for, from its suffix."""
    chosen = reporter_for_suffix(output)
    if chosen is not None:
        return chosen
    named = [r for r in REPORTERS if r.suffixes]
    if output == STDOUT:
        options = " or ".join(f"--{r.name} -" for r in named)
        raise InputError(f"-o -: -o picks the format from the suffix; use {options}")
    kinds = " or ".join(r.suffixes[0] for r in named)
    raise InputError(f"-o {output}: unknown report format; use a {kinds} path with -o")


def report_options(f: F) -> F:
    """Decorate a command with the analysis and report options."""
    suffixes = " or ".join(r.suffixes[0] for r in REPORTERS if r.suffixes)
    options = [
        *(
            click.option(f"--{r.name}", _dest(r), type=click.Path(path_type=Path), help=r.help)
            for r in REPORTERS
        ),
        click.option("-o", "--output", "output", type=click.Path(path_type=Path),
                     help=f"Write the report whose format the suffix names: {suffixes}."),
        click.option("--capacity", type=ByteSize(), default=None,
                     help="Device memory per space, overriding the trace's TARGET_INFO_GPU (e.g. 80GiB)."),
        click.option("--granularity", type=ByteSize(), default=DEFAULT_GRANULARITY, show_default=True,
                     help="Allocation rounding: a block's footprint is its size rounded up to this."),
        click.option("--page-size", "page_bytes", type=ByteSize(), default=DEFAULT_PAGE_BYTES,
                     show_default=True,
                     help="The driver's page (nsys traces): a page is resident while a block"
                     " touches it, and its free bytes are stranded."),
        click.option("--fail-on", "fail_on", multiple=True, metavar="EXPR",
                     help="Exit 1 when any space meets EXPR, e.g. 'global_frag>0.3', 'health=critical',"
                     " 'memory_peak.reserved_bytes>70GiB' (the moment of most reserved memory;"
                     " peak. is the worst fragmentation), 'ooms.count>0': any numeric key of the"
                     " JSON (listed below). Repeatable."),
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


def check_outputs(
    request: ReportRequest,
    source: Path | None,
    exports: Sequence[Path] = (),
    made_here: Sequence[Output] = (),
) -> None:
    """Fail before any work when an output would clobber a file the run needs or has, or cannot
    be written, or when the baseline cannot be read. ``source`` is the input, ``exports``
    where its export (of a report) may go; ``made_here`` are the files nsys writes in this run
    (``profile``'s recording and its export), outputs like the reports."""
    kept = [Kept("the input trace", source)] if source is not None else []
    kept += [Kept("the export of the input report", p, destinations.NSYS_EXPORT) for p in exports]
    if request.baseline is not None:
        kept.append(Kept("the --baseline document", request.baseline))
    outputs = [*request.outputs(), *made_here]
    check_destinations(outputs, kept, request.db, recording=request.record)
    if request.baseline is not None:
        baseline = load_document(request.baseline)  # fail now, not after a long analysis
        check_regular_file(source)  # recognising the format may read it: never a FIFO
        words, fmt = document_words(baseline), format_of(source)
        if words.input != fmt.name:
            names = (f"--baseline {request.baseline}", str(source))
            raise InputError(other_kinds(names, (f"an analysis of {words.description}", fmt.description)))


def analyze_input(path: Path, request: ReportRequest, *, interactive: bool = True) -> Analysis:
    """Read ``path`` with the input format that claims it and analyze every space, with a bar
    per phase and a notice while kernels compile (commands.feedback); ``interactive=False``
    (a job's worker) shows nothing: the coordinator's line says how the job goes."""
    fmt = format_of(path)
    if not interactive:
        return _read_and_analyze(fmt, path, request, None)
    with feedback() as shown, shown.compiling("the replay kernels"):
        return _read_and_analyze(fmt, path, request, shown.progress)


def _read_and_analyze(
    fmt: InputFormat, path: Path, request: ReportRequest, progress: ProgressCallback | None
) -> Analysis:
    # Loading compiled code takes a moment; SQLite reads without the GIL, so overlap them.
    warming = None
    if fmt.warm_up is not None:
        warming = threading.Thread(target=fmt.warm_up, args=(path,), daemon=True)
        warming.start()
    options = InputOptions(request.capacity, request.granularity, request.page_bytes, progress)
    recording = fmt.open(path, options)
    if warming is not None:
        warming.join()
    return analyze(recording, progress)


def emit_reports(analysis: Analysis, request: ReportRequest, source: Path) -> int:
    """Write every requested report of ``source`` (the file analyzed); return the exit code
    (gates decide it)."""
    document = json_report.document(analysis)
    for (r, _), output in zip(request.reports, request.outputs(), strict=True):
        if r.render is not None:
            write_text(output, r.renderer()(analysis))
        elif r.folder:
            r.writer()(analysis, output.path)  # it writes each file through destinations
        else:
            writer = r.writer()
            write_with(output, lambda stream: writer(analysis, stream))  # noqa: B023
    to_screen = request.to_screen()
    console = report_console()
    if to_screen:
        terminal.render(analysis, console)
    code = 0
    if request.baseline is not None:
        names = (str(request.baseline), "this run")
        baseline = load_document(request.baseline)
        # This run in full (every site listed): only the baseline had to be kept small.
        current = json_report.document(analysis, sites_listed=None)
        same_model(baseline, current, names)
        comparison = compare(baseline, current, names)
        if to_screen:
            comparison_table.render(comparison, *names, console)
        if request.fail_on_regression is not None:
            code = say_tripped(comparison.regressions(request.fail_on_regression))
    code = say_tripped(t.message() for t in evaluate(list(request.gates), document)) or code
    if request.record:
        record_run(document, request, source)
    return code


def record_run(
    document: dict[str, Any], request: ReportRequest, source: Path, rank: int | None = None
) -> None:
    """Store the analysis of ``source`` (``rank`` of a job) in the history database and say
    under which run number. The file itself, not the document's path: that is written for
    people, with the bytes of a name that is not UTF-8 escaped."""
    from nsysfrag.history import RunRecord, open_store

    run = RunRecord.from_document(
        document,
        source,
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
    say(whose + said)


def _changes(updated: tuple[str, ...], label: str | None) -> str:
    """``label ('nightly #413') and tags model=x, gpu=h100``."""
    parts = [f"label ({label!r})" for name in updated if name == "label"]
    tags = [name for name in updated if name != "label"]
    if tags:
        parts.append(f"tag{'s' if len(tags) > 1 else ''} {', '.join(tags)}")
    return " and ".join(parts)

"""One input analyzed and reported: a report exported first (``export_report``), the input
read and analyzed (``analyze_input``; ``analyze_argument`` does both for any TRACE argument),
and every requested report written, the baseline compared, the gates evaluated and the run
recorded (``emit_reports``). A single-input ``analyze`` and each rank of a job go through
``analyze_argument``."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.live import Live
from rich.text import Text

from nsysfrag.analysis import Analysis, analyze
from nsysfrag.checks.comparison import compare, load_document
from nsysfrag.checks.document_words import same_model
from nsysfrag.checks.gates import evaluate
from nsysfrag.errors import InputError, NsysError
from nsysfrag.events import ProgressCallback
from nsysfrag.inputs import InputFormat, InputOptions, format_of
from nsysfrag.inputs.files import check_input_file, check_regular_file
from nsysfrag.inputs.nsys import TRACE_FILE, is_report
from nsysfrag.pipeline.feedback import feedback, say, say_tripped
from nsysfrag.pipeline.feedback import say as say_line
from nsysfrag.pipeline.outputs import report_console, stderr_console, write_text, write_with
from nsysfrag.pipeline.request import ExportOptions, ReportRequest, check_outputs
from nsysfrag.printable import printable
from nsysfrag.reporters import comparison_table, json_report, shared_figures, terminal

if TYPE_CHECKING:
    from nsysfrag.inputs.nsys.runner import Nsys

_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def analyze_argument(
    trace: Path,
    request: ReportRequest,
    export: ExportOptions,
    *,
    interactive: bool = True,
    say: Callable[[str], None] | None = None,
) -> tuple[Analysis, Path]:
    """The analysis of one TRACE argument of any kind (a report is exported first), and the
    file it read: the report's export, else ``trace``. A single-input run and each rank of a
    job go through here.

    ``interactive=False`` (a job's worker) shows no progress, and ``say`` receives the notes
    that would go to stderr.
    """
    check_regular_file(trace)  # before anything opens it: a FIFO would block the open
    if is_report(trace):
        trace = export_report(
            trace, export.nsys_path, export.cache_dir, export.reexport,
            say=say, interactive=interactive, nsys_timeout=export.nsys_timeout,
        )
        check_outputs(request, trace)
    elif export.reexport or export.cache_dir is not None:
        raise InputError(
            f"{trace}: --reexport and --cache-dir apply to .nsys-rep reports, not to"
            f" {format_of(trace).description}; analyze it without them"
        )
    return analyze_input(trace, request, interactive=interactive), trace


def export_report(
    report: Path,
    nsys_path: str | None,
    cache_dir: Path | None,
    reexport: bool,
    *,
    say: Callable[[str], None] | None = None,
    interactive: bool = True,
    nsys_timeout: float | None = None,
) -> Path:
    """The SQLite export of ``report``: reused when fresh, else written by nsys."""
    check_input_file(
        report, expected="pass an nsys report (.nsys-rep) or its .sqlite", directory=TRACE_FILE
    )
    from nsysfrag.inputs.nsys import runner as nsys  # only a report needs the nsys runner

    say = say or note
    if cache_dir is not None:
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise InputError(f"--cache-dir {cache_dir}: cannot create it ({err.strerror})") from None
    plan = nsys.plan_export(report, cache_dir, reexport)
    if plan.avoided is not None:
        say(f"{plan.avoided} was not exported from {report.name}; leaving it alone and"
             f" using {plan.path.name}")
    if plan.reusable:
        say(f"using {plan.path}, exported earlier from {report.name} (--reexport to redo it)")
        return plan.path
    if not os.access(plan.path.parent, os.W_OK):
        raise InputError(
            f"{plan.path.parent}: not writable, so the export of {report.name} cannot go there;"
            " pass --cache-dir DIR"
        )
    try:
        tool = locate_nsys(nsys_path, say, nsys_timeout)
    except NsysError as err:
        # The report may have come from a machine that has nsys: exporting there also works.
        raise NsysError(
            f"{err}; or run `nsys export --type sqlite {report}` where nsys is installed and"
            " analyze the .sqlite"
        ) from None
    with phase(f"exporting {report.name}") if interactive else nullcontext():
        return nsys.export_sqlite(tool, report, plan.path)


def exports_of(trace: Path, cache_dir: Path | None) -> list[Path]:
    """Where a report's export may go (none for any other input): files no output replaces."""
    if not is_report(trace):
        return []
    from nsysfrag.inputs.nsys.runner import export_candidates

    return list(export_candidates(trace, cache_dir))


def locate_nsys(
    explicit: str | None,
    say: Callable[[str], None] | None = None,
    timeout_s: float | None = None,
) -> Nsys:
    """Find nsys and say which one (and which version) does the work; ``timeout_s`` bounds
    each of its commands (--nsys-timeout)."""
    from nsysfrag.inputs.nsys import runner as nsys

    tool = nsys.nsys_version(nsys.find_nsys(explicit), timeout_s)
    (say or note)(f"using {tool.version} ({tool.path})")
    return tool


def note(message: str) -> None:
    say_line(message)


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@dataclass(frozen=True)
class _PhaseLine:
    """A spinner, the phase and its elapsed time, computed afresh at every refresh."""

    label: str
    started: float = field(default_factory=time.monotonic)

    def __rich__(self) -> Text:
        elapsed = time.monotonic() - self.started
        frame = _SPINNER[int(elapsed * 10) % len(_SPINNER)]
        label = printable(self.label)
        return Text.assemble((f"{frame} ", "cyan"), (label, "bold"), f"  {clock(elapsed)}")


@contextmanager
def phase(label: str) -> Iterator[None]:
    """A transient status line on stderr while the block runs; nothing unless it is a terminal."""
    console = stderr_console()
    if not console.is_terminal:
        yield
        return
    with Live(_PhaseLine(label), console=console, transient=True, refresh_per_second=8):
        yield


def analyze_input(path: Path, request: ReportRequest, *, interactive: bool = True) -> Analysis:
    """Read ``path`` with the input format that claims it and analyze every space, with a bar
    per phase and a notice while kernels compile (pipeline.feedback); ``interactive=False``
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
    # --html and --png draw the same figures: build each once (shared_figures).
    drawing = {r.name for r, _ in request.reports} >= {"html", "png"}
    with shared_figures.sharing(drawing):
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

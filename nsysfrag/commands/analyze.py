"""``nsysfrag analyze TRACE``, and the nsys plumbing ``profile`` shares with it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.live import Live
from rich.text import Text

from nsysfrag import limits
from nsysfrag.analysis import Analysis
from nsysfrag.checks.keys import key_list
from nsysfrag.commands.feedback import say as say_line
from nsysfrag.commands.outputs import stderr_console
from nsysfrag.commands.params import Seconds
from nsysfrag.commands.report_options import (
    ReportRequest,
    analyze_input,
    check_outputs,
    emit_reports,
    report_options,
)
from nsysfrag.errors import InputError, NsysError
from nsysfrag.inputs import format_of
from nsysfrag.inputs.files import check_input_file, check_regular_file
from nsysfrag.inputs.nsys import TRACE_FILE, is_report
from nsysfrag.job.command import job_options
from nsysfrag.job.inputs import is_job
from nsysfrag.printable import printable

if TYPE_CHECKING:
    from nsysfrag.inputs.nsys.runner import Nsys

_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def nsys_option(f: Any) -> Any:
    """``--nsys PATH`` and ``--nsys-timeout SECONDS``."""
    f = click.option(
        "--nsys-timeout", "nsys_timeout", type=Seconds(limits.NSYS_EXPORT_S), metavar="SECONDS",
        envvar=limits.NSYS_EXPORT_S.env, show_envvar=True,
        help=f"The longest one nsys command may run: an export (default"
        f" {limits.NSYS_EXPORT_S.default:g} s); given, it also ends a recording (nsys stops the"
        " program and writes its report). nsys is killed with its helpers past it.",
    )(f)
    return click.option(
        "--nsys", "nsys_path", metavar="PATH",
        help="The nsys to run (default: $NSYS, then PATH, then /opt/nvidia/nsight-systems/*/bin"
        " and /usr/local/cuda*/bin, newest first).",
    )(f)


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """How a .nsys-rep becomes the SQLite export that is analyzed."""

    nsys_path: str | None = None
    cache_dir: Path | None = None
    reexport: bool = False
    nsys_timeout: float | None = None  # --nsys-timeout; None: limits.NSYS_EXPORT_S


@click.command(
    "analyze",
    epilog="Gate and trend keys (--fail-on, history --trend/--metric): every numeric key of a"
    " space of the JSON, as a dotted path; a bare per-event name means its max, else its peak"
    " value, else a count; a list counts as PATH.count: " + key_list() + ".",
)
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path),
                metavar="TRACE...")
@report_options
@nsys_option
@click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Put the SQLite export of a .nsys-rep here instead of beside the report.")
@click.option("--reexport", is_flag=True,
              help="Export a .nsys-rep again even when an export newer than it exists.")
@job_options
def analyze_command(
    traces: tuple[Path, ...],
    nsys_path: str | None,
    nsys_timeout: float | None,
    cache_dir: Path | None,
    reexport: bool,
    jobs: int | None,
    scheduler: str | None,
    scheduler_file: Path | None,
    rank_pattern: str | None,
    **options: Any,
) -> None:
    """Replay a trace's device allocations and report how fragmented memory got.

    TRACE is the SQLite export of an nsys report (`nsys export --type sqlite`), or the report
    itself (.nsys-rep): then nsys exports it to X.sqlite beside it on first use, and later runs
    reuse that export while it is newer than the report. A PyTorch memory snapshot (.pickle from
    torch.cuda.memory._dump_snapshot) is analyzed in the pytorch-segments model.

    Several TRACEs, a folder or a glob make a job: one input per rank (the rank comes from the
    file name, e.g. rank3.sqlite or snapshot_3.pickle, else from the order given), each analyzed
    as it would be alone, on a process pool (--jobs) or a Dask cluster (--scheduler), and one
    report for the whole job.

    Examples:

    \b
        nsysfrag analyze run.sqlite
        nsysfrag analyze run.sqlite --json run.json --csv timeline.csv --html run.html
        nsysfrag analyze run.nsys-rep --cache-dir ~/.cache/nsysfrag
        nsysfrag analyze snap.pickle --capacity 80GiB --html snap.html
        nsysfrag analyze run.sqlite -q --fail-on "global_frag>0.30" --fail-on "health=critical"
        nsysfrag analyze snap.pickle -q --fail-on "memory_peak.reserved_bytes>70GiB"
        nsysfrag analyze 'runs/rank%q{RANK}.nsys-rep' --html job.html --json job.json
    """
    request = ReportRequest.from_options(options)
    export = ExportOptions(nsys_path, cache_dir, reexport, nsys_timeout)
    if is_job(traces):
        from nsysfrag.job.command import JobOptions, run_job

        job = JobOptions(jobs, scheduler, scheduler_file, rank_pattern)
        code = run_job(traces, request, export, job)
    else:
        (trace,) = traces
        check_outputs(request, trace, exports_of(trace, cache_dir))
        analysis, analyzed = analyze_argument(trace, request, export)
        code = emit_reports(analysis, request, analyzed)
    if code:
        raise click.exceptions.Exit(code)


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

"""``nsysfrag analyze TRACE...``: one input or a job, each through ``pipeline.single``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from nsysfrag import limits
from nsysfrag.checks.keys import key_list
from nsysfrag.commands.params import Seconds
from nsysfrag.commands.report_options import report_options
from nsysfrag.job.command import job_options
from nsysfrag.job.inputs import is_job
from nsysfrag.pipeline.request import ExportOptions, ReportRequest, check_outputs
from nsysfrag.pipeline.single import analyze_argument, emit_reports, exports_of


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



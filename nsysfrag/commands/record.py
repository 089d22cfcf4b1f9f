"""``nsysfrag record -- COMMAND...``: run a PyTorch job with the recorder in each of its
Python processes, watch it live, then analyze the record folder as a job."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import click

from nsysfrag.commands.profile import check_program
from nsysfrag.commands.report_options import report_options
from nsysfrag.errors import InputError
from nsysfrag.limits import RECORD_GRACE_S
from nsysfrag.pipeline.feedback import say
from nsysfrag.pipeline.request import ReportRequest
from nsysfrag.printable import printable
from nsysfrag.record.bootstrap.nsysfrag_recorder.options import MIN_INTERVAL_S, STACKS, Options

DEFAULT_OUT = Path("nsysfrag-record")


@click.command("record", context_settings={"allow_interspersed_args": False})
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=DEFAULT_OUT,
              show_default=True, help="The record folder (one rank{R} folder per rank).")
@click.option("--overwrite", is_flag=True, help="Replace the record already in the folder.")
@click.option("--entries", type=click.IntRange(min=1), default=100_000, show_default=True,
              metavar="N", help="Allocation history each process keeps (PyTorch's ring buffer).")
@click.option("--stacks", type=click.Choice(STACKS), default="python", show_default=True,
              help="The stack recorded with each allocation: Python frames, also C++ frames,"
              " or none.")
@click.option("--interval", "interval_s", type=click.FloatRange(min=MIN_INTERVAL_S),
              default=5.0, show_default=True, metavar="SECONDS",
              help="Sample memory_stats() and mem_get_info() this often (1 s at the least).")
@click.option("--state-every", type=click.IntRange(min=1), default=12, show_default=True,
              metavar="K", help="Rate a state snapshot every K samples, and whenever reserved"
              " memory or the memory free inside it moved (within --state-budget).")
@click.option("--state-budget", type=click.FloatRange(min=0.0001, max=1.0), default=0.01,
              show_default=True, metavar="SHARE",
              help="The share of the run's time state snapshots may take (each costs more the"
              " longer the history).")
@click.option("--max-oom-snapshots", type=click.IntRange(min=0), default=8, show_default=True,
              metavar="N", help="Snapshots kept per process for its first N out-of-memory errors.")
@click.option("--alert-command", metavar="CMD",
              help="Run CMD (in the shell) for each alert, the alert as JSON on its stdin.")
@click.option("--try", "tries", multiple=True, metavar="KEY:VALUE",
              help="Run COMMAND as given (the baseline), then once with this"
              " PYTORCH_CUDA_ALLOC_CONF option added (each in OUTPUT/KEY=VALUE/), and compare"
              " peak memory, OOMs and time with the baseline and with whatif's prediction;"
              " 'auto' tries what whatif suggests on the baseline. Repeatable.")
@click.option("--duration", "duration_s", type=click.FloatRange(min=0, min_open=True),
              metavar="SECONDS", help="With --try: end each run after SECONDS as a SIGTERM"
              " would (its final snapshots written).")
@click.option("--repeat", "repeats", type=click.IntRange(min=1), default=1, show_default=True,
              metavar="N", help="With --try: run the whole round N times, to weigh gains"
              " against the run-to-run spread.")
@report_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def record_command(
    out: Path,
    overwrite: bool,
    entries: int,
    stacks: str,
    interval_s: float,
    state_every: int,
    state_budget: float,
    max_oom_snapshots: int,
    alert_command: str | None,
    tries: tuple[str, ...],
    duration_s: float | None,
    repeats: int,
    command: tuple[str, ...],
    **options: Any,
) -> None:
    """Run COMMAND with a recorder in each of its Python processes, then analyze what it wrote.

    Every process that initializes CUDA (python train.py, torchrun --nproc_per_node=N, accelerate
    launch, deepspeed) records its allocation history, writes a snapshot at each out-of-memory
    error and at exit, with the device's size beside it, and is sampled every --interval
    seconds; a rated metric crossing a health level is an alert. Neither nsys nor a change to
    the program is needed. The exit code is COMMAND's (a --fail-on gate can turn 0 into 1).

    Examples:

    \b
        nsysfrag record -- torchrun --nproc_per_node=8 train.py
        nsysfrag record -o runs/oom --interval 2 --alert-command 'notify.sh' -- python train.py
        nsysfrag analyze runs/oom --html oom.html
        nsysfrag record -o runs/try --try expandable_segments:True --duration 120 -- python train.py
    """
    from nsysfrag.record import launch, layout
    from nsysfrag.record.watch import Rater, Watch

    # -o names the record folder here, so the report options' -o/--output is not offered; nor
    # are a single input's reports (--csv, --png): the record is analyzed as a job.
    request = ReportRequest.from_options({**options, **dict.fromkeys(NOT_OFFERED)})
    recorder_options = Options(
        entries=entries, stacks=stacks, interval_s=interval_s, state_every=state_every,
        state_budget=state_budget, max_oom_snapshots=max_oom_snapshots,
    )  # fmt: skip
    if tries or duration_s is not None or repeats != 1:
        from nsysfrag.commands.record_try import TryRequest, run_try

        if not tries:
            raise InputError("--duration and --repeat go with --try (a round of settings)")
        code = run_try(command, out, request, TryRequest(
            tries, duration_s, repeats, overwrite, alert_command), recorder_options)  # fmt: skip
        if code:
            raise click.exceptions.Exit(code)
        return
    check_program(command)
    _check_outputs(request, out)
    layout.prepare(out, command, recorder_options.as_dict(), overwrite)
    started = time.time_ns()
    watch = Watch(out, interval_s, Rater(started, say, alert_command))
    watch.start()
    try:
        outcome = launch.run(
            command,
            launch.command_environment(out, recorder_options),
            stdout=2 if request.uses_stdout() else None,
        )
    except InputError as err:  # the command could not start: the record says so
        layout.update_marker(out, status="not started", ended_unix_ns=time.time_ns(),
                             error=str(err))  # fmt: skip
        raise
    finally:
        watch.stop()
    layout.update_marker(
        out, status="ended", ended_unix_ns=time.time_ns(), exit_code=outcome.exit_code,
        signal=outcome.signal,
    )  # fmt: skip
    program_code = outcome.exit_code
    if outcome.signal is not None and outcome.returncode == -signal.SIGKILL:
        say(f"{signal.Signals(outcome.signal).name} received; the command ignored it for"
            f" {RECORD_GRACE_S.value():g} s and was killed (SIGKILL), analyzing what it recorded"
            f" in {out}")
    elif outcome.signal is not None:
        say(f"{signal.Signals(outcome.signal).name} received; the command stopped, analyzing what"
            f" it recorded in {out}")
    code = _analyze(out, request)
    if program_code != 0:
        say(f"the command exited with code {program_code}")
        code = program_code
    elif outcome.signal is not None:
        code = 128 + outcome.signal
    if code:
        raise click.exceptions.Exit(code)


# The report options define -o/--output (a report named by suffix); here -o is the folder.
NOT_OFFERED = ("output", "csv_path", "png_path")
record_command.params = [p for p in record_command.params if p.name not in NOT_OFFERED]


def _check_outputs(request: ReportRequest, out: Path) -> None:
    """Before the command starts: every report can be written and replaces nothing of the
    record's, and a --baseline is a job's document (the record is analyzed as a job)."""
    from nsysfrag.pipeline.outputs import Kept, check_destinations
    from nsysfrag.checks.job_comparison import load_job_document

    kept = [Kept("the record folder", out)]
    if request.baseline is not None:
        kept.append(Kept("the --baseline document", request.baseline))
        load_job_document(request.baseline)
    check_destinations(request.outputs(), kept, request.db)


def _analyze(out: Path, request: ReportRequest) -> int:
    """The job report of the record folder; 0 with a line saying why when nothing was
    recorded."""
    from nsysfrag.pipeline.request import ExportOptions
    from nsysfrag.job.command import JobOptions, run_job
    from nsysfrag.record.layout import rank_folders
    from nsysfrag.record.why import nothing_recorded

    if not any(r.snapshot is not None for r in rank_folders(out)):
        why = nothing_recorded(out)
        # A line that names nsysfrag record itself ("nsysfrag record needs torch ≥ 2.1") stands
        # as it is.
        if why.startswith("nsysfrag record "):
            click.echo(printable(why), err=True)
        else:
            say(why)
        return 0
    return run_job([out], request, ExportOptions(), JobOptions())

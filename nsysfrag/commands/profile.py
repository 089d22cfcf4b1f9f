"""``nsysfrag profile -- COMMAND...``: record with nsys, export, analyze."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from nsysfrag.commands.analyze import nsys_option
from nsysfrag.commands.report_options import report_options
from nsysfrag.errors import InputError
from nsysfrag.inputs.nsys import runner as nsys
from nsysfrag.pipeline.outputs import Output
from nsysfrag.pipeline.request import ReportRequest, check_outputs
from nsysfrag.pipeline.single import analyze_input, clock, emit_reports, locate_nsys, note, phase

TORCH_WARNING = (
    "recorded with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (--torch-tensors): every tensor was its own"
    " cudaMalloc, so this layout is not the one PyTorch's caching allocator makes in normal runs"
)


@click.command("profile", context_settings={"allow_interspersed_args": False})
@click.option("-o", "--output-prefix", "prefix", type=click.Path(path_type=Path),
              help="Write PREFIX.nsys-rep and PREFIX.sqlite (default: nsysfrag-<date>-<time>"
              " in the current folder).")
@nsys_option
@click.option("--backtrace", is_flag=True,
              help="Record a stack for every allocation call (and a Python stack for Python"
              " programs).")
@click.option("--capture-range", type=click.Choice(nsys.CAPTURE_RANGES),
              help="Record only inside cudaProfilerStart/Stop or an NVTX range (nsys"
              " --capture-range).")
@click.option("--nsys-arg", "nsys_args", multiple=True, metavar="ARG",
              help="Pass ARG on to `nsys profile` (repeatable), e.g. --nsys-arg=--sample=none.")
@click.option("--torch-tensors", is_flag=True,
              help="Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so every tensor is a real"
              " allocation.")
@report_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def profile_command(
    prefix: Path | None,
    nsys_path: str | None,
    nsys_timeout: float | None,
    backtrace: bool,
    capture_range: str | None,
    nsys_args: tuple[str, ...],
    torch_tensors: bool,
    command: tuple[str, ...],
    **options: Any,
) -> None:
    """Run COMMAND under nsys with allocation tracking, export the report, and analyze it.

    The program's output streams through as usual. If it exits non-zero, the report is still
    produced from what nsys recorded and its exit code becomes nsysfrag's. Ctrl-C stops the
    recording: nsys finishes its report, and that is analyzed.

    Examples:

    \b
        nsysfrag profile -- python train.py --steps 50
        nsysfrag profile -o runs/exp1 --json runs/exp1.json -- ./my_cuda_app
    """
    # -o names the recording here, so the report options' -o/--output alias is not offered.
    request = ReportRequest.from_options({**options, "output": None})
    check_program(command)
    plan = nsys.ProfilePlan(
        command=command,
        prefix=_prefix(prefix),
        backtrace=backtrace,
        capture_range=capture_range,
        extra_args=nsys_args,
        torch_tensors=torch_tensors,
    )
    recording = [
        Output("-o", plan.report, stdout_ok=False),
        Output("-o", plan.export, stdout_ok=False),
    ]
    check_outputs(request, None, made_here=recording)
    tool = locate_nsys(nsys_path, timeout_s=nsys_timeout)
    nsys.require_memory_tracking(tool)

    outcome = _record(tool, plan, request)
    failed = outcome.returncode != 0 and outcome.signal is None
    if outcome.report is None:
        if outcome.signal is not None:
            note(f"{signal.Signals(outcome.signal).name} received; nsys stopped before writing"
                 f" {plan.report}, nothing to analyze")
            raise click.exceptions.Exit(128 + outcome.signal)
        raise outcome.failure(plan)
    if outcome.signal is not None:
        note(f"{signal.Signals(outcome.signal).name} received; nsys stopped recording,"
             " analyzing what it wrote")
    elif outcome.timed_out:
        note(f"--nsys-timeout ({nsys_timeout:g} s) stopped the recording; analyzing what nsys"
             " wrote")

    try:
        with phase(f"exporting {plan.report.name}"):
            nsys.export_sqlite(tool, plan.report, plan.export)
        analysis = analyze_input(plan.export, request)
        if torch_tensors:
            analysis.warnings.append(TORCH_WARNING)
        code = emit_reports(analysis, request, plan.export)
    finally:
        # Said last, so it is the line the user sees, and said even if the analysis failed.
        if failed:
            note(f"the profiled program exited with code {_exit_code(outcome.returncode)}"
                 " (the report covers what nsys recorded until then)")
    if outcome.signal is not None:
        code = 128 + outcome.signal
    elif failed:
        code = _exit_code(outcome.returncode)
    if code:
        raise click.exceptions.Exit(code)


# The report options define -o/--output (a report named by suffix); here -o is the prefix.
profile_command.params = [p for p in profile_command.params if p.name != "output"]


def _prefix(prefix: Path | None) -> Path:
    if prefix is None:
        return Path(datetime.now().strftime("nsysfrag-%Y%m%d-%H%M%S"))
    if "%" in str(prefix):
        # nsys would expand %p, %h, %q{VAR}...; we must know the report's name to export it.
        raise InputError(f"-o {prefix}: nsys % patterns are not supported; give a plain prefix")
    if prefix.name.endswith(".nsys-rep"):
        prefix = prefix.with_name(prefix.name[: -len(".nsys-rep")])
    try:
        prefix.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"-o {prefix}: cannot create {prefix.parent} ({err.strerror})") from None
    return prefix


def check_program(command: tuple[str, ...]) -> None:
    # Caught here in a line, rather than after nsys has started up and failed to launch it.
    program = command[0]
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise InputError(f"{program}: not an executable file; check the command after --")
    elif shutil.which(program) is None:
        raise InputError(f"{program}: command not found on PATH; check the command after --")


def _record(tool: nsys.Nsys, plan: nsys.ProfilePlan, request: ReportRequest) -> nsys.ProfileOutcome:
    interactive = sys.stderr.isatty()
    if interactive:
        # No live status line here: the program owns the terminal and would garble it.
        note(f"recording {os.path.basename(plan.command[0])} into {plan.report}"
             " (its output follows)")
    started = time.monotonic()
    outcome = nsys.run_profile(
        tool,
        plan,
        # stdout carries the report only: with --json - the program's output goes to stderr.
        stdout=2 if request.uses_stdout() else None,
        # On a terminal stderr stays the program's own (colours, progress bars) and nsys's
        # messages are on screen; elsewhere it is relayed so a failure can quote nsys's words.
        stderr_sink=None if interactive else _write_stderr,
    )
    if interactive:
        note(f"recorded in {clock(time.monotonic() - started)}")
    return outcome


def _write_stderr(chunk: bytes) -> None:
    stream = sys.stderr
    stream.flush()
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:
        buffer.write(chunk)
        buffer.flush()
    else:
        stream.write(chunk.decode(errors="replace"))
        stream.flush()


def _exit_code(returncode: int) -> int:
    # A negative code is a death by signal; shells report that as 128 + the signal number.
    return returncode if returncode > 0 else 128 - returncode

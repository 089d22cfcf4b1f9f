"""``nsysfrag analyze`` on several inputs: run the ranks, then report, gate and record the job.

Exit code: 2 (or 3 when nsys was missing) when a rank could not be analyzed — after the others
are reported; else 1 when a gate or a regression tripped on any rank; else 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.live import Live
from rich.text import Text

from nsysfrag.errors import InputError
from nsysfrag.inputs.nsys import is_report
from nsysfrag.job.inputs import RankInput, job_inputs
from nsysfrag.job.worker import RankOutcome, RankTask
from nsysfrag.pipeline.request import ExportOptions, ReportRequest

F = TypeVar("F", bound=Callable[..., Any])
# The reports of a whole job (every other report is one input's: analyze that rank alone).
JOB_REPORTS = ("json", "html")


def job_options(f: F) -> F:
    """The options that run a job (several inputs) in parallel."""
    options = [
        click.option("--jobs", "-j", "jobs", type=click.IntRange(min=1), default=None,
                     metavar="N",
                     help="With several inputs: analyze N ranks at a time in local processes"
                     " (default: as many as cores and memory allow; 1 runs them one by one)."),
        click.option("--scheduler", metavar="ADDRESS",
                     help="With several inputs: run the ranks on this dask.distributed scheduler"
                     " (default $DASK_SCHEDULER_ADDRESS); workers read the inputs by path."),
        click.option("--scheduler-file", type=click.Path(path_type=Path), metavar="PATH",
                     help="With several inputs: the Dask scheduler named in this file"
                     " (dask scheduler --scheduler-file)."),
        click.option("--rank-pattern", metavar="REGEX",
                     help="With several inputs: read each rank from its path with this regular"
                     r" expression's group, e.g. 'node\d+/gpu(\d+)'."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@dataclass(frozen=True, slots=True)
class JobOptions:
    jobs: int | None = None
    scheduler: str | None = None
    scheduler_file: Path | None = None
    rank_pattern: str | None = None

    def cluster(self) -> tuple[str | None, Path | None]:
        """The Dask scheduler to use, if any: the options, else $DASK_SCHEDULER_ADDRESS."""
        from nsysfrag.job.cluster import ENV_ADDRESS

        if self.scheduler is not None and self.scheduler_file is not None:
            raise InputError("--scheduler and --scheduler-file name the same thing; give one")
        address = self.scheduler
        if address is None and self.scheduler_file is None:
            address = os.environ.get(ENV_ADDRESS) or None
            if address is not None and self.jobs is not None:
                raise InputError(
                    f"--jobs sets the local pool, but ${ENV_ADDRESS} sends the job to a Dask"
                    f" cluster; unset {ENV_ADDRESS} to run locally"
                )
        elif self.jobs is not None:
            raise InputError("--jobs sets the local pool; with a Dask scheduler its workers decide")
        return address, self.scheduler_file


def run_job(
    arguments: Sequence[Path], request: ReportRequest, export: ExportOptions, options: JobOptions
) -> int:
    """Analyze every rank, write the job's reports; return the exit code."""
    from nsysfrag.checks.job_comparison import load_job_document

    if any(r.name not in JOB_REPORTS for r, _ in request.reports):
        raise InputError(
            "--csv and --png write one input's full-resolution timeline and plots; for a job,"
            " analyze that rank alone (nsysfrag analyze PATH --png DIR)"
        )
    address, scheduler_file = options.cluster()
    if address is not None or scheduler_file is not None:
        from nsysfrag.job.cluster import require_dask

        require_dask()
    inputs = job_inputs(arguments, options.rank_pattern)
    records = _records(arguments)
    for note in records.notes():
        _note(note)
    _check_outputs(request, inputs, export.cache_dir)
    baseline = load_job_document(request.baseline) if request.baseline is not None else None
    outcomes = _execute(_tasks(inputs, request, export), inputs, address, scheduler_file, options.jobs)
    records.attach(outcomes)
    return _report(outcomes, request, baseline)


def job_document_of(
    arguments: Sequence[Path], request: ReportRequest, export: ExportOptions
) -> dict[str, Any]:
    """The job's document of ``arguments``, every rank analyzed on the local pool as
    :func:`run_job` would; nothing reported (``compare`` of a job's inputs)."""
    from nsysfrag.job.document import job_document

    inputs = job_inputs(arguments)
    outcomes = _execute(_tasks(inputs, request, export), inputs, None, None, None)
    outcomes.sort(key=lambda o: o.rank)
    _relay_notes(outcomes)
    return job_document(outcomes)


def _tasks(inputs: Sequence[RankInput], request: ReportRequest, export: ExportOptions) -> list[RankTask]:
    return [
        RankTask(
            rank=i.rank,
            path=str(i.path),
            capacity=request.capacity,
            granularity=request.granularity,
            page_bytes=request.page_bytes,
            nsys_path=export.nsys_path,
            cache_dir=str(export.cache_dir) if export.cache_dir is not None else None,
            reexport=export.reexport,
            nsys_timeout=export.nsys_timeout,
        )
        for i in inputs
    ]


def _check_outputs(
    request: ReportRequest, inputs: Sequence[RankInput], cache_dir: Path | None
) -> None:
    """No output may overwrite an input (or where a report's export goes, beside it or in
    --cache-dir), the baseline or the history; checked before any work (pipeline.outputs)
    and again as each output is written (nsysfrag.destinations)."""
    from nsysfrag import destinations
    from nsysfrag.pipeline.outputs import Kept, check_destinations
    from nsysfrag.inputs.nsys.runner import export_candidates

    kept = [Kept("the input trace", i.path) for i in inputs]
    kept += [
        Kept(f"the export of rank {i.rank}'s report", export, destinations.NSYS_EXPORT)
        for i in inputs
        if is_report(i.path)
        for export in export_candidates(i.path, cache_dir)
    ]
    if request.baseline is not None:
        kept.append(Kept("the --baseline document", request.baseline))
    outputs = request.outputs()
    check_destinations(outputs, kept, request.db, recording=request.record)


def _execute(
    tasks: list[RankTask],
    inputs: Sequence[RankInput],
    address: str | None,
    scheduler_file: Path | None,
    jobs: int | None,
) -> list[RankOutcome]:
    from nsysfrag.job import pool

    if address is not None or scheduler_file is not None:
        from nsysfrag.job.cluster import run_on_cluster

        where = f"scheduler file {scheduler_file}" if scheduler_file else address

        def connected() -> None:
            _note(f"running {len(tasks)} ranks on the Dask cluster at {where}")

        with _progress() as progress:
            return run_on_cluster(tasks, address, scheduler_file, progress, connected)
    plan = pool.plan_pool(inputs[0].path, len(tasks), jobs)
    if len(tasks) > 1:
        _note(f"analyzing {len(tasks)} ranks, {plan.size} at a time ({plan.reason()})")
    with _progress() as progress:
        return pool.run_pool(tasks, plan.size, progress)


def _report(
    outcomes: list[RankOutcome], request: ReportRequest, baseline: dict[str, Any] | None
) -> int:
    from nsysfrag.checks.gates import evaluate
    from nsysfrag.checks.job_comparison import compare_jobs
    from nsysfrag.checks.job_ranks import summaries_of
    from nsysfrag.job.document import job_document
    from nsysfrag.pipeline.feedback import say, say_tripped
    from nsysfrag.pipeline.outputs import report_console, write_text
    from nsysfrag.reporters import json_report
    from nsysfrag.reporters.job import terminal
    from nsysfrag.reporters.job.comparison import render_comparison
    from nsysfrag.reporters.job.terminal import failure

    outcomes.sort(key=lambda o: o.rank)
    _relay_notes(outcomes)
    document = job_document(outcomes)
    summaries = summaries_of(document)
    for (r, _), output in zip(request.reports, request.outputs(), strict=True):
        if r.name == "json":
            write_text(output, json_report.dumps(document))
        else:  # html: run_job refused every other report
            from nsysfrag.reporters.job import html

            write_text(output, html.render(summaries, document))
    to_screen = request.to_screen()
    console = report_console()
    if to_screen:
        terminal.render(summaries, document, console)
        if any("recorded" in e.get("analysis", {}) for e in document["ranks"]):
            from nsysfrag.record.report import render_recorded

            render_recorded(document["ranks"], console)
    code = 0
    if baseline is not None and request.baseline is not None:
        comparison = compare_jobs(baseline, document)
        if to_screen:
            render_comparison(comparison, str(request.baseline), "this job", console)
        if request.fail_on_regression is not None:
            code = say_tripped(comparison.regressions(request.fail_on_regression))
    trips = (
        trip.message(rank=outcome.rank)
        for outcome in outcomes
        if outcome.document is not None
        for trip in evaluate(list(request.gates), outcome.document)
    )
    code = say_tripped(trips) or code
    if request.record:
        _record(outcomes, request)
    failures = [o for o in outcomes if o.document is None]
    for o in failures:
        say(f"error: rank {o.rank}: {failure(o.path, o.error)}")
    if failures:
        code = max(o.exit_code for o in failures)
    return code


class _Records:
    """The record folders (``nsysfrag record``) among a job's arguments: their notes, and the
    ``recorded`` section each of their ranks' documents gets."""

    def __init__(self, folders: list[Path]) -> None:
        self.folders = folders

    def notes(self) -> list[str]:
        from nsysfrag.record.layout import job_inputs as record_inputs

        return [note for folder in self.folders for note in record_inputs(folder)[1]]

    def attach(self, outcomes: Sequence[RankOutcome]) -> None:
        if not self.folders:
            return
        from nsysfrag.record.layout import rank_folders
        from nsysfrag.record.report import recorded_section

        by_snapshot = {
            os.path.realpath(r.snapshot): r
            for folder in self.folders
            for r in rank_folders(folder)
            if r.snapshot is not None
        }
        for outcome in outcomes:
            folder = by_snapshot.get(os.path.realpath(outcome.path))
            if folder is not None and outcome.document is not None and folder.snapshot:
                outcome.document["recorded"] = recorded_section(
                    folder, folder.snapshot, outcome.document
                )


def _records(arguments: Sequence[Path]) -> _Records:
    from nsysfrag.record.layout import is_record

    return _Records([Path(a) for a in arguments if is_record(a)])


def _record(outcomes: Sequence[RankOutcome], request: ReportRequest) -> None:
    from nsysfrag.pipeline.single import record_run

    for outcome in outcomes:
        if outcome.document is not None and outcome.source is not None:
            record_run(outcome.document, request, Path(outcome.source), rank=outcome.rank)


def _relay_notes(outcomes: Sequence[RankOutcome]) -> None:
    """The workers' notes (an export reused, which nsys ran): a note every rank shares once,
    the others naming their rank."""
    ranks_of: dict[str, int] = {}
    for outcome in outcomes:
        for note in set(outcome.notes):
            ranks_of[note] = ranks_of.get(note, 0) + 1
    said: set[str] = set()
    for outcome in outcomes:
        for note in outcome.notes:
            if ranks_of[note] > 1:
                if note not in said:
                    said.add(note)
                    _note(note)
            else:
                _note(f"rank {outcome.rank}: {note}")


def _note(message: str) -> None:
    from nsysfrag.pipeline.feedback import say

    say(message)


@contextmanager
def _progress() -> Iterator[Callable[[int, int], None] | None]:
    """A transient line on stderr, only on a terminal; redrawn by the caller (no thread, so
    forking a worker is safe while it shows)."""
    from nsysfrag.pipeline.outputs import stderr_console

    console = stderr_console()
    if not console.is_terminal:
        yield None
        return
    with Live(Text(""), console=console, transient=True, auto_refresh=False) as live:

        def update(done: int, total: int) -> None:
            live.update(Text(f"analyzed {done} of {total} ranks"), refresh=True)

        yield update

"""``nsysfrag compare BASE CURRENT``: what changed between two runs, and which sites did it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from nsysfrag.checks.comparison import Comparison, compare
from nsysfrag.checks.job_comparison import JobComparison, compare_jobs, is_job_document
from nsysfrag.commands.compare_inputs import documents
from nsysfrag.commands.params import ByteSize, Delta
from nsysfrag.pipeline.feedback import say_tripped
from nsysfrag.pipeline.outputs import Kept, Output, check_destinations, report_console, write_text
from nsysfrag.pipeline.request import ReportRequest
from nsysfrag.reporters import comparison_html, comparison_json, comparison_table, json_report
from nsysfrag.reporters.job import comparison as job_comparison


@click.command("compare")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("current", type=click.Path(path_type=Path))
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    help="Write the comparison as JSON (nsysfrag-compare/1) here ('-' for stdout,"
    " which replaces the terminal report).",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(path_type=Path),
    help="Write the comparison as a self-contained HTML page ('-' for stdout).",
)
@click.option(
    "--capacity",
    type=ByteSize(),
    default=None,
    help="Device memory per space for an input analyzed here (not a document), e.g. 80GiB.",
)
@click.option(
    "--fail-on-regression",
    type=Delta(),
    default=None,
    metavar="DELTA",
    help="Exit 1 when a fragmentation ratio grew by more than DELTA (e.g. 0.05 = 5 points).",
)
@click.option("-q", "--quiet", is_flag=True, help="Print no terminal report.")
def compare_command(
    base: Path,
    current: Path,
    json_path: Path | None,
    html_path: Path | None,
    capacity: int | None,
    fail_on_regression: float | None,
    quiet: bool,
) -> None:
    """Compare two runs: the state at peak memory, at worst fragmentation and at the end, side
    by side, and the allocation sites whose live, stranded and hole bytes changed most, with a
    verdict in words.

    BASE and CURRENT are two analyses of one kind: documents written by `nsysfrag analyze
    --json`, or inputs analyzed now (two snapshots, two nsys exports or reports, two jobs'
    folders). Spaces pair up by (pid, device) when both runs have it, else by device in pid
    order; two jobs compare rank by rank. Sites match by their text (file:line function, or
    NVTX path), and by file and function when only line numbers moved.

    Examples:

    \b
        nsysfrag analyze run.sqlite -q --json branch.json
        nsysfrag compare main.json branch.json
        nsysfrag compare main.json branch.json --fail-on-regression 0.05
        nsysfrag compare ctx128.pickle ctx256.pickle --html compare.html
    """
    outputs = [
        Output(option, path)
        for option, path in (("--json", json_path), ("--html", html_path))
        if path is not None
    ]
    check_destinations(outputs, [Kept("the base input", base), Kept("the current input", current)])
    names = (base.name, current.name) if base.name != current.name else (str(base), str(current))
    base_doc, current_doc = documents(base, current, ReportRequest(capacity=capacity), names)
    comparison: Comparison | JobComparison
    pages: dict[str, Callable[[], str]]
    if is_job_document(base_doc):
        job = comparison = compare_jobs(base_doc, current_doc, names)
        pages = {
            "--json": lambda: json_report.dumps(comparison_json.job_document(job, *names)),
            "--html": lambda: comparison_html.render_job(job, *names),
        }
    else:
        single = comparison = compare(base_doc, current_doc, names)
        pages = {
            "--json": lambda: json_report.dumps(comparison_json.document(single, *names)),
            "--html": lambda: comparison_html.render(single, *names),
        }
    for output in outputs:
        write_text(output, pages[output.option]())
    if not quiet and not any(o.to_stdout for o in outputs):
        console = report_console()
        if isinstance(comparison, JobComparison):
            job_comparison.render_comparison(comparison, *names, console)
        else:
            comparison_table.render(comparison, *names, console)
    if fail_on_regression is not None:
        code = say_tripped(comparison.regressions(fail_on_regression))
        if code:
            raise click.exceptions.Exit(code)

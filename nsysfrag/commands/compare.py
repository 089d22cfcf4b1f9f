"""``nsysfrag compare BASE.json CURRENT.json``."""

from __future__ import annotations

from pathlib import Path

import click

from nsysfrag.checks.comparison import Comparison, compare
from nsysfrag.commands.feedback import say_tripped
from nsysfrag.commands.outputs import report_console
from nsysfrag.commands.params import Delta
from nsysfrag.job import terminal as job_terminal
from nsysfrag.job.comparison import (
    JobComparison,
    compare_jobs,
    is_job_document,
    load_either,
    same_kind,
)
from nsysfrag.reporters import comparison_table


@click.command("compare")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("current", type=click.Path(path_type=Path))
@click.option("--fail-on-regression", type=Delta(), default=None, metavar="DELTA",
              help="Exit 1 when a fragmentation ratio grew by more than DELTA (e.g. 0.05 = 5 points).")
def compare_command(base: Path, current: Path, fail_on_regression: float | None) -> None:
    """Compare two runs' analyses side by side, space by space.

    BASE and CURRENT are documents written by `nsysfrag analyze --json`. Spaces pair up by
    (pid, device) when both runs have it, else by device in pid order. Two jobs' documents
    (analyze with several inputs) compare rank by rank.

    Examples:

    \b
        nsysfrag analyze run.sqlite -q --json branch.json
        nsysfrag compare main.json branch.json
        nsysfrag compare main.json branch.json --fail-on-regression 0.05
    """
    base_doc, current_doc = load_either(base), load_either(current)
    same_kind(base_doc, current_doc, base, current)
    console = report_console()
    comparison: Comparison | JobComparison
    if is_job_document(base_doc):
        comparison = compare_jobs(base_doc, current_doc)
        job_terminal.render_comparison(comparison, base.name, current.name, console)
    else:
        comparison = compare(base_doc, current_doc)
        comparison_table.render(comparison, base.name, current.name, console)
    if fail_on_regression is not None:
        code = say_tripped(comparison.regressions(fail_on_regression))
        if code:
            raise click.exceptions.Exit(code)

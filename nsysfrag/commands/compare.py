"""``nsysfrag compare BASE.json CURRENT.json``."""

from __future__ import annotations

from pathlib import Path

import click

from nsysfrag.checks.comparison import compare, load_document
from nsysfrag.commands.feedback import say
from nsysfrag.commands.outputs import report_console
from nsysfrag.commands.params import Delta
from nsysfrag.errors import EXIT_GATE
from nsysfrag.reporters import comparison_table


@click.command("compare")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("current", type=click.Path(path_type=Path))
@click.option("--fail-on-regression", type=Delta(), default=None, metavar="DELTA",
              help="Exit 1 when a fragmentation ratio grew by more than DELTA (e.g. 0.05 = 5 points).")
def compare_command(base: Path, current: Path, fail_on_regression: float | None) -> None:
    """Compare two runs' analyses side by side, space by space.

    BASE and CURRENT are documents written by `nsysfrag analyze --json`. Spaces pair up by
    (pid, device) when both runs have it, else by device in pid order.

    Example:

        nsysfrag compare main.json branch.json --fail-on-regression 0.05
    """
    comparison = compare(load_document(base), load_document(current))
    comparison_table.render(comparison, base.name, current.name, report_console())
    if fail_on_regression is not None:
        regressions = comparison.regressions(fail_on_regression)
        for line in regressions:
            say(line)
        if regressions:
            raise click.exceptions.Exit(EXIT_GATE)

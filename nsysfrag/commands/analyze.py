"""``nsysfrag analyze TRACE``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from nsysfrag.commands.report_options import (
    ReportRequest,
    analyze_sqlite,
    check_outputs,
    emit_reports,
    report_options,
)


@click.command("analyze")
@click.argument("trace", type=click.Path(path_type=Path))
@report_options
def analyze_command(trace: Path, **options: Any) -> None:
    """Replay a trace's device allocations and report how fragmented memory got.

    TRACE is the SQLite export of an nsys report (`nsys export --type sqlite`).

    Example:

        nsysfrag analyze run.sqlite --json run.json --csv timeline.csv
    """
    request = ReportRequest.from_options(options)
    check_outputs(request, trace)
    code = emit_reports(analyze_sqlite(trace, request), request)
    if code:
        raise click.exceptions.Exit(code)

"""The analysis and report options shared by ``analyze`` and ``profile``: the command-line
face of ``pipeline.request.ReportRequest``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from nsysfrag.commands.params import ByteSize, Delta
from nsysfrag.models.observed import DEFAULT_GRANULARITY, DEFAULT_PAGE_BYTES
from nsysfrag.pipeline.request import option_dest
from nsysfrag.reporters import REPORTERS

F = TypeVar("F", bound=Callable[..., Any])


def report_options(f: F) -> F:
    """Decorate a command with the analysis and report options."""
    suffixes = " or ".join(r.suffixes[0] for r in REPORTERS if r.suffixes)
    options = [
        *(
            click.option(f"--{r.name}", option_dest(r), type=click.Path(path_type=Path), help=r.help)
            for r in REPORTERS
        ),
        click.option("-o", "--output", "output", type=click.Path(path_type=Path),
                     help=f"Write the report whose format the suffix names: {suffixes}."),
        click.option("--capacity", type=ByteSize(), default=None,
                     help="Device memory per space, overriding the trace's TARGET_INFO_GPU (e.g. 80GiB)."),
        click.option("--granularity", type=ByteSize(), default=DEFAULT_GRANULARITY, show_default=True,
                     help="Allocation rounding: a block's footprint is its size rounded up to this."),
        click.option("--page-size", "page_bytes", type=ByteSize(), default=DEFAULT_PAGE_BYTES,
                     show_default=True,
                     help="The driver's page (nsys traces): a page is resident while a block"
                     " touches it, and its free bytes are stranded."),
        click.option("--fail-on", "fail_on", multiple=True, metavar="EXPR",
                     help="Exit 1 when any space meets EXPR, e.g. 'global_frag>0.3', 'health=critical',"
                     " 'memory_peak.reserved_bytes>70GiB' (the moment of most reserved memory;"
                     " peak. is the worst fragmentation), 'ooms.count>0': any numeric key of the"
                     " JSON (listed below). Repeatable."),
        click.option("--baseline", type=click.Path(path_type=Path),
                     help="Compare with an earlier run's --json document."),
        click.option("--fail-on-regression", type=Delta(), default=None, metavar="DELTA",
                     help="With --baseline: exit 1 when a fragmentation ratio grew by more than DELTA (e.g. 0.05)."),
        click.option("-q", "--quiet", is_flag=True, help="Print no terminal report."),
        click.option("--record", is_flag=True,
                     help="Store this run's summary in the history database (see `nsysfrag history`)."),
        click.option("--label", metavar="TEXT", help="With --record: a label for the run, e.g. 'nightly #412'."),
        click.option("--tag", "tags", multiple=True, metavar="K=V",
                     help="With --record: tag the run, e.g. model=llama-8b (repeatable)."),
        click.option("--db", metavar="URL",
                     help="With --record: the history database (SQLite path or URL, or postgresql+psycopg://…;"
                     " default $NSYSFRAG_DB, else $XDG_DATA_HOME/nsysfrag/history.sqlite)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f



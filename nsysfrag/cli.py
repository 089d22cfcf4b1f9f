"""The command line: argv, exit codes and stdout live here and nowhere else."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import click
from rich.console import Console

from nsysfrag import __version__
from nsysfrag.analysis import DEFAULT_GRANULARITY, Analysis, analyze
from nsysfrag.errors import EXIT_INPUT, InputError, NsysfragError
from nsysfrag.reporters import csv_report, json_report, terminal
from nsysfrag.trace import read_trace

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 10**6, "mb": 10**6,
          "mib": 1 << 20, "g": 10**9, "gb": 10**9, "gib": 1 << 30, "t": 10**12, "tb": 10**12,
          "tib": 1 << 40}


class ByteSize(click.ParamType):
    """A byte count: ``85899345920``, ``80GiB``, ``512``, ``2MiB``."""

    name = "BYTES"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            self.fail(f"{value!r} is not a size; write e.g. 85899345920, 80GiB or 512", param, ctx)
        size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
        if size < 1:
            self.fail(f"{value!r} must be at least 1 byte", param, ctx)
        return size


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nsysfrag")
def cli() -> None:
    """How fragmented is GPU device memory, how it got that way, and what to change."""


def _check_output(path: Path, trace: Path) -> None:
    if path != Path("-") and path.resolve() == trace.resolve():
        raise InputError(f"{path}: refusing to overwrite the input trace; choose another path")
    if path != Path("-") and not path.parent.exists():
        raise InputError(f"{path}: folder {path.parent} does not exist; create it first")


def _write_text(path: Path, text: str) -> None:
    if path == Path("-"):
        click.echo(text, nl=False)
        return
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot write ({err.strerror}); choose a writable path") from None


@cli.command("analyze")
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--json", "json_path", type=click.Path(path_type=Path),
              help="Write the SPEC JSON document here ('-' for stdout, which replaces the report).")
@click.option("-o", "--output", "output", type=click.Path(path_type=Path),
              help="Write a report whose format follows the suffix (.json).")
@click.option("--csv", "csv_path", type=click.Path(path_type=Path),
              help="Write the full-resolution timeline, one row per event.")
@click.option("--capacity", type=ByteSize(), default=None,
              help="Device memory per space, overriding the trace's TARGET_INFO_GPU (e.g. 80GiB).")
@click.option("--granularity", type=ByteSize(), default=DEFAULT_GRANULARITY, show_default=True,
              help="Allocation rounding: a block's footprint is its size rounded up to this.")
@click.option("-q", "--quiet", is_flag=True, help="Print no terminal report.")
def analyze_command(
    trace: Path,
    json_path: Path | None,
    output: Path | None,
    csv_path: Path | None,
    capacity: int | None,
    granularity: int,
    quiet: bool,
) -> None:
    """Replay a trace's device allocations and report how fragmented memory got.

    TRACE is the SQLite export of an nsys report (`nsys export --type sqlite`).

    Example:

        nsysfrag analyze run.sqlite --json run.json --csv timeline.csv
    """
    if output is not None:
        if output.suffix.lower() != ".json":
            raise InputError(f"{output}: unknown report format; use a .json path with -o")
        json_path = json_path or output
    for path in (json_path, csv_path):
        if path is not None:
            _check_output(path, trace)
    analysis = analyze(read_trace(trace), capacity_bytes=capacity, granularity_bytes=granularity)
    if json_path is not None:
        _write_text(json_path, json_report.render(analysis))
    if csv_path is not None:
        try:
            csv_report.write(analysis, csv_path)
        except OSError as err:
            raise InputError(f"{csv_path}: cannot write ({err.strerror})") from None
    if not quiet and json_path != Path("-"):
        _print_report(analysis)


def _print_report(analysis: Analysis) -> None:
    width = int(os.environ.get("NSYSFRAG_WIDTH", "0")) or None
    terminal.render(analysis, Console(width=width, soft_wrap=False))


def main(argv: list[str] | None = None) -> None:
    """Entry point: turn every expected failure into one line on stderr and an exit code."""
    try:
        cli.main(args=argv, prog_name="nsysfrag", standalone_mode=False)
    except NsysfragError as err:
        click.echo(f"nsysfrag: error: {err}", err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except click.Abort:
        click.echo("nsysfrag: interrupted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("nsysfrag: interrupted", err=True)
        sys.exit(130)
    except Exception as err:  # a bug: still one line, with the way to see more
        if os.environ.get("NSYSFRAG_DEBUG"):
            raise
        click.echo(
            f"nsysfrag: internal error: {type(err).__name__}: {err} (set NSYSFRAG_DEBUG=1 for"
            " the traceback and please report it)",
            err=True,
        )
        sys.exit(EXIT_INPUT)
    sys.exit(0)

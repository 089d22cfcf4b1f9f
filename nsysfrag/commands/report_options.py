"""The analysis and report options shared by ``analyze`` and ``profile``."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from nsysfrag.analysis import DEFAULT_GRANULARITY, Analysis, analyze
from nsysfrag.errors import InputError
from nsysfrag.reporters import csv_report, json_report, terminal
from nsysfrag.trace import read_trace

F = TypeVar("F", bound=Callable[..., Any])

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 10**6, "mb": 10**6,
          "mib": 1 << 20, "g": 10**9, "gb": 10**9, "gib": 1 << 30, "t": 10**12, "tb": 10**12,
          "tib": 1 << 40}
STDOUT = Path("-")


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


@dataclass(frozen=True)
class ReportRequest:
    """What the user asked to compute and where to put it."""

    json_path: Path | None = None
    csv_path: Path | None = None
    capacity: int | None = None
    granularity: int = DEFAULT_GRANULARITY
    quiet: bool = False

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> ReportRequest:
        json_path, output = options.pop("json_path"), options.pop("output")
        if output is not None:
            if output.suffix.lower() != ".json":
                raise InputError(f"{output}: unknown report format; use a .json path with -o")
            json_path = json_path or output
        return cls(
            json_path=json_path,
            csv_path=options.pop("csv_path"),
            capacity=options.pop("capacity"),
            granularity=options.pop("granularity"),
            quiet=options.pop("quiet"),
        )

    def outputs(self) -> list[Path]:
        return [p for p in (self.json_path, self.csv_path) if p is not None and p != STDOUT]


def report_options(f: F) -> F:
    """Decorate a command with the analysis and report options."""
    options = [
        click.option("--json", "json_path", type=click.Path(path_type=Path),
                     help="Write the SPEC JSON document here ('-' for stdout, which replaces the report)."),
        click.option("-o", "--output", "output", type=click.Path(path_type=Path),
                     help="Write a report whose format follows the suffix (.json)."),
        click.option("--csv", "csv_path", type=click.Path(path_type=Path),
                     help="Write the full-resolution timeline, one row per event."),
        click.option("--capacity", type=ByteSize(), default=None,
                     help="Device memory per space, overriding the trace's TARGET_INFO_GPU (e.g. 80GiB)."),
        click.option("--granularity", type=ByteSize(), default=DEFAULT_GRANULARITY, show_default=True,
                     help="Allocation rounding: a block's footprint is its size rounded up to this."),
        click.option("-q", "--quiet", is_flag=True, help="Print no terminal report."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def check_outputs(request: ReportRequest, trace: Path) -> None:
    """Fail before any work when an output would clobber the trace or cannot be written."""
    for path in request.outputs():
        if path.exists() and trace.exists() and path.resolve() == trace.resolve():
            raise InputError(f"{path}: refusing to overwrite the input trace; choose another path")
        if not path.parent.exists():
            raise InputError(f"{path}: folder {path.parent} does not exist; create it first")


def _write_text(path: Path, text: str) -> None:
    if path == STDOUT:
        click.echo(text, nl=False)
        return
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot write ({err.strerror}); choose a writable path") from None


def analyze_sqlite(sqlite_path: Path, request: ReportRequest) -> Analysis:
    return analyze(
        read_trace(sqlite_path), capacity_bytes=request.capacity, granularity_bytes=request.granularity
    )


def emit_reports(analysis: Analysis, request: ReportRequest) -> int:
    """Write every requested report; return the exit code (gates decide it)."""
    if request.json_path is not None:
        _write_text(request.json_path, json_report.render(analysis))
    if request.csv_path is not None:
        try:
            csv_report.write(analysis, request.csv_path)
        except OSError as err:
            raise InputError(f"{request.csv_path}: cannot write ({err.strerror})") from None
    if not request.quiet and request.json_path != STDOUT:
        width = int(os.environ.get("NSYSFRAG_WIDTH", "0")) or None
        terminal.render(analysis, Console(width=width, soft_wrap=False))
    return 0

"""One module per output format; each builds plain data first and renders it second.

:data:`REPORTERS` lists the formats of an analysis: each is a :class:`Reporter` that names its
command-line option, the suffixes ``-o`` picks it by, and the function that renders or writes
it. The options, the ``-o`` mapping and the writing of reports all follow this list, so a new
format is one module and one entry here (docs/ARCHITECTURE.md walks through one). The terminal
report and the what-if, comparison and job (`job/`) reports have data of their own and are not in
it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, cast

if TYPE_CHECKING:
    from nsysfrag.analysis import Analysis


@dataclass(frozen=True)
class Reporter:
    """One output format of an analysis.

    Exactly one of ``render`` and ``write`` is given, as ``"module:function"`` so a format's
    imports (matplotlib, pandas) load only when it is asked for: ``render(analysis) -> str``
    for a text format (``-`` writes it to stdout), ``write(analysis, destination)`` for one
    that writes its own file or folder (a file format is handed ``sys.stdout`` for ``-``; a
    folder never goes to stdout).
    """

    name: str  # the option is --NAME
    help: str
    suffixes: tuple[str, ...] = ()  # -o PATH picks this format when PATH ends so
    render: str | None = None
    write: str | None = None
    folder: bool = False  # the path is a folder, created if missing

    def renderer(self) -> Callable[[Analysis], str]:
        return cast("Callable[[Analysis], str]", _load(self.render))

    def writer(self) -> Callable[[Analysis, Path | TextIO], object]:
        return cast("Callable[[Analysis, Path | TextIO], object]", _load(self.write))


def _load(target: str | None) -> object:
    if target is None:
        raise ValueError("this reporter has no such function")
    module, attribute = target.split(":")
    return getattr(importlib.import_module(module), attribute)


REPORTERS: tuple[Reporter, ...] = (
    Reporter(
        "json",
        "Write the JSON document here ('-' for stdout, which replaces the terminal report).",
        suffixes=(".json",),
        render="nsysfrag.reporters.json_report:render",
    ),
    Reporter(
        "csv",
        "Write the full-resolution timeline, one row per event ('-' for stdout).",
        write="nsysfrag.reporters.csv_report:write",
    ),
    Reporter(
        "html",
        "Write a self-contained HTML report (plots inline, works offline; '-' for stdout).",
        suffixes=(".html", ".htm"),
        render="nsysfrag.reporters.html:render",
    ),
    Reporter(
        "png",
        "Write six PNG plots per space into this folder (created if missing; its parent must exist).",
        write="nsysfrag.reporters.png:write_pngs",
        folder=True,
    ),
)


def reporter_for_suffix(path: Path) -> Reporter | None:
    """The format ``-o path`` asks for, from its suffix."""
    suffix = path.suffix.lower()
    return next((r for r in REPORTERS if suffix in r.suffixes), None)

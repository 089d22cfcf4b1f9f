"""What a command asks of one analysis: what to compute and where to put it (`ReportRequest`),
how a report becomes its export (`ExportOptions`), and the check of every output before the
work (`check_outputs`). The command line fills these from its options; a job's worker, a trial
and a notebook build them directly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsysfrag import destinations
from nsysfrag.checks.comparison import load_document
from nsysfrag.checks.document_words import document_words, other_kinds
from nsysfrag.checks.gates import Gate, parse_gate
from nsysfrag.errors import InputError
from nsysfrag.inputs import format_of
from nsysfrag.inputs.files import check_regular_file
from nsysfrag.models.observed import DEFAULT_GRANULARITY, DEFAULT_PAGE_BYTES
from nsysfrag.pipeline.outputs import STDOUT, Kept, Output, check_destinations
from nsysfrag.reporters import REPORTERS, Reporter, reporter_for_suffix


@dataclass(frozen=True)
class ReportRequest:
    """What the user asked to compute and where to put it."""

    reports: tuple[tuple[Reporter, Path], ...] = ()  # in REPORTERS order
    capacity: int | None = None
    granularity: int = DEFAULT_GRANULARITY
    page_bytes: int = DEFAULT_PAGE_BYTES
    quiet: bool = False
    gates: tuple[Gate, ...] = ()
    baseline: Path | None = None
    fail_on_regression: float | None = None
    record: bool = False
    label: str | None = None
    tags: tuple[tuple[str, str], ...] = ()
    db: str | None = None
    o_format: str | None = None  # the name of the reporter -o chose

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> ReportRequest:
        paths: dict[str, Path] = {}
        for r in REPORTERS:
            if (path := options.pop(option_dest(r))) is not None:
                paths[r.name] = path
        output = options.pop("output")
        o_format = None
        if output is not None:
            chosen = _reporter_for_output(output)
            if chosen.name in paths:
                raise InputError(
                    f"-o {output} and --{chosen.name} both ask for the {chosen.name.upper()}"
                    " report; keep one"
                )
            paths[chosen.name] = output
            o_format = chosen.name
        baseline, regression = options.pop("baseline"), options.pop("fail_on_regression")
        if regression is not None and baseline is None:
            raise InputError("--fail-on-regression needs --baseline BASE.json to compare against")
        record, label, db = options.pop("record"), options.pop("label"), options.pop("db")
        raw_tags = options.pop("tags")
        if not record and (label is not None or raw_tags or db is not None):
            raise InputError("--label, --tag and --db go with --record (store this run in the history)")
        tags: tuple[tuple[str, str], ...] = ()
        if record:
            from nsysfrag.history import database_url, parse_tags  # only --record needs it

            tags = parse_tags(raw_tags)
            database_url(db)  # a malformed URL fails now, not after the analysis
        return cls(
            reports=tuple((r, paths[r.name]) for r in REPORTERS if r.name in paths),
            o_format=o_format,
            record=record,
            label=label,
            tags=tags,
            db=db,
            capacity=options.pop("capacity"),
            granularity=options.pop("granularity"),
            page_bytes=options.pop("page_bytes"),
            quiet=options.pop("quiet"),
            gates=tuple(parse_gate(g) for g in options.pop("fail_on")),
            baseline=baseline,
            fail_on_regression=regression,
        )

    def outputs(self) -> list[Output]:
        """Every output asked for, in REPORTERS order, named by the option that asked."""
        return [
            Output(
                "-o" if r.name == self.o_format else f"--{r.name}",
                path,
                folder=r.folder,
                stdout_ok=not r.folder,
            )
            for r, path in self.reports
        ]

    def uses_stdout(self) -> bool:
        return any(o.to_stdout for o in self.outputs())

    def to_screen(self) -> bool:
        """The terminal report is printed unless -q, or a report goes to stdout instead."""
        return not self.quiet and not self.uses_stdout()


def option_dest(r: Reporter) -> str:
    return f"{r.name}_path"


def _reporter_for_output(output: Path) -> Reporter:
    """The format ``-o output`` asks for, from its suffix."""
    chosen = reporter_for_suffix(output)
    if chosen is not None:
        return chosen
    named = [r for r in REPORTERS if r.suffixes]
    if output == STDOUT:
        options = " or ".join(f"--{r.name} -" for r in named)
        raise InputError(f"-o -: -o picks the format from the suffix; use {options}")
    kinds = " or ".join(r.suffixes[0] for r in named)
    raise InputError(f"-o {output}: unknown report format; use a {kinds} path with -o")


def check_outputs(
    request: ReportRequest,
    source: Path | None,
    exports: Sequence[Path] = (),
    made_here: Sequence[Output] = (),
) -> None:
    """Fail before any work when an output would clobber a file the run needs or has, or cannot
    be written, or when the baseline cannot be read. ``source`` is the input, ``exports``
    where its export (of a report) may go; ``made_here`` are the files nsys writes in this run
    (``profile``'s recording and its export), outputs like the reports."""
    kept = [Kept("the input trace", source)] if source is not None else []
    kept += [Kept("the export of the input report", p, destinations.NSYS_EXPORT) for p in exports]
    if request.baseline is not None:
        kept.append(Kept("the --baseline document", request.baseline))
    outputs = [*request.outputs(), *made_here]
    check_destinations(outputs, kept, request.db, recording=request.record)
    if request.baseline is not None:
        baseline = load_document(request.baseline)  # fail now, not after a long analysis
        check_regular_file(source)  # recognising the format may read it: never a FIFO
        words, fmt = document_words(baseline), format_of(source)
        if words.input != fmt.name:
            names = (f"--baseline {request.baseline}", str(source))
            raise InputError(other_kinds(names, (f"an analysis of {words.description}", fmt.description)))


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """How a .nsys-rep becomes the SQLite export that is analyzed."""

    nsys_path: str | None = None
    cache_dir: Path | None = None
    reexport: bool = False
    nsys_timeout: float | None = None  # --nsys-timeout; None: limits.NSYS_EXPORT_S

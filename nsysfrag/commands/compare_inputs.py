"""What ``compare`` compares: each argument's analysis document, read back (a document written
by ``analyze --json``, a single input's or a job's) or made here (an input analyzed now: a
snapshot, an export, a report; a folder or a glob of a job's inputs).

Documents are read through ``nsysfrag.checks.job_comparison.load_either``, the one reader of analyses
written earlier. Two arguments of different kinds are refused before any analysis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nsysfrag.checks.document_words import document_words, other_kinds, same_model
from nsysfrag.checks.job_comparison import is_job_document, load_either, same_kind
from nsysfrag.errors import InputError
from nsysfrag.inputs.files import check_regular_file
from nsysfrag.job.inputs import is_job
from nsysfrag.pipeline.request import ReportRequest
from nsysfrag.reporters import json_report

_SNIFF = 64


def is_document(path: Path) -> bool:
    """A JSON document rather than an input: named ``.json``, or a file whose first non-blank
    byte opens an object (no snapshot, export or report starts so)."""
    if path.suffix.lower() == ".json":
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF)
    except OSError:
        return False  # the input's reader says what is wrong with it
    return head.lstrip()[:1] == b"{"


def documents(
    base: Path, current: Path, request: ReportRequest, names: tuple[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two analyses to compare, refused in one line when they are of different kinds."""
    paths = (base, current)
    for p in paths:
        check_regular_file(p)  # telling a document from an input reads it: never a FIFO
    read = [load_either(p) if is_document(p) else None for p in paths]
    kinds = [_kind(p, doc) for p, doc in zip(paths, read, strict=True)]
    first, second = kinds
    if first is not None and second is not None and first != second:
        raise InputError(other_kinds(names, (first[1], second[1])))
    docs = [
        doc if doc is not None else _analyzed(p, request)
        for p, doc in zip(paths, read, strict=True)
    ]
    same_kind(docs[0], docs[1], base, current)
    if not is_job_document(docs[0]):
        same_model(docs[0], docs[1], names)
    return docs[0], docs[1]


def _kind(path: Path, doc: dict[str, Any] | None) -> tuple[str, str] | None:
    """(input format, its description) of a single input or its document; None for a job."""
    if doc is not None:
        if is_job_document(doc):
            return None
        words = document_words(doc)
        return words.input, words.description
    if is_job([path]):
        return None
    from nsysfrag.inputs import format_of

    fmt = format_of(path)
    return fmt.name, fmt.description


def _analyzed(path: Path, request: ReportRequest) -> dict[str, Any]:
    """``path`` analyzed now, every site listed (nothing is written, so nothing need be
    small); a job's inputs rank by rank."""
    from nsysfrag.pipeline.request import ExportOptions
    from nsysfrag.pipeline.single import analyze_argument

    if is_job([path]):
        from nsysfrag.job.command import job_document_of

        return job_document_of([path], request, ExportOptions())
    analysis, _ = analyze_argument(path, request, ExportOptions())
    return json_report.document(analysis, sites_listed=None)

"""One rank's analysis, wherever it runs: a pool process, a Dask worker, or in-process.

A worker gets a :class:`RankTask` (a path and the analysis options: small, picklable) and
returns a :class:`RankOutcome`: the rank's single-input JSON document, exactly what
``nsysfrag analyze PATH --json`` writes, or the one-line error that analysis ended with. The
full-resolution timelines stay in the worker; the document's timeline (at most 2,000 points per
space) is all the job's reports need, the heatmap included.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsysfrag.errors import EXIT_INPUT, NsysfragError


@dataclass(frozen=True, slots=True)
class RankTask:
    rank: int
    path: str  # as the user named it
    capacity: int | None
    granularity: int
    page_bytes: int = 2 << 20
    nsys_path: str | None = None
    cache_dir: str | None = None
    reexport: bool = False
    nsys_timeout: float | None = None
    # Set for a worker that does not share the coordinator's working folder (Dask): relative
    # paths are read from there, and the outcome names them as the user did.
    cwd: str | None = None


@dataclass(frozen=True, slots=True)
class RankOutcome:
    rank: int
    path: str
    document: dict[str, Any] | None = None
    error: str | None = None
    exit_code: int = 0  # the error's (2 bad input, 3 nsys), 0 when analyzed
    notes: tuple[str, ...] = field(default=())
    # The file analyzed (a report's export), named as the coordinator sees it: what --record
    # hashes. The document's path is text for people (a name that is not UTF-8 is escaped).
    source: str | None = None

    @property
    def ok(self) -> bool:
        return self.document is not None


def failed(rank: int, path: str, error: str, exit_code: int = EXIT_INPUT) -> RankOutcome:
    return RankOutcome(rank, path, error=error, exit_code=exit_code)


def analyze_rank(task: RankTask) -> RankOutcome:
    """Analyze one rank exactly as ``nsysfrag analyze PATH`` would; never raises for bad input."""
    # Imported here: a Dask worker unpickles this function before anything of nsysfrag loads.
    from nsysfrag.pipeline.request import ExportOptions, ReportRequest
    from nsysfrag.pipeline.single import analyze_argument
    from nsysfrag.reporters import json_report

    given = _Paths(task)
    notes: list[str] = []
    request = ReportRequest(
        capacity=task.capacity, granularity=task.granularity, page_bytes=task.page_bytes
    )
    export = ExportOptions(
        task.nsys_path,
        given.local(task.cache_dir) if task.cache_dir else None,
        task.reexport,
        task.nsys_timeout,
    )
    try:
        analysis, analyzed = analyze_argument(
            given.local(task.path), request, export, interactive=False, say=notes.append
        )
        document = json_report.document(analysis)
    except NsysfragError as err:
        return RankOutcome(
            task.rank, task.path, error=given.restore(str(err)), exit_code=err.exit_code,
            notes=tuple(given.restore(n) for n in notes),
        )
    except MemoryError:
        return failed(
            task.rank, task.path,
            "out of memory while analyzing it; run the job with fewer --jobs, or analyze this"
            " rank alone",
        )
    except Exception as err:  # noqa: BLE001  (a bug: one rank reports it, the job goes on)
        return failed(
            task.rank, task.path,
            f"internal error: {type(err).__name__}: {given.restore(str(err))} (analyze this rank"
            " alone with NSYSFRAG_DEBUG=1 for the traceback and please report it)",
        )
    document["trace"]["path"] = given.restore(str(document["trace"]["path"]))
    return RankOutcome(
        task.rank,
        task.path,
        document=document,
        notes=tuple(given.restore(n) for n in notes),
        source=given.restore(str(analyzed)),
    )


class _Paths:
    """Relative paths of a worker that runs elsewhere (Dask): read from the coordinator's
    folder, named back as the user named them, so that a rank's document and messages are the
    ones ``analyze`` writes for that input alone."""

    def __init__(self, task: RankTask) -> None:
        self.cwd = task.cwd
        # (absolute folder + "/", the folder as given + "/" or ""): the input's folder, where
        # its export goes, and --cache-dir.
        self.folders: list[tuple[str, str]] = []
        if self.cwd is None:
            return
        for given in (os.path.dirname(task.path), task.cache_dir):
            if given is not None and not os.path.isabs(given):
                named = "" if Path(given) == Path(".") else str(Path(given))
                prefix = f"{named}{os.sep}" if named else ""
                self.folders.append((f"{self.local(given)}{os.sep}", prefix))
        self.folders.sort(key=lambda pair: -len(pair[0]))  # the deeper folder first

    def local(self, given: str) -> Path:
        if self.cwd is None or os.path.isabs(given):
            return Path(given)
        return Path(os.path.normpath(os.path.join(self.cwd, given)))

    def restore(self, text: str) -> str:
        for absolute, given in self.folders:
            text = text.replace(absolute, given)
        return text

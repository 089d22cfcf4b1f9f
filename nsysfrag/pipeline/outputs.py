"""Where reports go — files, stdout (``-``), the terminal — and the checks that come first.

Every command checks its outputs before any work: a long analysis must not end in "cannot
write", and no output may destroy a file the user has. Rules, the same for every command:

- ``-`` writes that one report to stdout (then no terminal report is printed); two reports on
  stdout would interleave, so that is refused, and so is ``-`` for plots (binary PNG files);
- an output may not be an input of the run — the trace, the ``--baseline`` document — nor the
  history database, compared by file identity (device and inode), so a hard link or a symbolic
  link to one of them is caught as well as the same path; two outputs may not be one file;
- nsysfrag creates the file (or the ``--png`` folder) it is asked for, never a missing folder
  above it: a mistyped path fails at once instead of scattering folders.

The same checks run again when each file is written, by ``nsysfrag.destinations``, which
writes every file to a temporary name first and renames it into place.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from rich.console import Console

from nsysfrag import destinations
from nsysfrag.errors import InputError
from nsysfrag.inputs.files import stat_path
from nsysfrag.inputs.nsys.export_file import SQLITE_MAGIC
from nsysfrag.limits import MAX_COLUMNS

STDOUT = Path("-")


# Below this a report cannot say anything useful; a smaller $COLUMNS (0 printed nothing at all)
# gets this many columns, and the terminal wraps what does not fit.
MIN_WIDTH = 40


def report_console() -> Console:
    """The terminal report's console: stdout, as wide as ``$COLUMNS``, else the terminal, else
    80 columns (from MIN_WIDTH to limits.MAX_COLUMNS); what it prints is never read as markup
    or emoji codes."""
    return clamped(Console(soft_wrap=False, markup=False, emoji=False, highlight=False))


def stderr_console() -> Console:
    """The console of progress bars and status lines (stderr), as wide as :func:`clamped`."""
    return clamped(Console(stderr=True))


def clamped(console: Console) -> Console:
    """``console`` no narrower than MIN_WIDTH and no wider than ``limits.MAX_COLUMNS``: a
    ``$COLUMNS`` of 100,000,000 would have every rule and padded line take that many cells."""
    console.width = min(max(console.width, MIN_WIDTH), MAX_COLUMNS)
    return console


@dataclass(frozen=True, slots=True)
class Output:
    """One output the user asked for: the option that named it and its path."""

    option: str
    path: Path
    folder: bool = False  # --png DIR: a folder of files, never stdout
    stdout_ok: bool = True  # False for binary files (plots)

    @property
    def to_stdout(self) -> bool:
        return self.path == STDOUT


@dataclass(frozen=True, slots=True)
class Kept:
    """A file an output must never replace, and how to name it to the user."""

    role: str
    path: Path
    writer: str | None = None  # the one writer that may (the export of an input report)


def check_destinations(
    outputs: Sequence[Output],
    kept: Sequence[Kept] = (),
    db: str | None = None,
    *,
    recording: bool = False,
) -> None:
    """Raise InputError, before any work, for an output that breaks a rule of the module. The
    files in ``kept`` and the history database (``db`` as ``--db`` gives it; looked up whenever
    the run is ``recording`` into it) are never replaced, in this check or when the outputs
    are written."""
    kept = [*kept, *_history_kept(outputs, db, recording)]
    for k in kept:
        destinations.protect(k.role, k.path, k.writer)
    for o in outputs:
        # A name the file system refuses to look up (over 255 bytes, say) fails every check.
        stat_path(o.path, f"choose a shorter name for {o.option}")
    for o in outputs:
        if o.to_stdout and (o.folder or not o.stdout_ok):
            where = "a folder" if o.folder else "a file name"
            raise InputError(f"{o.option} -: plots cannot go to stdout; give {where}")
    on_stdout = [o.option for o in outputs if o.to_stdout]
    if len(on_stdout) > 1:
        raise InputError(
            f"{' and '.join(on_stdout)} both name '-' (stdout); only one report can go to"
            " stdout, write the others to files"
        )
    files = [o for o in outputs if not o.to_stdout]
    for o in files:
        why = destinations.refusal(o.path, o.option) if not _writes_kept(o, kept) else None
        if why is not None:
            raise InputError(f"{o.option} {o.path}: {why}")
    for i, o in enumerate(files):
        for other in files[i + 1 :]:
            if o.path == other.path or destinations.same_destination(o.path, other.path):
                raise InputError(
                    f"{o.option} and {other.option} both name {o.path}; give each its own path"
                )
    for o in files:
        _check_writable_place(o)


def _writes_kept(o: Output, kept: Sequence[Kept]) -> bool:
    return any(k.writer == o.option and k.path == o.path for k in kept)


def _history_kept(
    outputs: Sequence[Output], db: str | None = None, recording: bool = False
) -> list[Kept]:
    """The SQLite history database (``--db``, ``$NSYSFRAG_DB`` or the default) as a file no
    output may replace, whether or not this run records; looked up when the run records, or
    when an output file already exists and could be an SQLite database, since only then can it
    be the database (a name too long to look up is none: check_destinations says why)."""
    if not recording and not any(not o.to_stdout and _may_be_database(o.path) for o in outputs):
        return []
    from nsysfrag.history import database_file, database_url  # SQLAlchemy: only when needed
    from nsysfrag.history.connection import DB_WRITER

    try:
        path = database_file(database_url(db))
    except InputError:  # a malformed $NSYSFRAG_DB matters only to --record, which says so
        return []
    return [] if path is None else [Kept("the history database", path, DB_WRITER)]


def _may_be_database(path: Path) -> bool:
    """Whether the file at ``path`` could be an SQLite database: where none could, the history
    database is not looked up (that imports SQLAlchemy: a tenth of a second, at every rerun
    that replaces its reports). A file too short to tell (SQLite creates an empty one) or that
    cannot be read counts as one; a folder or a device cannot be one."""
    if not os.path.isfile(path):  # missing, a folder, a device, a name too long to look up
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError:
        return True
    return len(head) < len(SQLITE_MAGIC) or head == SQLITE_MAGIC


def _check_writable_place(o: Output) -> None:
    parent = o.path.parent
    if not parent.is_dir():
        raise InputError(
            f"{o.option} {o.path}: folder {parent} does not exist; create it first"
        )
    if o.folder:
        if o.path.exists() and not o.path.is_dir():
            raise InputError(f"{o.option} {o.path}: not a folder; {o.option} takes a folder")
    else:
        destinations.check(o.path, o.option)  # a folder, a link, a socket


def write_text(output: Output, text: str) -> None:
    """Write a text report to its file (see ``nsysfrag.destinations``), or to stdout for ``-``:
    a closed or full stdout is an error, since the report the user asked for is lost."""
    if not output.to_stdout:
        destinations.write_text(output.path, text, output.option)
        return
    write_stdout(output, lambda stream: stream.write(text))


def write_with(output: Output, write: Callable[[TextIO], object]) -> None:
    """Hand the text stream of ``output`` (its file, or stdout for ``-``) to ``write``."""
    if output.to_stdout:
        write_stdout(output, write)
        return
    with destinations.writing(output.option) as batch, batch.open(output.path) as f:
        write(f)  # type: ignore[arg-type]


def write_stdout(output: Output, write: Callable[[TextIO], object]) -> None:
    """Hand stdout to ``write``; a closed or full stdout is one line, not a silent exit 0."""
    stream = sys.stdout
    if stream is None:
        raise InputError(f"{output.option} -: stdout is closed; give a file name instead")
    try:
        write(stream)
        stream.flush()
    except UnicodeEncodeError:
        raise InputError(
            f"{output.option} -: stdout cannot encode the report's text; set"
            " PYTHONIOENCODING=utf-8 or write the report to a file"
        ) from None
    except (OSError, ValueError) as err:  # ValueError: a stream closed in this process
        why = getattr(err, "strerror", None) or "it is closed"
        raise InputError(
            f"{output.option} -: cannot write to stdout ({why}); write the report to a file"
        ) from None

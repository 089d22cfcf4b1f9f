"""Opening an nsys export: never writing to it, and never working on it without bound.

The checks before SQLite sees the file (a regular file, an SQLite header), the URI that opens it
read-only (or immutable, in WAL mode, so nothing is created beside it), text that is not UTF-8
decoded rather than fatal, and a budget of SQLite work (steps, time, value size) proportional
to the bytes really in the file.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from pathlib import Path
from urllib.parse import quote

from nsysfrag import limits
from nsysfrag.errors import InputError
from nsysfrag.inputs.files import check_input_file, present_bytes
from nsysfrag.inputs.nsys.file_kinds import TRACE_FILE, is_report

SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_BYTES = 100
# Header bytes 18 and 19 (file format write and read versions) are 2 in WAL mode.
_WAL_VERSIONS = slice(18, 20)


def check_export_file(path: Path) -> bytes:
    """Refuse what is not an SQLite file, from its metadata and first bytes; return the header."""
    check_input_file(
        path,
        expected="pass the .sqlite that `nsys export` wrote",
        directory=TRACE_FILE,
        empty="record and export the trace again",
    )
    with path.open("rb") as f:
        header = f.read(HEADER_BYTES)
    if not header.startswith(SQLITE_MAGIC):
        if is_report(path):
            raise InputError(
                f"{path}: this is an nsys report, not its SQLite export; run"
                f" `nsys export --type sqlite {path}` and analyze the .sqlite"
            )
        if header.lstrip()[:1] == b"{" and b'"nsysfrag' in header:
            raise InputError(
                f"{path}: this is a JSON report nsysfrag wrote, not an input; {READS}"
                " (`nsysfrag compare BASE.json CURRENT.json` compares two reports)"
            )
        raise InputError(
            f"{path}: not an SQLite database (an nsys export) nor a pickle (a PyTorch memory"
            f" snapshot); {READS}"
        )
    return header


# The two inputs, for a file that is neither.
READS = (
    "nsysfrag reads the .sqlite written by `nsys export --type sqlite` (or the .nsys-rep"
    " itself) and the .pickle written by torch.cuda.memory._dump_snapshot()"
)


def database_uri(path: Path, header: bytes) -> str:
    """The URI that opens ``path`` without ever writing: read-only, or immutable in WAL mode.

    A read-only connection to a WAL database still creates its -shm and -wal files beside it;
    ``immutable=1`` creates nothing, but ignores a -wal file, so one with content in it (changes
    not merged into the database) is refused rather than silently left out.
    """
    real = path.resolve()
    name = quote(os.fsencode(real))  # bytes: a file name need not be valid UTF-8
    if 2 not in header[_WAL_VERSIONS]:
        return f"file:{name}?mode=ro"
    wal = real.with_name(real.name + "-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise InputError(
            f"{path}: the database is in WAL mode and {wal.name} holds changes not yet merged"
            " into it, which nsysfrag cannot read without writing; merge them first with"
            f" `sqlite3 {path} 'PRAGMA wal_checkpoint(TRUNCATE)'`"
        )
    return f"file:{name}?immutable=1"


# What a statement may raise: sqlite3's errors, and UnicodeDecodeError when SQLite's message
# quotes bytes that are not UTF-8 (a view naming a column "x\xff" that does not exist: Python
# cannot decode "no such column: x\xff" into the error it would raise).
SQLITE_ERRORS = (sqlite3.Error, UnicodeDecodeError)


def error_text(err: BaseException) -> str:
    """The first line of an SQLite error, its bytes that are not UTF-8 as U+FFFD."""
    if isinstance(err, UnicodeDecodeError) and isinstance(err.object, bytes):
        text = err.object.decode("utf-8", "replace")
    else:
        text = str(err)
    lines = text.splitlines()
    return lines[0] if lines else type(err).__name__


def decode_text(value: bytes) -> str:
    # SQLite hands back whatever bytes a TEXT cell holds: a damaged or foreign file may hold
    # bytes that are not UTF-8 (in its schema too), which must not stop the analysis.
    return value.decode("utf-8", "replace")


class WorkBudget:
    """A bound on the SQLite work one read of an export may do, in proportion to the bytes
    really in the file (``files.present_bytes``, and no more than SQLite's page count × page
    size: a sparse tail of a terabyte is not a terabyte of data): virtual-machine steps, wall
    time, and the size of any one value (``nsysfrag.limits``).

    Every table nsys writes is read in a few linear scans, so the work is proportional to the
    file; only a view (a recursive one never ends, one may return 20 MB per row) or a
    pathological schema can make SQLite work without bound, and the progress handler then
    interrupts the statement; a value larger than the length limit fails its statement.
    """

    TICK = 100_000  # virtual-machine instructions between checks

    def __init__(self, path: Path) -> None:
        self.present = present_bytes(path)
        self.started = time.monotonic()
        self.exceeded: str | None = None  # "steps" or "time", once a limit stopped a statement
        self._set_limits()
        # The clock is a timer that interrupts every connection: a progress handler runs only
        # every TICK instructions, and one instruction may make a 20 MB value.
        self._connections: list[sqlite3.Connection] = []
        self._clock: threading.Timer | None = None
        self._lock = threading.Lock()

    def _set_limits(self) -> None:
        self.limit = max(limits.SQLITE_STEPS_FLOOR, limits.SQLITE_STEPS_PER_BYTE.value() * self.present)
        self.seconds = limits.SQLITE_SECONDS.value() + self.present / limits.SQLITE_BYTES_PER_SECOND
        self.value_bytes = int(limits.SQLITE_VALUE_BYTES.value())

    def connect(self, uri: str) -> sqlite3.Connection:
        con = sqlite3.connect(uri, uri=True)
        con.text_factory = decode_text
        limits.limit_sqlite_values(con, self.value_bytes)
        pages = _database_bytes(con)
        if pages is not None and pages < self.present:
            self.present = pages
            self._set_limits()
        steps = 0

        def tick() -> int:
            nonlocal steps
            steps += self.TICK
            if steps > self.limit:
                self.exceeded = "steps"
                return 1  # interrupts the statement
            return 0

        con.set_progress_handler(tick, self.TICK)
        with self._lock:
            self._connections.append(con)
            if self._clock is None:
                left = max(0.0, self.started + self.seconds - time.monotonic())
                self._clock = threading.Timer(left, self._expire)
                self._clock.daemon = True
                self._clock.start()
        return con

    def _expire(self) -> None:
        with self._lock:
            self.exceeded = self.exceeded or "time"
            for con in self._connections:
                with contextlib.suppress(sqlite3.Error):
                    con.interrupt()

    def close(self) -> None:
        """Stop the clock (the read is over)."""
        with self._lock:
            if self._clock is not None:
                self._clock.cancel()

    def failure(self, path: Path, err: BaseException) -> str | None:
        """The one line for ``err`` when a limit of this budget caused it, else None."""
        fix = "re-export the trace with `nsys export --type sqlite --force-overwrite=true`"
        if self.exceeded == "steps":
            return (
                f"{path}: reading it took more SQLite work than a file of its size can need"
                f" ({self.limit:,} steps); a view or a damaged table expands without bound — {fix}"
            )
        if self.exceeded == "time":
            return (
                f"{path}: reading it took more than {self.seconds:.0f} s of SQLite work, more than"
                f" a file of its size can need (a view or a damaged table?); {fix}, or raise"
                f" {limits.SQLITE_SECONDS.env}"
            )
        if is_too_big(err):
            return (
                f"{path}: a value in it is larger than {self.value_bytes:,} bytes, more than any"
                f" nsys export holds; {fix}, or raise {limits.SQLITE_VALUE_BYTES.env}"
            )
        return None


def hot_journal(path: Path, err: BaseException) -> str | None:
    """The one line for a rollback journal left beside the file by a writer that did not
    finish (a "hot" journal): SQLite must play it back into the database before reading it,
    which a read-only connection cannot do; else None."""
    journal = path.resolve().with_name(path.resolve().name + "-journal")
    if "readonly" not in error_text(err).lower() or _file_bytes(journal) == 0:
        return None
    return (
        f"{path}: {journal.name} beside it holds a transaction that a writer did not finish,"
        " which SQLite must roll back into the file before reading it, and nsysfrag never"
        " writes to an input; let the writer finish (or roll it back: open the file once"
        f" with `sqlite3 {path} 'PRAGMA quick_check'`), or export the trace again"
    )


def _file_bytes(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


def is_too_big(err: BaseException) -> bool:
    return "too big" in error_text(err).lower()


def _database_bytes(con: sqlite3.Connection) -> int | None:
    """SQLite's idea of the database's size: page count × page size."""
    try:
        (pages,) = con.execute("PRAGMA page_count").fetchone()
        (size,) = con.execute("PRAGMA page_size").fetchone()
    except sqlite3.Error:
        return None  # not a database: the reader says so in its own words
    return int(pages) * int(size)


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that cannot write, for a quick look, under a budget of its own (raises
    InputError, OSError or sqlite3.Error when the file cannot be opened that way)."""
    with path.open("rb") as f:
        uri = database_uri(path, f.read(HEADER_BYTES))
    return WorkBudget(path).connect(uri)

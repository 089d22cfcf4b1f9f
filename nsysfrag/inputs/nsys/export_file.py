"""Opening an nsys export: never writing to it, and never working on it without bound.

The checks before SQLite sees the file (a regular file, an SQLite header), the URI that opens it
read-only (or immutable, in WAL mode, so nothing is created beside it), text that is not UTF-8
decoded rather than fatal, and a budget of SQLite work proportional to the file's size.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from nsysfrag.errors import InputError
from nsysfrag.inputs.files import check_input_file
from nsysfrag.inputs.nsys import TRACE_FILE, is_report

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


def decode_text(value: bytes) -> str:
    # SQLite hands back whatever bytes a TEXT cell holds: a damaged or foreign file may hold
    # bytes that are not UTF-8 (in its schema too), which must not stop the analysis.
    return value.decode("utf-8", "replace")


class WorkBudget:
    """A bound on the SQLite work one connection may do, proportional to the file's size.

    Every table nsys writes is read in a few linear scans, so the work is proportional to the
    file; only a view (a recursive one never ends) or a pathological schema can make SQLite
    work without bound, and the progress handler then interrupts the statement.
    """

    TICK = 100_000  # virtual-machine instructions between checks
    FLOOR = 50_000_000  # the least allowed: about a second of SQLite work
    PER_BYTE = 50  # reading any sample or real export takes under 0.5 per byte of file

    def __init__(self, path: Path) -> None:
        self.limit = max(self.FLOOR, self.PER_BYTE * path.stat().st_size)
        self.exceeded = False

    def connect(self, uri: str) -> sqlite3.Connection:
        con = sqlite3.connect(uri, uri=True)
        con.text_factory = decode_text
        steps = 0

        def tick() -> int:
            nonlocal steps
            steps += self.TICK
            if steps > self.limit:
                self.exceeded = True
                return 1  # interrupts the statement
            return 0

        con.set_progress_handler(tick, self.TICK)
        return con


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A plain connection that cannot write, for a quick look (raises InputError, OSError or
    sqlite3.Error when the file cannot be opened that way)."""
    with path.open("rb") as f:
        uri = database_uri(path, f.read(HEADER_BYTES))
    con = sqlite3.connect(uri, uri=True)
    con.text_factory = decode_text
    return con

"""Every limit and timeout nsysfrag keeps against a bad input or a stuck program, in one place.

A damaged or hostile file, or a program that never answers, must not hang a CI job or exhaust
its memory: each bound below is a :class:`Limit` with its default, the environment variable
(and the option, where there is one) that changes it, and the words the table of docs/limits.md
uses. The code that enforces a bound reads it from here, so the table and the code agree (a
test checks that page names every limit and its default).
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass

from nsysfrag.errors import InputError


@dataclass(frozen=True, slots=True)
class Limit:
    """One bound: its default, and the variable (and option) that set it."""

    what: str  # e.g. "seconds one `nsys export` may run"
    default: float
    shown: str  # the default as docs/limits.md's table writes it: "600 s", "256 MiB"
    env: str | None = None
    option: str | None = None
    integer: bool = True

    def value(self, environ: Mapping[str, str] = os.environ) -> float:
        """The bound in force: ``env`` when set (a positive number), else the default."""
        raw = environ.get(self.env, "") if self.env is not None else ""
        if not raw.strip():
            return self.default
        return self.parse(raw, self.env or "")

    def parse(self, raw: str, source: str) -> float:
        """``raw`` (from ``source``, an option or a variable) as a positive bound."""
        text = raw.strip().replace("_", "")
        try:
            number = float(text) if not self.integer else int(text)
        except ValueError:
            number = -1
        if not (0 < number < math.inf) or (self.integer and number > 2**62):
            raise InputError(
                f"{source}={raw[:40]!r}: not a positive {'count' if self.integer else 'number'};"
                f" give the {self.what} (default {self.default:g}), or leave it unset"
            )
        return number


# ----------------------------------------------------------------- programs nsysfrag starts

NSYS_QUERY_S = Limit(
    "seconds `nsys --version` or `nsys profile --help` may take", 10, "10 s",
    "NSYSFRAG_NSYS_QUERY_TIMEOUT",
    integer=False,
)
NSYS_EXPORT_S = Limit(
    "seconds one `nsys export` may run", 600, "600 s", "NSYSFRAG_NSYS_TIMEOUT", "--nsys-timeout",
    integer=False,
)
DASK_CONNECT_S = Limit(
    "seconds to reach a Dask scheduler", 10, "10 s", "NSYSFRAG_SCHEDULER_TIMEOUT", integer=False
)

# ----------------------------------------------------------------- reading an nsys export

SQLITE_STEPS_PER_BYTE = Limit(
    "SQLite virtual-machine steps per byte of the export (at least 5·10^7)", 50, "50 per byte",
    "NSYSFRAG_SQLITE_STEPS_PER_BYTE",
)
SQLITE_STEPS_FLOOR = 50_000_000
SQLITE_SECONDS = Limit(
    "seconds of SQLite work on one export: this, plus 1 s per 4 MB of it", 10,
    "10 s + 1 s per 4 MB", "NSYSFRAG_SQLITE_SECONDS", integer=False,
)
SQLITE_BYTES_PER_SECOND = 4 << 20
SQLITE_VALUE_BYTES = Limit(
    "bytes of one SQLite value (a string, a blob, a row of a view)", 256 << 20, "256 MiB",
    "NSYSFRAG_SQLITE_VALUE_BYTES",
)

# ----------------------------------------------------------------- every input

MAX_SPACES = Limit(
    "address spaces (processes × devices, or a snapshot's devices) in one input", 256, "256",
    "NSYSFRAG_MAX_SPACES",
)

# ----------------------------------------------------------------- PyTorch snapshots

PICKLE_NESTING = Limit(
    "levels a snapshot pickle may nest (its tuples and open marks)", 1000, "1,000",
    "NSYSFRAG_PICKLE_NESTING",
)

# ----------------------------------------------------------------- the history database

HISTORY_SECONDS = Limit(
    "seconds of SQLite work on the history database per statement", 10, "10 s",
    "NSYSFRAG_HISTORY_SECONDS", integer=False,
)
HISTORY_LOCK_SECONDS = Limit(
    "seconds to wait for another writer of the history database", 30, "30 s",
    "NSYSFRAG_HISTORY_LOCK_SECONDS", integer=False,
)
HISTORY_VALUE_BYTES = Limit(
    "bytes of one value stored in the history database", 1 << 20, "1 MiB",
    "NSYSFRAG_HISTORY_VALUE_BYTES",
)

# ----------------------------------------------------------------- nsysfrag record

RECORD_GRACE_S = Limit(
    "seconds a recorded program has, after a SIGINT/SIGTERM reached it, before SIGKILL", 60,
    "60 s", "NSYSFRAG_RECORD_GRACE", integer=False,
)

# ----------------------------------------------------------------- nsysfrag record --try

TRY_GRACE_S = Limit(
    "seconds a program ended by `record --duration` has to write its final snapshots", 60,
    "60 s", "NSYSFRAG_TRY_GRACE", integer=False,
)

# ----------------------------------------------------------------- documents and settings

JSON_BYTES = Limit(
    "bytes of a JSON document read back (a baseline, a compare input, a scheduler file)",
    256 << 20, "256 MiB", "NSYSFRAG_JSON_BYTES",
)
DOCUMENT_SITE_CHARS = Limit(
    "characters of one site's text in a JSON document read back (a longer one is cut, with …)",
    4096, "4,096", "NSYSFRAG_DOCUMENT_SITE_CHARS",
)
DOCUMENT_SITES = Limit(
    "sites (hotspots, sites at the memory peak) in a JSON document read back", 100_000,
    "100,000", "NSYSFRAG_DOCUMENT_SITES",
)
DOCUMENT_SITE_BYTES = Limit(
    "bytes of all site texts of a JSON document read back, once cut", 16 << 20, "16 MiB",
    "NSYSFRAG_DOCUMENT_SITE_BYTES",
)
MAX_COLUMNS = 1000  # $COLUMNS above this is taken as this (a terminal report wider than that is no use)
MAX_RANK = 2**31 - 1  # a job's rank number; PostgreSQL's INTEGER column holds no more

LIMITS: tuple[Limit, ...] = (
    NSYS_QUERY_S,
    NSYS_EXPORT_S,
    DASK_CONNECT_S,
    SQLITE_STEPS_PER_BYTE,
    SQLITE_SECONDS,
    SQLITE_VALUE_BYTES,
    MAX_SPACES,
    PICKLE_NESTING,
    HISTORY_SECONDS,
    HISTORY_LOCK_SECONDS,
    HISTORY_VALUE_BYTES,
    RECORD_GRACE_S,
    TRY_GRACE_S,
    JSON_BYTES,
    DOCUMENT_SITE_CHARS,
    DOCUMENT_SITES,
    DOCUMENT_SITE_BYTES,
)


def limit_sqlite_values(con: sqlite3.Connection, value_bytes: int) -> None:
    """No string or blob, stored or computed, longer than ``value_bytes`` on ``con``
    (SQLITE_LIMIT_LENGTH; ``Connection.setlimit`` needs Python 3.11: before it, SQLite's own
    limit of 10^9 bytes holds)."""
    setlimit = getattr(con, "setlimit", None)
    if setlimit is not None:
        setlimit(sqlite3.SQLITE_LIMIT_LENGTH, value_bytes)

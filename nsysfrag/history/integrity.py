"""The history database is nsysfrag's own, or it is refused: its schema, and every value read.

A history file may come from anywhere (a shared CI cache, a hand edit), so before any query:

- its schema holds only nsysfrag's tables and indexes (:func:`check_schema`): no view (``runs``
  redefined as a recursive view hung every ``history`` command), no trigger (an AFTER INSERT
  trigger with an endless query hung ``--record`` while it held the write lock), no virtual
  table, no generated column, and no clause in a table's definition that runs an expression
  or changes how values compare (a CHECK constraint that builds a 1 GB string on every insert
  ended ``--record`` in MemoryError; a DEFAULT, a COLLATE, a conflict clause); its indexes
  are nsysfrag's two, on its columns; its schema versions are the steps nsysfrag applies
  (1, 2, …);
- every value read back is checked against the column it came from (:func:`run_values`,
  :func:`space_values`, :func:`tag_values`): a time that is a time, a count that is a 64-bit
  integer, a ratio that is a finite number, a health that is a level, no NULL where nsysfrag
  stores none. A value nsysfrag never stores is one line naming the run and the column.

Each SQLite connection to it is bounded too (``connection.bound_work``): its values by size,
its statements by time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, NoReturn

from sqlalchemy import BigInteger, Boolean, Connection, Double, Integer, String

from nsysfrag import limits
from nsysfrag.checks.documents import HEALTH_LEVELS, describe_value
from nsysfrag.errors import InputError
from nsysfrag.history.schema import OPTIONAL_FIELDS, SPACE_FIELDS, TABLES, SpaceField

INT64 = (-(2**63), 2**63 - 1)
# The indexes nsysfrag's migrations create, and SQLite's own tables and automatic indexes.
INDEXES = frozenset({"ix_runs_recorded_at", "ix_run_tags_key_value"})
_SQLITE_OWN = re.compile(r"^sqlite_(autoindex_.*|sequence|stat\d)$")
# The index definitions nsysfrag writes, as tokens (identifiers unquoted, keywords upper-case).
INDEX_TOKENS = {
    "ix_runs_recorded_at": ["CREATE", "INDEX", "ix_runs_recorded_at", "ON", "runs", "(", "recorded_at", ")"],
    "ix_run_tags_key_value": ["CREATE", "INDEX", "ix_run_tags_key_value", "ON", "run_tags", "(", "key", ",", "value", ")"],
}  # fmt: skip
# Words of a table's definition that nsysfrag's never holds: each runs an expression when a
# row is written (CHECK, DEFAULT, GENERATED ... AS) or changes what a statement does (COLLATE,
# ON CONFLICT, WITHOUT ROWID, STRICT's type checks).
_CLAUSES = ("CHECK", "DEFAULT", "GENERATED", "AS", "COLLATE", "CONFLICT", "WITHOUT", "STRICT")
# Comments, quoted texts and identifiers, words, anything else: SQLite's own tokens, enough
# to tell a keyword from a name that only spells one.
_TOKEN = re.compile(
    r"--[^\n]*|/\*.*?(?:\*/|$)|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`(?:[^`]|``)*`|\[[^\]]*\]"
    r"|[A-Za-z_][A-Za-z0-9_$]*|\S",
    re.DOTALL,
)


def sql_tokens(sql: str) -> list[str]:
    """``sql`` as tokens: comments dropped, quoted identifiers unquoted (marked by a leading
    NUL so that none reads as a keyword), words upper-cased."""
    tokens = []
    for token in _TOKEN.findall(sql):
        if token.startswith(("--", "/*")):
            continue
        if token[0] in "\"`[":
            tokens.append("\0" + token[1:-1])
        elif token[0] == "'":
            tokens.append(token)
        else:
            tokens.append(token.upper() if token[0].isalpha() or token[0] == "_" else token)
    return tokens


def _clause(sql: str) -> str | None:
    """The first clause in a table's definition that nsysfrag never writes, or None."""
    return next((t for t in sql_tokens(sql) if t in _CLAUSES), None)


def _index_matches(name: str, sql: str) -> bool:
    expected = INDEX_TOKENS.get(name)
    got = [t.lstrip("\0").lower() for t in sql_tokens(sql)]
    return expected is not None and got == [t.lower() for t in expected]


class NotOurs(InputError):
    """The database holds something nsysfrag never writes."""


def _refuse(where: str, what: str) -> NotOurs:
    return NotOurs(
        f"history database {where}: damaged, or not an nsysfrag history ({what}, which nsysfrag"
        " never writes); move it away or point --db (or NSYSFRAG_DB) at another one"
    )


def check_schema(connection: Connection, where: str) -> None:
    """Refuse an SQLite database whose schema holds anything but nsysfrag's tables and indexes
    (an empty one passes: nsysfrag creates its tables there)."""
    if connection.dialect.name != "sqlite":
        return  # a server's schema is its administrators'; nsysfrag's tables are checked by name
    rows = connection.exec_driver_sql("SELECT type, name, tbl_name, sql FROM sqlite_master").all()
    for kind, name, _, _ in rows:  # what runs code first: it is what the user must hear of
        if kind in ("view", "trigger"):
            raise _refuse(where, f"it has a {kind} {describe_value(str(name))}")
    for kind, name, table, sql in rows:
        shown = describe_value(str(name))
        if _SQLITE_OWN.match(str(name)):
            continue
        if kind == "table" and name not in TABLES:
            raise _refuse(where, f"it has a table {shown}")
        if kind == "table" and str(sql or "").lstrip().upper().startswith("CREATE VIRTUAL"):
            raise _refuse(where, f"its table {shown} is a virtual table")
        if kind == "index" and (name not in INDEXES or table not in TABLES):
            raise _refuse(where, f"it has an index {shown}")
        if kind == "index" and not _index_matches(str(name), str(sql or "")):
            raise _refuse(where, f"its index {shown} is not the one nsysfrag creates")
    for table in TABLES:
        for column in connection.exec_driver_sql(f'PRAGMA table_xinfo("{table}")').all():
            if column[-1] in (2, 3):  # hidden: 2 a virtual generated column, 3 a stored one
                raise _refuse(where, f"its table {table} has a generated column {column[1]!r}")
    for kind, name, _, sql in rows:
        if kind == "table" and (clause := _clause(str(sql or ""))) is not None:
            raise _refuse(where, f"its table {describe_value(str(name))} has a {clause} clause")


def check_database(connection: Connection, where: str) -> None:
    """:func:`check_schema`, then the schema versions stored: steps numbered from 1."""
    check_schema(connection, where)
    if connection.dialect.name != "sqlite":
        return
    named = connection.exec_driver_sql(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).first()
    if named is None:
        return
    for (version,) in connection.exec_driver_sql("SELECT version FROM schema_version").all():
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise _refuse(where, f"its schema version is {describe_value(version)}")


def _integer(value: Any, lo: int = INT64[0], hi: int = INT64[1]) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _finite(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) < 2**64
    )


def _moment(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value.replace(tzinfo=None) if value.tzinfo is None else value
    if isinstance(value, str) and len(value) <= 40:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def _text(value: Any, optional: bool) -> bool:
    return (value is None and optional) or isinstance(value, str)


_RUN_CHECKS: dict[str, Callable[[Any], bool]] = {
    "trace_path": lambda v: _text(v, False),
    "trace_sha256": lambda v: _text(v, False),
    "model": lambda v: _text(v, False),
    "nsys_version": lambda v: _text(v, True),
    "host": lambda v: _text(v, True),
    "label": lambda v: _text(v, True),
    "nsysfrag_version": lambda v: _text(v, True),
    "granularity_bytes": lambda v: _integer(v, 1),
    "capacity_override_bytes": lambda v: _integer(v, 0),
    "rank": lambda v: v is None or _integer(v, 0, limits.MAX_RANK),
}


def run_values(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A ``runs`` row, checked; ``recorded_at`` as a naive UTC datetime."""
    run = row.get("id")
    if not _integer(run, 1):
        raise _refuse(where, f"a run's id is {describe_value(run)}")
    checks = _RUN_CHECKS
    values = dict(row)
    for column, good in checks.items():
        if column in values and not good(values[column]):
            raise _refuse(where, f"run {run}'s {column} is {describe_value(values[column])}")
    moment = _moment(values.get("recorded_at"))
    if moment is None:
        raise _refuse(where, f"run {run}'s recorded_at is {describe_value(values.get('recorded_at'))}")
    values["recorded_at"] = moment
    return values


def _space_check(f: SpaceField) -> Callable[[Any], bool]:
    if f.type in (BigInteger, Integer):
        return _integer
    if f.type is Double:
        return _finite
    if f.type is Boolean:
        return lambda v: v in (0, 1, True, False)
    if f.path == "health":
        return lambda v: v in HEALTH_LEVELS
    assert f.type is String
    optional = f.path in OPTIONAL_FIELDS
    return lambda v: _text(v, optional)


# Each column of a space, its path and its check, worked out once: a history of 200,000 runs
# checks 9 M of them.
_SPACE_CHECKS = tuple(
    (f.column, f.path, _space_check(f), f.path in OPTIONAL_FIELDS, f.type is Boolean)
    for f in SPACE_FIELDS
)


_BY_KIND: dict[str, tuple[tuple[str, str], ...]] = {
    kind: tuple((f.column, f.path) for f in SPACE_FIELDS if which(f))
    for kind, which in {
        "integer": lambda f: f.type in (BigInteger, Integer),
        "double": lambda f: f.type is Double,
        "boolean": lambda f: f.type is Boolean,
        "text": lambda f: f.type is String and f.path != "health" and f.path not in OPTIONAL_FIELDS,
        "optional": lambda f: f.type is String and f.path in OPTIONAL_FIELDS,
    }.items()
}
_LIMIT = float(2**64)


def _all_good(row: Mapping[str, Any]) -> bool:
    """The checks of :data:`_SPACE_CHECKS` on every column at once, for exact types (what the
    driver gives): True only where each of them holds. 200,000 rows in 1 s, not 5."""
    ints = [row.get(c) for c, _ in _BY_KIND["integer"]]
    doubles = [row.get(c) for c, _ in _BY_KIND["double"]]
    return (
        all(type(v) is int for v in ints)
        and INT64[0] <= min(ints) and max(ints) <= INT64[1]
        and all((type(v) is float or type(v) is int) and -_LIMIT < v < _LIMIT for v in doubles)
        and all(row.get(c) in (0, 1) for c, _ in _BY_KIND["boolean"])
        and all(type(row.get(c)) is str for c, _ in _BY_KIND["text"])
        and all(row.get(c) is None or type(row.get(c)) is str for c, _ in _BY_KIND["optional"])
        and row.get("health") in HEALTH_LEVELS
    )  # fmt: skip


def space_row_values(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A ``run_spaces`` row, checked, by SPACE_FIELDS path."""
    if _all_good(row):
        return {path: bool(row.get(column)) if boolean else row.get(column)
                for column, path, _, _, boolean in _SPACE_CHECKS}  # fmt: skip
    values: dict[str, Any] = {}
    for column, path, good, optional, boolean in _SPACE_CHECKS:
        value = row.get(column)
        if not good(value) and not (value is None and optional):
            raise _refuse(
                where,
                f"a space of run {row.get('run_id')} stores {column} = {describe_value(value)}",
            )
        values[path] = bool(value) if boolean else value
    return values


def extra_value(
    row: Mapping[str, Any], where: str
) -> tuple[tuple[int, int, int, str], str, float]:
    """A ``run_space_values`` row, checked: (its space, the metric's path, the value)."""
    run, pid, device = row.get("run_id"), row.get("pid"), row.get("device")
    model, path, value = row.get("model"), row.get("path"), row.get("value")
    if not (
        _integer(run, 1) and _integer(pid) and _integer(device) and _text(model, False)
        and _text(path, False) and _finite(value)
    ):  # fmt: skip
        raise _bad_value_row(row, where)
    return (run, pid, device, model), path, float(value)


def _bad_value_row(row: Mapping[str, Any], where: str) -> NotOurs:
    shown = ", ".join(
        describe_value(row.get(c)) for c in ("run_id", "pid", "device", "model", "path", "value")
    )
    return _refuse(where, f"a space value row holds ({shown})")


# A ``run_space_values`` row that :func:`extra_value` takes, as an SQLite condition: the same
# checks (SQLite's integers are 64-bit; a NaN is stored as NULL; 2^64 is exact as a double),
# so that 10 M values are checked in SQLite, not one by one in Python.
SQLITE_VALUE_ROW_OK = (
    "typeof(run_id) = 'integer' AND run_id >= 1 AND typeof(pid) = 'integer'"
    " AND typeof(device) = 'integer' AND typeof(model) = 'text' AND typeof(path) = 'text'"
    " AND (typeof(value) = 'integer' OR (typeof(value) = 'real'"
    " AND value > -18446744073709551616.0 AND value < 18446744073709551616.0))"
)


def refuse_value_row(row: Mapping[str, Any], where: str) -> NoReturn:
    """Refuse a row :data:`SQLITE_VALUE_ROW_OK` failed, in :func:`extra_value`'s words."""
    extra_value(row, where)
    raise _bad_value_row(row, where)  # the two checks disagree: still never a value read as good


def tag_values(row: Mapping[str, Any], where: str) -> tuple[int, str, str]:
    run, key, value = row.get("run_id"), row.get("key"), row.get("value")
    if not _integer(run, 1) or not isinstance(key, str) or not isinstance(value, str):
        shown = ", ".join(describe_value(v) for v in (run, key, value))
        raise _refuse(where, f"a tag row holds ({shown})")
    return run, key, value

"""Fuzz: damaged copies of the sample exports, at the SQL level and the byte level, hold the
hostile-input contract (``in_process.run_in_process``).

SQL-level mutations: cells set to NULL, text, blobs, floats, extreme or negative integers and
huge strings; tables and columns dropped or renamed; rows duplicated. Byte-level mutations,
applied after them: bits flipped, whole pages overwritten, the file truncated. Then one command
runs on the result. CI runs a few examples (tests/conftest.py: FUZZ_CI_EXAMPLES); a local run
takes thousands:

    .venv/bin/python -m pytest tests/hostile/test_fuzz_sqlite.py --hypothesis-profile fuzz
    NSYSFRAG_FUZZ_EXAMPLES=10000 .venv/bin/python -m pytest tests/hostile/test_fuzz_sqlite.py

(``ulimit -v 4194304`` around it adds the contract's address-space limit.)
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import SAMPLES, fuzz_examples
from tests.hostile.in_process import run_in_process

FUZZED = ("caching_allocator.sqlite", "churn_anomalies.sqlite", "multi_gpu.sqlite")
PAGE = 4096


def _schema(name: str) -> dict[str, list[str]]:
    con = sqlite3.connect(f"file:{SAMPLES / name}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: [r[1] for r in con.execute(f"PRAGMA table_info({t})")] for t in tables}
    finally:
        con.close()


SCHEMAS = {name: _schema(name) for name in FUZZED if (SAMPLES / name).exists()}

VALUES = st.one_of(
    st.sampled_from(["NULL", "''", "'x'", "X'00'", "X'FFFE'", "1.5", "-0.0", "1e308", "'12'",
                     "CAST(X'FF80' AS TEXT)", "'1) OR (1'", "-1", "0"]),
    st.integers(-(1 << 63), (1 << 63) - 1).map(str),
    st.sampled_from([0, 1, 31, 32, 62, 63]).map(lambda k: str((1 << k) - 1 if k == 63 else 1 << k)),
    st.integers(1, 1 << 22).map(lambda n: f"hex(zeroblob({n}))"),  # up to an 8 MB string
    st.text(max_size=20).map(lambda s: "'" + s.replace("'", "''").replace("\x00", "") + "'"),
)


@st.composite
def sql_mutation(draw: st.DrawFn, schema: dict[str, list[str]]) -> list[str]:
    table = draw(st.sampled_from(sorted(schema)))
    column = draw(st.sampled_from(schema[table]))
    kind = draw(st.sampled_from(["cell", "cell", "cell", "column", "drop_table", "drop_column",
                                 "rename_table", "rename_column", "duplicate", "loosen"]))
    if kind == "cell":
        row = f"(SELECT rowid FROM {table} LIMIT 1 OFFSET {draw(st.integers(0, 60))})"
        return [f"UPDATE {table} SET {column} = {draw(VALUES)} WHERE rowid = {row}"]
    if kind == "column":
        return [f"UPDATE {table} SET {column} = {draw(VALUES)}"]
    if kind == "drop_table":
        return [f"DROP TABLE {table}"]
    if kind == "drop_column":
        return [f"ALTER TABLE {table} DROP COLUMN {column}"]
    if kind == "rename_table":
        other = draw(st.sampled_from(sorted(schema)))
        return [f"DROP TABLE {other}", f"ALTER TABLE {table} RENAME TO {other}"]
    if kind == "rename_column":
        new = draw(st.sampled_from(["x", column + "_v2", column.upper(), "rowid"]))
        return [f"ALTER TABLE {table} RENAME COLUMN {column} TO {new}"]
    if kind == "duplicate":
        return [f"INSERT INTO {table} SELECT * FROM {table} LIMIT {draw(st.integers(1, 500))}"]
    # Without its declared types and NOT NULL, any value fits any column.
    return [f"CREATE TABLE loose AS SELECT * FROM {table}", f"DROP TABLE {table}",
            f"ALTER TABLE loose RENAME TO {table}"]


@st.composite
def byte_mutation(draw: st.DrawFn, size: int) -> tuple[Any, ...]:
    kind = draw(st.sampled_from(["flip", "flip", "page", "truncate"]))
    if kind == "flip":
        return ("flip", draw(st.integers(0, size - 1)), draw(st.integers(0, 7)))
    if kind == "page":
        fill = draw(st.sampled_from([b"\x00", b"\xff", b"\xa5", b"\x0d"]))
        return ("page", draw(st.integers(0, size // PAGE - 1)), fill)
    return ("truncate", draw(st.integers(1, size - 1)))


@st.composite
def damaged_exports(draw: st.DrawFn) -> tuple[str, list[list[str]], list[tuple[Any, ...]], str]:
    name = draw(st.sampled_from(sorted(SCHEMAS)))
    size = (SAMPLES / name).stat().st_size
    sql = draw(st.lists(sql_mutation(SCHEMAS[name]), max_size=4))
    raw = draw(st.lists(byte_mutation(size), max_size=3))
    command = draw(st.sampled_from(["json", "json", "terminal", "whatif"]))
    return name, sql, raw, command


def _damage(path: Path, sql: list[list[str]], raw: list[tuple[Any, ...]]) -> None:
    con = sqlite3.connect(path)
    try:
        for statements in sql:
            try:
                for s in statements:
                    con.execute(s)
                con.commit()
            except sqlite3.Error:  # e.g. a NOT NULL column, or a column an index needs
                con.rollback()
    finally:
        con.close()
    data = bytearray(path.read_bytes())
    for mutation in raw:
        if mutation[0] == "flip" and mutation[1] < len(data):
            data[mutation[1]] ^= 1 << mutation[2]
        elif mutation[0] == "page":
            data[mutation[1] * PAGE : (mutation[1] + 1) * PAGE] = mutation[2] * PAGE
        elif mutation[0] == "truncate":
            del data[mutation[1] :]
    path.write_bytes(bytes(data))


@settings(
    max_examples=fuzz_examples(),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(damaged_exports())
def test_damaged_exports_hold_the_contract(
    case: tuple[str, list[list[str]], list[tuple[Any, ...]], str],
) -> None:
    name, sql, raw, command = case
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes((SAMPLES / name).read_bytes())
        _damage(path, sql, raw)
        out = Path(folder) / "out"
        args = {
            "json": ["analyze", str(path), "--json", f"{out}.json", "--csv", f"{out}.csv", "-q"],
            "terminal": ["analyze", str(path)],
            "whatif": ["whatif", str(path), "--policy", "best-fit", "--json", f"{out}.json", "-q"],
        }[command]
        run_in_process(args, inputs=[path])

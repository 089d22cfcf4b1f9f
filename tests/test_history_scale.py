"""A big history read fast and whole (issue 33, item 9): ``history --json`` of 200,000 runs.

Its speed comes from three shortcuts, each held here to the slow way it replaces: a run's JSON
text from templates (``render.run_json``) against ``json.dumps``; the other values checked in
SQLite (``integrity.SQLITE_VALUE_ROW_OK``) against ``extra_value``; a space row's columns
checked at once (``integrity._all_good``) against each column's own check. And a value refused
in the middle of the stream leaves nothing on stdout. ``benchmarks/bench_history.py`` times it.
"""

from __future__ import annotations

import io
import json
import math
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsysfrag.history import StoredRun, StoredSpace, open_store
from nsysfrag.history.connection import bound_work
from nsysfrag.history.integrity import (
    _SPACE_CHECKS,
    SQLITE_VALUE_ROW_OK,
    NotOurs,
    _all_good,
    extra_value,
    space_row_values,
)
from nsysfrag.history.render import dumps, json_document, run_json, write_json
from nsysfrag.history.schema import SPACE_FIELDS
from tests.conftest import SAMPLES, fuzz_examples
from tests.hostile.contract import run_nsysfrag
from tests.hostile.test_fuzz_sqlite import VALUES

SETTINGS = settings(max_examples=fuzz_examples(), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
# Chunks of 500 runs: a refusal in the last of 1,100 runs comes after two chunks were written.
RUNS = 1100

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["%s", "%", "\x00", "\u2028", '"\\', "\ud800"]),
)  # fmt: skip
TEXT = st.text(max_size=12) | st.sampled_from(["%s", "%(x)s", "\x1b[2J", "\ud800", '"'])


@st.composite
def stored_runs(draw: st.DrawFn) -> StoredRun:
    paths = [f.path for f in SPACE_FIELDS]
    spaces = tuple(
        StoredSpace({p: draw(SCALARS) for p in draw(st.sampled_from([paths, paths[:7], paths[3:]]))})
        for _ in range(draw(st.integers(0, 3)))
    )
    return StoredRun(
        id=draw(st.integers(1, 2**63 - 1)),
        recorded_at=datetime(2025, 1, 1, tzinfo=timezone.utc),
        trace_path=draw(TEXT), trace_sha256=draw(TEXT), model=draw(TEXT),
        granularity_bytes=draw(st.integers(1, 2**40)),
        capacity_override_bytes=draw(st.none() | st.integers(1, 2**40)),
        nsys_version=draw(st.none() | TEXT), host=draw(st.none() | TEXT),
        label=draw(st.none() | TEXT), nsysfrag_version=draw(st.none() | TEXT),
        tags=draw(st.dictionaries(TEXT, TEXT, max_size=3)), spaces=spaces,
        rank=draw(st.none() | st.integers(0, 2**20)),
    )  # fmt: skip


@SETTINGS
@given(stored_runs(), st.integers(0, 3))
def test_a_runs_text_is_json_dumps_byte_for_byte(run: StoredRun, level: int) -> None:
    expected = json.dumps(run.document(), indent=2, ensure_ascii=False)
    assert run_json(run, level) == expected.replace("\n", "\n" + "  " * level)


@SETTINGS
@given(st.lists(stored_runs(), max_size=3))
def test_the_streamed_document_is_the_whole_one(runs: list[StoredRun]) -> None:
    out = io.StringIO()
    write_json(runs, "where %s", out)
    assert out.getvalue() == dumps(json_document(runs, "where %s"))


# ---------------------------------------------------------------- the checks done in bulk

_COLUMNS = ("run_id", "pid", "device", "model", "path", "value")
_GOOD = ("1", "4101", "0", "'observed'", "'ooms.count'", "0.5")
_HOSTILE = ["NULL", "''", "'x'", "X'00'", "1.5", "-0.0", "1e308", "-1e308", "1e400", "-1e400",
            "'12'", "CAST(X'FF80' AS TEXT)", "-1", "0", "9223372036854775807",
            "-9223372036854775808", "18446744073709551616.0", "18446744073709549568.0",
            "-18446744073709551616.0", "0.0 / 0"]  # fmt: skip


def _sql_and_python_verdicts(column: int, literal: str) -> tuple[bool, bool]:
    con = sqlite3.connect(":memory:")
    bound_work(con)  # the history's own reading of text
    con.execute(f"CREATE TABLE v ({', '.join(_COLUMNS)})")  # no types: any value stays as it is
    values = [*_GOOD]
    values[column] = literal
    con.execute(f"INSERT INTO v VALUES ({', '.join(values)})")
    sql_ok = bool(con.execute(f"SELECT {SQLITE_VALUE_ROW_OK} FROM v").fetchone()[0])
    row = dict(zip(_COLUMNS, con.execute("SELECT * FROM v").fetchone(), strict=True))
    try:
        extra_value(row, "here")
        python_ok = True
    except NotOurs:
        python_ok = False
    return sql_ok, python_ok


@pytest.mark.parametrize("column", range(len(_COLUMNS)))
@pytest.mark.parametrize("literal", _HOSTILE)
def test_sqlite_checks_a_value_row_as_python_does(column: int, literal: str) -> None:
    sql_ok, python_ok = _sql_and_python_verdicts(column, literal)
    assert sql_ok == python_ok, (_COLUMNS[column], literal)


@SETTINGS
@given(st.integers(0, len(_COLUMNS) - 1), VALUES.filter(lambda v: "zeroblob" not in v))
def test_sqlite_checks_any_value_row_as_python_does(column: int, literal: str) -> None:
    sql_ok, python_ok = _sql_and_python_verdicts(column, literal)
    assert sql_ok == python_ok, (_COLUMNS[column], literal)


ROW_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.binary(max_size=2),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["ok", "warn", "x", ""]),
    st.sampled_from([2.0**64, -(2.0**64), 2**63, -(2**63) - 1, 1.0, 0.0]),
)  # fmt: skip


@SETTINGS
@given(st.data())
def test_a_space_row_checked_at_once_is_checked_column_by_column(data: st.DataObject) -> None:
    good = {f.column: _typical(f.path) for f in SPACE_FIELDS}
    row: dict[str, Any] = {"run_id": 1, **good}
    for column in data.draw(st.lists(st.sampled_from(sorted(good)), max_size=3)):
        row[column] = data.draw(ROW_VALUES)
    each = all(ok(row[c]) or (row[c] is None and optional) for c, _, ok, optional, _ in _SPACE_CHECKS)
    if _all_good(row):
        assert each
    try:
        values = space_row_values(row, "here")
    except NotOurs:
        assert not each
    else:
        assert each
        assert values == {f.path: bool(row[f.column]) if f.path == "span_mode" else row[f.column]
                          for f in SPACE_FIELDS}  # fmt: skip


def _typical(path: str) -> Any:
    field = next(f for f in SPACE_FIELDS if f.path == path)
    return {"health": "ok", "span_mode": 0}.get(path, "text" if not field.numeric else 1.5
                                                if field.type.__name__ == "Double" else 7)


def test_a_typical_space_row_takes_the_fast_check() -> None:
    assert _all_good({"run_id": 1, **{f.column: _typical(f.path) for f in SPACE_FIELDS}})


# ---------------------------------------------------------------- nothing half written


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A history of RUNS runs: one recorded, copied inside SQLite (new ids, times, hashes)."""
    db = tmp_path_factory.mktemp("big") / "history.sqlite"
    run_nsysfrag(["analyze", SAMPLES / "multi_gpu.sqlite", "-q", "--record", "--db", db,
                  "--tag", "k=v"])  # fmt: skip
    con = sqlite3.connect(db)
    count = f"WITH RECURSIVE n(i) AS (SELECT 2 UNION ALL SELECT i + 1 FROM n WHERE i < {RUNS})"
    columns = {t: [r[1] for r in con.execute(f"PRAGMA table_info({t})")]
               for t in ("runs", "run_tags", "run_spaces", "run_space_values")}  # fmt: skip
    made = {"id": "n.i", "run_id": "n.i", "trace_sha256": "printf('%064x', n.i)",
            "recorded_at": "strftime('%Y-%m-%d %H:%M:%S', '2025-01-01', '+' || n.i || ' minutes')"}
    with con:
        for table, names in columns.items():
            picked = ", ".join(made.get(c, f"t.{c}") for c in names)
            con.execute(f"{count} INSERT INTO {table} SELECT {picked} FROM n, {table} t"
                        f" WHERE t.{'id' if table == 'runs' else 'run_id'} = 1")  # fmt: skip
    con.execute("PRAGMA journal_mode = DELETE")
    con.close()
    return db


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE run_space_values SET value = 'x' WHERE run_id = 2 AND path = 'ooms.count'",
        "UPDATE run_spaces SET max_global_frag = 1e400 WHERE run_id = 2",
        "UPDATE runs SET recorded_at = 'later' WHERE id = 2",
    ],
)
@pytest.mark.parametrize("only", [[], ["--limit", str(RUNS)]])  # every run: checked first
def test_a_value_refused_late_leaves_no_document(
    big: Path, tmp_path: Path, damage: str, only: list[str]
) -> None:
    # main: the runs before it were on stdout already, a document with no end
    db = tmp_path / "history.sqlite"
    db.write_bytes(big.read_bytes())
    con = sqlite3.connect(db)
    with con:
        con.execute(damage)
    con.close()
    out = run_nsysfrag(["history", "--json", "-", *only, "--db", db], inputs=[db])
    assert out.returncode == 2 and out.stdout == "", out.stdout[:200]
    assert len(out.stderr.strip().splitlines()) == 1
    assert "run 2" in out.stderr or "(2, " in out.stderr, out.stderr
    target = tmp_path / "runs.json"
    out = run_nsysfrag(["history", "--json", target, *only, "--db", db], inputs=[db])
    assert out.returncode == 2 and not target.exists() and not list(tmp_path.glob("*.part"))


def test_the_whole_document_reaches_stdout(big: Path) -> None:
    out = run_nsysfrag(["history", "--json", "-", "--db", big], inputs=[big])
    document = json.loads(out.stdout)
    assert [r["id"] for r in document["runs"]] == [1, *range(RUNS, 1, -1)]
    with open_store(str(big), create=False) as store:
        assert out.stdout == dumps(json_document(store.runs(), store.location))
        assert all(s.extra for r in store.runs() for s in r.spaces)  # values read for trends
        assert not any(s.extra for r in store.iter_runs(values=False) for s in r.spaces)
    assert not math.isnan(document["runs"][0]["spaces"][0]["max"]["global_frag"])

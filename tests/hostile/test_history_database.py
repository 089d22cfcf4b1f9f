"""A hostile history database (issue 25, item 5): nsysfrag's own, or refused in one line.

The schema is checked before any query (no view, no trigger, no foreign table; schema
versions from 1), every value read is checked against its column, every stored text reaches the
terminal escaped, a FIFO is refused before SQLite opens it, and reading a WAL database leaves
no file beside it (``nsysfrag/history/integrity.py``, ``connection.py``).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import SAMPLES
from tests.hostile.contract import run_nsysfrag
from tests.hostile.nsys_cases import sql as _sql

TRACES = [SAMPLES / "multi_gpu.sqlite", SAMPLES / "caching_allocator.sqlite"]
ESCAPES = "\x1b[2J\x1b]8;;http://evil.example\x07x\x1b]8;;\x07 \u202e\r\n"
HISTORY_COMMANDS = [
    ["history"],
    ["history", "--json", "-"],
    ["history", "--trend", "global_frag"],
    ["history", "--check"],
]
ENDLESS = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT max(i) FROM n"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A history of two runs, as nsysfrag writes it (WAL mode)."""
    db = tmp_path_factory.mktemp("history") / "history.sqlite"
    for trace in TRACES:
        run_nsysfrag(["analyze", trace, "-q", "--record", "--db", db, "--label", trace.stem])
    return db


@pytest.fixture
def db(recorded: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "history.sqlite"
    shutil.copy(recorded, copy)
    return copy


def _every_command(db: Path, said: str) -> None:
    for argv in HISTORY_COMMANDS:
        out = run_nsysfrag([*argv, "--db", db], inputs=[db])
        assert out.returncode == 2 and said in out.stderr, (argv, out.stderr)
    out = run_nsysfrag(["analyze", SAMPLES / "churn_anomalies.sqlite", "-q", "--record", "--db", db],
                       inputs=[db])  # fmt: skip
    assert out.returncode == 2 and said in out.stderr, out.stderr


# ---------------------------------------------------------------- a schema that is not ours


def test_runs_redefined_as_an_endless_view_is_refused(db: Path) -> None:
    # main: every history command hung
    _sql(db, "ALTER TABLE runs RENAME TO old_runs",
         f"CREATE VIEW runs AS SELECT o.* FROM old_runs o, ({ENDLESS})")  # fmt: skip
    _every_command(db, "it has a view 'runs'")


def test_a_trigger_that_never_ends_is_refused_before_recording(db: Path) -> None:
    # main: --record hung, holding the database's write lock
    _sql(db, f"CREATE TRIGGER slow AFTER INSERT ON runs BEGIN SELECT ({ENDLESS}); END")
    _every_command(db, "it has a trigger 'slow'")


@pytest.mark.parametrize(
    ("statement", "said"),
    [
        ("CREATE TABLE extra (x)", "it has a table 'extra'"),
        ("CREATE INDEX heavy ON runs (length(label))", "it has an index 'heavy'"),
        ("ALTER TABLE runs ADD COLUMN g AS (upper(label))", "generated column 'g'"),
        ("INSERT INTO schema_version VALUES (-5, '2025-01-01')", "schema version is -5"),
    ],
)
def test_anything_but_our_schema_is_refused(db: Path, statement: str, said: str) -> None:
    _sql(db, statement)
    _every_command(db, said)


def test_a_fifo_as_the_database_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    # main: blocked forever in the open
    fifo = tmp_path / "history.sqlite"
    os.mkfifo(fifo)
    for argv in (["history"], ["analyze", TRACES[0], "-q", "--record"]):
        out = run_nsysfrag(argv, env={"NSYSFRAG_DB": str(fifo)})
        assert out.returncode == 2 and "is a FIFO" in out.stderr


# ---------------------------------------------------------------- values nsysfrag never stores


def _loosened(db: Path, table: str) -> None:
    """``table`` without its declared types and NOT NULLs: any value fits any column."""
    _sql(db, "PRAGMA foreign_keys = OFF", f"CREATE TABLE loose AS SELECT * FROM {table}",
         f"DROP TABLE {table}", f"ALTER TABLE loose RENAME TO {table}")  # fmt: skip


@pytest.mark.parametrize(
    ("statements", "said"),
    [
        (["UPDATE runs SET recorded_at = 'garbage'"], "recorded_at is 'garbage'"),
        (["UPDATE run_spaces SET device = 1e400 WHERE rowid = (SELECT min(rowid) FROM run_spaces)"],
         "stores device = inf"),
        (["UPDATE run_spaces SET health = 'fine'"], "stores health = 'fine'"),
        (["UPDATE run_spaces SET max_global_frag = 'x'"], "stores max_global_frag = 'x'"),
        (["UPDATE runs SET rank = 1e30"], "rank is 1e+30"),
        (["UPDATE runs SET label = hex(zeroblob(25000000))"], "larger than 1,048,576 bytes"),
        (["UPDATE run_tags SET value = 5"], None),  # SQLite stores 5 as text in a TEXT column
    ],
)
def test_garbage_in_stored_columns_is_one_line(db: Path, statements: list[str], said: str | None) -> None:
    # main: internal errors (ValueError: Couldn't parse datetime string, OverflowError,
    # KeyError), or the 50 MB label printed
    _sql(db, "INSERT INTO run_tags SELECT id, 'k', 'v' FROM runs", *statements)
    for argv in HISTORY_COMMANDS:
        out = run_nsysfrag([*argv, "--db", db], inputs=[db], allowed_codes=(0, 1, 2))
        if said is None:
            assert out.returncode in (0, 1)  # --check: the second run regressed
        else:
            assert out.returncode == 2 and said in out.stderr, (argv, out.stderr)


@pytest.mark.parametrize(
    ("table", "column"),
    [("runs", "trace_path"), ("runs", "recorded_at"), ("run_spaces", "pid"), ("run_tags", "key")],
)
def test_null_where_nsysfrag_stores_none_is_one_line(db: Path, table: str, column: str) -> None:
    _sql(db, "INSERT INTO run_tags SELECT id, 'k', 'v' FROM runs")
    _loosened(db, table)
    _sql(db, f"UPDATE {table} SET {column} = NULL")
    for argv in HISTORY_COMMANDS:
        out = run_nsysfrag([*argv, "--db", db], inputs=[db])
        assert out.returncode == 2 and "null" in out.stderr, (argv, out.stderr)


# ---------------------------------------------------------------- stored text on a terminal


def test_stored_text_reaches_the_terminal_escaped(db: Path) -> None:
    # main: the stored model (--trend) and health (the listing) reached the terminal raw
    con = sqlite3.connect(db)
    with con:
        con.execute("UPDATE run_spaces SET model = ?, device_name = ?, process_name = ?",
                    (f"observed{ESCAPES}", ESCAPES, ESCAPES))  # fmt: skip
        con.execute("UPDATE runs SET label = ?, host = ?, trace_path = ?", (ESCAPES, ESCAPES, ESCAPES))
    con.close()
    for argv in (*HISTORY_COMMANDS[:1], HISTORY_COMMANDS[2], ["history", "--trend", "free_blocks"]):
        for columns in ("80", "400"):
            out = run_nsysfrag([*argv, "--db", db], inputs=[db], env={"COLUMNS": columns})
            assert out.returncode == 0
            for char in ("\x1b", "\x07", "\u202e", "\r"):
                assert char not in out.stdout and char not in out.stderr, (argv, char)
    trend = run_nsysfrag(["history", "--trend", "global_frag", "--db", db], env={"COLUMNS": "400"})
    assert "observed\\x1b[2J" in trend.stdout


# ---------------------------------------------------------------- reading never writes


def test_reading_a_wal_history_leaves_no_file_beside_it(db: Path) -> None:
    # main: -shm and -wal files were left beside the database
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()
    for argv in HISTORY_COMMANDS:
        run_nsysfrag([*argv, "--db", db], inputs=[db], allowed_codes=(0, 1))
        assert sorted(p.name for p in db.parent.iterdir()) == ["history.sqlite"], argv


# ---------------------------------------------------------------- a writer holding the lock


def test_a_locked_history_waits_then_says_so_and_never_shows_uncommitted_values(db: Path) -> None:
    # main: waited 30 s, called the file "on read-only storage", opened it immutable and listed
    # the other writer's uncommitted values.
    _sql(db, "PRAGMA journal_mode = DELETE")
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        writer.execute("PRAGMA cache_size = 1")  # its changes reach the file before it commits
        writer.execute("BEGIN EXCLUSIVE")
        writer.execute("UPDATE run_spaces SET health = 'critical'")
        writer.execute("UPDATE run_space_values SET value = 987654.0")
        for argv in (["history"], ["history", "--json", "-"], ["history", "--trend", "global_frag"]):
            out = run_nsysfrag([*argv, "--db", db], env={"NSYSFRAG_HISTORY_LOCK_SECONDS": "1"})
            assert out.returncode == 2, (argv, out.stdout[-500:])
            assert "locked by another writer" in out.stderr and "try again" in out.stderr
            assert "987654" not in out.stdout and "critical" not in out.stdout
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert run_nsysfrag(["history", "--db", db]).returncode == 0


# ------------------------------------------------- clauses that run code or cost, edited in

COSTLY = "length(hex(zeroblob(400000000))) > 0"  # an 800 MB string on every row written


def _edit_schema(db: Path, name: str, old: str, new: str) -> None:
    con = sqlite3.connect(db)
    try:
        con.execute("PRAGMA writable_schema = ON")
        con.execute("UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE name = ?", (old, new, name))
        con.commit()
    finally:
        con.close()


def test_a_check_constraint_edited_into_the_values_is_refused(db: Path) -> None:
    # main: analyze --record ran 16 s to 3.5 GB and ended in MemoryError
    _edit_schema(db, "run_space_values", "value DOUBLE NOT NULL", f"value DOUBLE NOT NULL CHECK ({COSTLY})")
    _every_command(db, "its table 'run_space_values' has a CHECK clause")


@pytest.mark.parametrize(
    ("name", "old", "new", "said"),
    [
        ("run_tags", "value VARCHAR NOT NULL", "value VARCHAR NOT NULL DEFAULT (hex(zeroblob(400000000)))",
         "its table 'run_tags' has a DEFAULT clause"),
        ("runs", "label VARCHAR", "label VARCHAR COLLATE NOCASE", "its table 'runs' has a COLLATE clause"),
        ("runs", "host VARCHAR", "host VARCHAR /* a comment */ CONSTRAINT c CHECK (1)",
         "its table 'runs' has a CHECK clause"),
        ("ix_runs_recorded_at", "(recorded_at)", f"(recorded_at) WHERE {COSTLY}",
         "its index 'ix_runs_recorded_at' is not the one nsysfrag creates"),
        ("ix_runs_recorded_at", "(recorded_at)", "(hex(zeroblob(400000000)))",
         "its index 'ix_runs_recorded_at' is not the one nsysfrag creates"),
    ],
)  # fmt: skip
def test_a_clause_that_runs_code_or_compares_otherwise_is_refused(
    db: Path, name: str, old: str, new: str, said: str
) -> None:
    _edit_schema(db, name, old, new)
    for argv in (["history", "--db", db], ["analyze", SAMPLES / "churn_anomalies.sqlite", "-q", "--record", "--db", db]):
        out = run_nsysfrag(argv, inputs=[db])
        assert out.returncode == 2 and said in out.stderr, (argv, out.stderr)


def test_names_that_only_spell_a_clause_are_not_clauses() -> None:
    from nsysfrag.history.integrity import sql_tokens

    tokens = sql_tokens('CREATE TABLE t ("check" INT, [default] INT, `as` INT) -- CHECK (x)\n/* COLLATE */')
    assert not {"CHECK", "DEFAULT", "AS", "COLLATE"} & set(tokens)


def test_history_json_streams_the_same_bytes(db: Path) -> None:
    # main: the document of 200,000 runs was built whole (> 120 s, 1.7 GB); now one chunk of
    # runs at a time, written as it is read.
    import io

    from nsysfrag.history import open_store
    from nsysfrag.history.render import dumps, json_document, write_json

    with open_store(str(db), create=False) as store:
        whole = dumps(json_document(store.runs(), store.location))
        assert '"runs": [\n    {' in whole
        for chunk in (1, 2, 500):
            out = io.StringIO()
            write_json(store.iter_runs(chunk=chunk), store.location, out)
            assert out.getvalue() == whole
    out = io.StringIO()
    write_json([], "nowhere", out)
    assert out.getvalue() == dumps(json_document([], "nowhere"))
    assert run_nsysfrag(["history", "--json", "-", "--db", db]).stdout == whole

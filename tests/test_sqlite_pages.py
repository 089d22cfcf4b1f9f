"""The page decoder (nsysfrag.inputs.nsys.sqlite_pages) held to SQLite itself: on random tables
of every value type, page size and depth it returns exactly what SQLite's own query returns, or
None (the reader then asks SQLite), and None only where the rows hold something it must not
decode."""

from __future__ import annotations

import os
import subprocess
import sys
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsysfrag.inputs.nsys import sqlite_pages as pages
from tests.hostile.child_fuzz import fuzz_in_child



@pytest.fixture(autouse=True)
def _compiled_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoder is a compiled kernel that declines (returns None) wherever kernels run
    interpreted, by design: the reader then asks SQLite. These tests hold the decoder itself to
    SQLite, so they pin it compiled even in a suite run with ``NSYSFRAG_KERNELS=interpreted``."""
    monkeypatch.setenv("NSYSFRAG_KERNELS", "compiled")


EXAMPLES = int(os.environ.get("NSYSFRAG_PROPERTY_EXAMPLES", "150"))

INTEGERS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-300, 300),
    st.sampled_from([0, 1, -1, 127, 128, -128, 2**23, -(2**23), 2**47, -(2**47), 2**63 - 1]),
)
ODD = st.one_of(st.none(), st.floats(allow_nan=False), st.text(max_size=5), st.binary(max_size=5))


def _table(tmp: Path, rows: list[tuple[object, ...]], page_size: int) -> Path:
    path = tmp / "t.sqlite"
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA page_size = {page_size}")
    con.execute("CREATE TABLE other (x)")
    # Untyped columns: SQLite keeps every value's own type, as a damaged export could.
    con.execute("CREATE TABLE t (a, b, c, d)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    con.execute("INSERT INTO other VALUES (1)")
    con.commit()
    con.close()
    return path


def _read(path: Path, columns: list[pages.Column], where_in: tuple[int, list[int]] | None = None) -> list[np.ndarray] | None:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        count = con.execute("SELECT count(*) FROM t").fetchone()[0]
        return pages.read_columns(path, con, "t", columns, count, where_in)


def _query(path: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute(sql).fetchall()


rows_of = st.lists(
    st.tuples(
        st.one_of(INTEGERS, INTEGERS, ODD),
        INTEGERS,
        st.one_of(INTEGERS, st.none()),
        st.one_of(INTEGERS, st.none(), st.text(max_size=3)),
    ),
    min_size=1,
    max_size=400,
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=rows_of, page_size=st.sampled_from([512, 1024, 4096, 65536]))
def test_every_mode_reads_what_sqlite_computes(tmp_path: Path, rows: list[tuple[object, ...]], page_size: int) -> None:
    path = _table(tmp_path, rows, page_size)
    columns = [
        pages.Column(0),
        pages.Column(1),
        pages.Column(2, pages.INTEGER_OR_MINUS_ONE),
        pages.Column(1, pages.FLAGGED, 3),
    ]
    got = _read(path, columns)
    expected = _query(path, "SELECT a, b, coalesce(c, -1), b | ((d IS NOT NULL) << 62) FROM t ORDER BY rowid")
    integers = all(type(v) is int for row in expected for v in row)
    if got is None:
        assert not integers, "declined a table of integers"
        return
    assert integers
    assert [tuple(int(a[i]) for a in got) for i in range(len(expected))] == expected


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.tuples(
            INTEGERS,
            st.integers(0, 6),
            st.one_of(st.integers(-2, 2), st.none()),
            st.one_of(st.integers(-2, 2), st.none(), st.text(max_size=2)),
        ),
        min_size=1,
        max_size=600,
    ),
    ids=st.lists(st.integers(0, 6), max_size=4),
    page_size=st.sampled_from([512, 4096]),
)
def test_filtered_rows_and_call_flags(
    tmp_path: Path, rows: list[tuple[object, ...]], ids: list[int], page_size: int
) -> None:
    path = _table(tmp_path, rows, page_size)
    got = _read(path, [pages.Column(0), pages.Column(2, pages.CALL_FLAGS, 3)], where_in=(1, ids))
    listed = ",".join(map(str, ids)) or "NULL"
    expected = _query(
        path,
        f"SELECT a, coalesce(c = 0, 0) + 2 * coalesce(b IN ({listed}) AND d != 0, 0) FROM t"
        f" WHERE b IN ({listed}) ORDER BY rowid",
    )
    kept = {i for i in ids}
    odd = any(r[1] in kept and not (r[3] is None or type(r[3]) is int) for r in rows)
    if got is None:
        assert odd, "declined a table it can read"
        return
    assert not odd
    assert [tuple(int(a[i]) for a in got) for i in range(len(got[0]))] == expected


def test_rows_on_overflow_pages_and_deep_trees(tmp_path: Path) -> None:
    # Thousands of rows make a tree of several levels; a long blob spills onto overflow pages.
    rows = [(i, -i, i * 7, None) for i in range(20_000)]
    path = _table(tmp_path, rows, 512)
    got = _read(path, [pages.Column(0), pages.Column(1)])
    assert got is not None
    assert np.array_equal(got[0], np.arange(20_000)) and np.array_equal(got[1], -np.arange(20_000))
    with sqlite3.connect(path) as con:
        con.execute("INSERT INTO t VALUES (1, 2, 3, ?)", (b"x" * 5000,))
    assert _read(path, [pages.Column(0), pages.Column(1)]) is None


def test_damaged_pages_are_declined(tmp_path: Path) -> None:
    path = _table(tmp_path, [(i, i, i, i) for i in range(5000)], 1024)
    data = bytearray(path.read_bytes())
    root = _query(path, "SELECT rootpage FROM sqlite_master WHERE name = 't'")[0][0]
    data[(root - 1) * 1024] = 0x0A  # the root is no table page any more
    path.write_bytes(bytes(data))
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        assert pages.read_columns(path, con, "t", [pages.Column(0)], 5000) is None


@pytest.mark.parametrize("declared", ["a INTEGER PRIMARY KEY, b", "a, b, c AS (a + 1)"])
def test_tables_whose_records_do_not_hold_every_column(tmp_path: Path, declared: str) -> None:
    from nsysfrag.inputs.nsys.sqlite_pages import record_columns

    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as con:
        con.execute(f"CREATE TABLE t ({declared})")
        index = record_columns(con, "t")
    assert index is None or index["a"] == -1


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    damage=st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 255)), min_size=1, max_size=12),
    last_page_cells=st.booleans(),
)
def test_damaged_bytes_never_crash_and_never_read_other_values(
    tmp_path: Path, damage: list[tuple[int, int]], last_page_cells: bool
) -> None:
    """Any bytes of the table's pages overwritten (a cell count past its page, pointers, varints,
    serial types): the decoder declines (None) or returns what SQLite's own query returns, and
    never reads outside the file (which would end the process)."""
    path = _table(tmp_path, [(i, -i, i * 3, None) for i in range(3000)], 512)
    data = bytearray(path.read_bytes())
    first_table_page = 512 * 2  # page 1 is the schema, page 2 the small table `other`
    for where, value in damage:
        data[first_table_page + where % (len(data) - first_table_page)] = value
    if last_page_cells:  # the file's last page claims 65,535 cells
        data[len(data) - 512 + 3 : len(data) - 512 + 5] = b"\xff\xff"
    path.write_bytes(bytes(data))
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
            count = con.execute("SELECT count(*) FROM t").fetchone()[0]
            got = pages.read_columns(path, con, "t", [pages.Column(0), pages.Column(1)], count)
        expected = _query(path, "SELECT a, b FROM t ORDER BY rowid")
    except sqlite3.DatabaseError:
        return  # SQLite refuses the file: the reader reports that, whatever the decoder did
    if got is not None:
        assert [tuple(int(v) for v in row) for row in zip(got[0], got[1])] == expected


# --- memory safety: every read checked against its page, the file read, never mapped ---------

PAGE_FUZZ_CASES = int(os.environ.get("NSYSFRAG_PAGE_FUZZ_CASES", "400"))
REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"
REAL_MEMORY_TRACES = REPO.parent / "shared" / "real_memory_traces"


def _fuzz(sources: list[Path], seed: int) -> None:
    outcomes = fuzz_in_child("tests.hostile.page_fuzz", sources, PAGE_FUZZ_CASES, seed)
    assert outcomes["equal"] > 0, "no mutation left a table SQLite and the decoder both read"


def test_mutated_pages_of_generated_exports_read_as_sqlite_reads_them(tmp_path: Path) -> None:
    generated = _table(tmp_path, [(i, -i, i * 3 if i % 7 else None, i % 5) for i in range(3000)], 512)
    _fuzz([generated, *sorted(SAMPLES.glob("*.sqlite"))], seed=1)


@pytest.mark.skipif(not REAL_MEMORY_TRACES.is_dir(), reason="the genuine exports are not beside the repository")
def test_mutated_pages_of_genuine_exports_read_as_sqlite_reads_them() -> None:
    _fuzz(sorted(REAL_MEMORY_TRACES.glob("*.sqlite")), seed=2)


def test_column_sizes_that_overflow_when_summed_are_declined(tmp_path: Path) -> None:
    # Three columns claim 2^62-byte texts each (9-byte serial types, each below 2^63) before a
    # column that is read: summed in 64 bits the offsets wrap negative, and a check of the
    # total alone lets the read land 2^62 bytes before the buffer (SIGSEGV). In a child, so
    # that a crash fails this test rather than ending the run.
    path = _table(tmp_path, [(i, i, "x" * 40, i) for i in range(3000)], 512)
    data = bytearray(path.read_bytes())
    # Row 1500's record: payload 51, rowid 1500, header [5, 2, 2, 93, 2] (two 2-byte integers,
    # a 40-byte text, a 2-byte integer).
    rowid = bytes([0x80 | (1500 >> 7), 1500 & 0x7F])
    at = data.index(bytes([51]) + rowid + bytes([5, 2, 2, 93, 2]))
    huge = bytes([0xBF] + [0xFF] * 7 + [0xFE])
    data[at + 3 : at + 3 + 29] = bytes([29]) + huge * 3 + bytes([2])  # 3 x 2^62, then d
    path.write_bytes(bytes(data))
    code = (
        "import sqlite3, sys; from pathlib import Path;"
        " from nsysfrag.inputs.nsys import sqlite_pages as p;"
        f" con = sqlite3.connect('file:{path}?mode=ro', uri=True);"
        " n = con.execute('SELECT count(*) FROM t').fetchone()[0];"
        f" got = p.read_columns(Path('{path}'), con, 't', [p.Column(3)], n);"
        " sys.exit(0 if got is None else 3)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, NSYSFRAG_KERNELS="compiled"), timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, f"exit {proc.returncode} (negative: a signal); {proc.stderr[-500:]}"
    with pytest.raises(sqlite3.DatabaseError, match="malformed"):
        _query(path, "SELECT a, b, c, d FROM t ORDER BY rowid")


def test_a_file_that_shrinks_while_it_is_read_is_declined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _table(tmp_path, [(i, i, i, i) for i in range(60_000)], 512)
    read = pages._PageFile.read
    calls = []

    def shrinking(self: pages._PageFile, numbers: np.ndarray, into: np.ndarray) -> np.ndarray:
        calls.append(len(numbers))
        if len(calls) == 3:  # a re-export or a cleanup truncates it mid-read
            os.truncate(path, os.path.getsize(path) // 2)
        return read(self, numbers, into)

    monkeypatch.setattr(pages._PageFile, "read", shrinking)
    monkeypatch.setattr(pages, "BATCH_BYTES", 512 * 64)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        assert pages.read_columns(path, con, "t", [pages.Column(0)], 60_000) is None
    assert len(calls) >= 3


def test_a_read_needs_a_bounded_buffer_not_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Filtered, the rows kept size the output; the pages pass through one buffer of BATCH_BYTES.
    path = _table(tmp_path, [(i, i % 1000, i, i) for i in range(60_000)], 4096)
    sizes = []
    read = pages._PageFile.read
    monkeypatch.setattr(pages._PageFile, "read", lambda self, n, into: sizes.append(len(n) * self.page_size) or read(self, n, into))
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        got = pages.read_columns(path, con, "t", [pages.Column(0)], 60_000, where_in=(1, [7]))
    assert got is not None and list(got[0]) == list(range(7, 60_000, 1000))
    assert max(sizes) <= pages.BATCH_BYTES < os.path.getsize(path)


@pytest.mark.parametrize(
    ("declared", "read_as_stored"),
    [("REAL", False), ("DOUBLE PRECISION", False), ("FLOAT", False), ("TEXT", False),
     ("VARCHAR(10)", False), ("INTEGER", True), ("BIGINT", True), ("NUMERIC", True),
     ("DECIMAL(10,5)", True), ("", True), ("BLOB", True), ("POINT", True)],
)  # fmt: skip
def test_declared_types_are_read_as_sqlite_reads_them(tmp_path: Path, declared: str, read_as_stored: bool) -> None:
    # REAL affinity stores integral values as integers and gives them back as floats; TEXT
    # affinity compares them with numbers as text. Either way the decoder leaves them to SQLite.
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as con:
        con.execute(f"CREATE TABLE t (a {declared}, b INTEGER)")
        con.execute("PRAGMA writable_schema = ON")
        con.executemany("INSERT INTO t VALUES (?, ?)", [(i, i) for i in range(30_000)])
    stored = _query(path, "SELECT typeof(a) FROM t LIMIT 1")[0][0]
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        got = pages.read_columns(path, con, "t", [pages.Column(1)], 30_000, where_in=(0, [5]))
        plain = pages.read_columns(path, con, "t", [pages.Column(0)], 30_000)
    if read_as_stored:
        assert stored == "integer" and got is not None and list(got[0]) == [5]
        assert plain is not None and list(plain[0]) == list(range(30_000))
    else:
        assert got is None and plain is None

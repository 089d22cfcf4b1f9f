"""Hostile and unlucky nsys exports (issue 16): each case holds the contract and reads right.

The contract (``contract.run_nsysfrag``: a fresh process, 30 s, 4 GiB of address space, exit 0
or 2, at most one stderr line, the input untouched) runs on a representative case of each kind;
what the reader makes of the input is checked in this process, where it is cheap.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from nsysfrag.analysis import analyze
from nsysfrag.errors import InputError
from nsysfrag.inputs.nsys import read_export, sqlite_columns
from nsysfrag.inputs.nsys.reader import read_trace
from nsysfrag.testing.nsys_export import nested_nvtx_export
from tests.conftest import BASE, SAMPLES, MiB
from tests.hostile import nsys_cases as cases
from tests.hostile.contract import run_nsysfrag
from tests.hostile.in_process import run_in_process

needs_compiled = pytest.mark.skipif(
    not sqlite_columns.available(), reason="no libsqlite3 for the compiled reader"
)


def portable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_columns, "_LIB", None)


def memory_rows(path: Path) -> list[tuple[int, ...]]:
    t = read_trace(path)
    m = t.memory
    return list(zip(m.start_ns.tolist(), m.address.tolist(), m.bytes.tolist(),
                    m.is_free.tolist(), m.correlation_id.tolist(), strict=True))


def summary(path: Path, *args: str) -> dict[str, object]:
    out = run_in_process(["analyze", str(path), "--json", "-", *args], inputs=[path]).stdout
    doc: dict[str, object] = json.loads(out)
    return doc


# ------------------------------------------------------------------------------ rowid gaps


def test_rowid_gap_reads_in_rowid_order_without_walking_the_gap(tmp_path: Path) -> None:
    # main: the portable reader stepped from rowid -2**63 to 2**63 - 1 by 250,000 (10**14 queries)
    path = cases.rowid_gap(tmp_path)
    outcome = run_nsysfrag(["analyze", path, "--json", "-"], inputs=[path])
    doc = json.loads(outcome.stdout)
    assert doc["trace"]["skipped_rows"] == 1  # the row whose address is text
    assert doc["spaces"][0]["counts"]["allocations"] == 2


@pytest.mark.parametrize("reader", ["compiled", "portable"])
def test_rowids_at_both_ends_of_int64_read_in_rowid_order(
    tmp_path: Path, reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if reader == "compiled" and not sqlite_columns.available():
        pytest.skip("no libsqlite3 for the compiled reader")
    if reader == "portable":
        portable(monkeypatch)
    path = cases.small_trace(tmp_path / "t.sqlite")
    want = memory_rows(path)
    # Same rows, rowids spread over the whole int64 range, still in the same order.
    cases.sql(
        path,
        f"UPDATE {cases.MEMORY} SET rowid = {cases.MAX_ROWID} WHERE rowid = 4",
        f"UPDATE {cases.MEMORY} SET rowid = 1 << 40 WHERE rowid = 3",
        f"UPDATE {cases.MEMORY} SET rowid = -5 WHERE rowid = 2",
        f"UPDATE {cases.MEMORY} SET rowid = {-cases.MAX_ROWID - 1} WHERE rowid = 1",
    )
    assert memory_rows(path) == want


def test_the_portable_reader_pages_by_rowid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nsysfrag.inputs.nsys import sqlite_tables

    portable(monkeypatch)
    monkeypatch.setattr(sqlite_tables, "PAGE_ROWS", 3)  # several pages, each after a rowid gap
    path = cases.small_trace(tmp_path / "t.sqlite")
    want = memory_rows(path)
    cases.sql(path, f"UPDATE {cases.MEMORY} SET rowid = rowid * 1000000000000")
    assert memory_rows(path) == want


def test_a_declared_rowid_column_does_not_hide_the_row_order(tmp_path: Path) -> None:
    path = cases.small_trace(tmp_path / "t.sqlite")
    want = memory_rows(path)
    cases.sql(path, f"ALTER TABLE {cases.MEMORY} ADD COLUMN rowid TEXT",
              f"UPDATE {cases.MEMORY} SET rowid = 'x'")
    assert memory_rows(path) == want


@pytest.mark.parametrize("without", ["WITHOUT ROWID", "WITHOUT /*c*/ ROWID", "without\n\t rowid", "WITHOUT--c\nROWID"])
def test_a_without_rowid_table_reads_too(tmp_path: Path, without: str) -> None:
    # main: a comment between the words was "corrupt or truncated (no such column: rowid)"
    path = cases.small_trace(tmp_path / "t.sqlite")
    want = memory_rows(path)
    cases.sql(
        path,
        f"ALTER TABLE {cases.MEMORY} RENAME TO old",
        f"CREATE TABLE {cases.MEMORY} (start INTEGER, globalPid INTEGER, deviceId INTEGER,"
        " contextId INTEGER, address INTEGER, pc INTEGER, bytes INTEGER, memKind INTEGER,"
        " memoryOperationType INTEGER, correlationId INTEGER,"
        f" PRIMARY KEY (start, address, memoryOperationType)) {without}",
        f"INSERT INTO {cases.MEMORY} SELECT start, globalPid, deviceId, contextId, address, pc,"
        " bytes, memKind, memoryOperationType, correlationId FROM old",
    )
    assert memory_rows(path) == want


def test_a_hot_journal_is_named_and_left_alone(tmp_path: Path) -> None:
    # main: "corrupt or truncated (attempt to write a readonly database)"
    import shutil

    writer = cases.sample_copy(tmp_path)
    copied = tmp_path / "copied"
    copied.mkdir()
    con = sqlite3.connect(writer, isolation_level=None)
    con.execute("PRAGMA journal_mode = DELETE")
    con.execute("PRAGMA cache_size = 1")  # the change spills: the journal is synced, hot
    con.execute("BEGIN")
    con.execute(f"UPDATE {cases.MEMORY} SET bytes = bytes + 1")
    path = Path(shutil.copy(writer, copied / writer.name))
    journal = Path(shutil.copy(f"{writer}-journal", copied / f"{writer.name}-journal"))
    con.execute("ROLLBACK")
    con.close()
    outcome = run_nsysfrag(["analyze", path, "-q"], inputs=[path, journal])
    assert outcome.returncode == 2
    assert f"{journal.name} beside it holds a transaction that a writer did not finish" in outcome.stderr


@pytest.mark.parametrize("declared", ["REAL", "FLOAT", "DOUBLE"])
def test_a_bytes_column_declared_real_reads_one_way(
    tmp_path: Path, declared: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # main: SQLite gives REAL columns' integers back as floats (every row skipped), the page
    # decoder read the stored integers (no row skipped): which ran depended on size and cache.
    path = cases.small_trace(tmp_path / "t.sqlite")
    cases.sql(
        path,
        f"ALTER TABLE {cases.MEMORY} RENAME TO old",
        f"CREATE TABLE {cases.MEMORY} (start INTEGER, globalPid INTEGER, deviceId INTEGER,"
        f" contextId INTEGER, address INTEGER, pc INTEGER, bytes {declared}, memKind INTEGER,"
        " memoryOperationType INTEGER, correlationId INTEGER)",
        f"INSERT INTO {cases.MEMORY} SELECT start, globalPid, deviceId, contextId, address, pc,"
        " bytes, memKind, memoryOperationType, correlationId FROM old",
        "DROP TABLE old",
    )
    skipped = set()
    for mode in ("compiled", "interpreted"):
        monkeypatch.setenv("NSYSFRAG_KERNELS", mode)
        trace = read_trace(path, require_memory_events=False)
        skipped.add((trace.skipped_rows, len(trace.memory)))
    assert skipped == {(len(memory_rows_of(path)), 0)}


def memory_rows_of(path: Path) -> list[tuple[int, ...]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute(f"SELECT * FROM {cases.MEMORY}").fetchall()


# ---------------------------------------------------------------------------------- views


def test_a_memory_table_that_is_a_view_is_read(tmp_path: Path) -> None:
    # main: "memory tracking was on but no allocation was recorded"
    table = cases.small_trace(tmp_path / "table.sqlite")
    view = cases.view_memory_table(tmp_path / "view.sqlite")
    assert memory_rows(view) == memory_rows(table)
    run_nsysfrag(["analyze", view, "-q"], inputs=[view])


def test_a_view_that_never_ends_is_stopped_by_the_work_budget(tmp_path: Path) -> None:
    path = cases.view_memory_table(tmp_path / "endless.sqlite", cases.ENDLESS_VIEW)
    outcome = run_nsysfrag(["analyze", path, "-q"], inputs=[path])
    assert outcome.returncode == 2
    assert "more SQLite work than a file of its size can need" in outcome.stderr


# --------------------------------------------------------------------------- NVTX nesting


def test_5000_nested_ranges_with_long_names_run_fast_and_small(tmp_path: Path) -> None:
    # main: 2.5 GB and MemoryError on this 7 MB file (5.4 s; 1,000 ranges took 5.4 s)
    path = nested_nvtx_export(tmp_path / "nested.sqlite", 5000, 1000, every_depth=False)
    outcome = run_nsysfrag(["analyze", path, "--json", "-"], inputs=[path])
    assert json.loads(outcome.stdout)["spaces"][0]["counts"]["allocations"] == 1


def test_deep_sites_are_elided_keeping_both_ends(tmp_path: Path) -> None:
    from nsysfrag.inputs.nsys.sites import MAX_SITE_CHARS

    path = nested_nvtx_export(tmp_path / "nested.sqlite", 300, 100, every_depth=True)
    space = analyze(read_export(path)).spaces[0]
    sites = {h.site for h in space.hotspots}
    assert len(sites) == 150  # every other depth is freed out of order
    assert max(len(s) for s in sites) <= MAX_SITE_CHARS + 32
    # Up to 4096 characters a site is the SPEC's join; the deepest keep the outermost ranges,
    # say how many they leave out, and end with the innermost ones.
    short = [s for s in sites if "…" not in s]
    assert "000000" + "n" * 94 + "/000001" + "n" * 94 + "/000002" + "n" * 94 in short
    deepest = next(s for s in sites if s.endswith("/000298" + "n" * 94))
    assert deepest.startswith("000000" + "n" * 94 + "/")
    assert "ranges…/" in deepest


# --------------------------------------------------------------- addresses, ids, devices


def test_addresses_above_2_63_replay_like_any_other(tmp_path: Path) -> None:
    # main: "slot assignment lost a block" once offsets passed 2**63
    low = summary(cases.high_addresses(tmp_path / "low.sqlite", BASE))
    high_path = cases.high_addresses(tmp_path / "high.sqlite", 0xFFFF_FF00_0000_0000)
    high = summary(high_path)
    assert high["spaces"][0]["base_address"] == 0xFFFF_FF00_0000_0000  # type: ignore[index]
    for key in ("counts", "peak", "final", "max", "hotspots", "free_block_histogram"):
        assert high["spaces"][0][key] == low["spaces"][0][key], key  # type: ignore[index]


def test_a_span_beyond_64_bit_offsets_is_refused(tmp_path: Path) -> None:
    rows = [cases.MemoryRow(10, 1, 0, 0x10000, MiB), cases.MemoryRow(20, 1, 0, (1 << 64) - (1 << 40), MiB)]
    path = cases.small_trace(tmp_path / "span.sqlite", rows)
    outcome = run_in_process(["analyze", str(path)], inputs=[path])
    assert outcome.returncode == 2 and "span of 8 EiB or more" in outcome.stderr


def test_a_size_near_2_63_is_refused_not_wrapped(tmp_path: Path) -> None:
    rows = [cases.MemoryRow(10, 1, 0, BASE, (1 << 63) - 1)]
    path = cases.small_trace(tmp_path / "size.sqlite", rows)
    with pytest.raises(InputError, match="span of 8 EiB"):
        analyze(read_export(path))


def test_correlation_ids_outside_32_bits_match_nothing(tmp_path: Path) -> None:
    # main: a numpy overflow warning, then "RuntimeError: ... kind='table'"
    path = cases.extreme_correlation_ids(tmp_path / "corr.sqlite")
    run_in_process(["analyze", str(path), "-q"], inputs=[path])
    trace = read_trace(path)
    assert trace.memory.correlation_id.tolist() == [1, -1, -1, -1, -1]
    assert sorted(trace.api.correlation_id.tolist()) == [-1, -1, 1, 2, 3]
    # Only block 1 has a call; 2**32 + 2 does not pass for call 2.
    timeline = analyze(read_export(path)).spaces[0].timeline
    names = [timeline.site_names[c] for c in timeline.site[timeline.event == 0].tolist()]
    assert names == ["step", "(no range)", "(no range)", "(no range)"]


def test_device_ids_of_any_int64_keep_their_own_spaces(tmp_path: Path) -> None:
    # main: (pid << 32) | device put 2**32 and 0 in one space, and -1 garbled the pid
    spaces = analyze(read_export(cases.bad_device_ids(tmp_path / "dev.sqlite"))).spaces
    assert [(s.pid, s.device, s.counts.allocations) for s in spaces] == [
        (1, -1, 1), (1, 0, 1), (1, 1 << 32, 2)
    ]
    assert spaces[2].counts.overlaps == 0


# ------------------------------------------------------------------------ text and names


def test_bytes_that_are_not_utf8_anywhere(tmp_path: Path) -> None:
    # main: "the SQLite database is corrupt or truncated (Could not decode to UTF-8 ...)"
    path = cases.not_utf8(tmp_path / "latin.sqlite")
    run_nsysfrag(["analyze", path], inputs=[path])
    trace = read_trace(path)
    assert trace.nsys_version == "\ufffdno"
    assert trace.gpus[0].name == "\ufffdno"
    assert sorted(trace.nvtx.text) == ["\ufffdno", "\ufffdno"]


def test_file_names_that_are_not_utf8_or_too_long(tmp_path: Path) -> None:
    source = cases.small_trace(tmp_path / "t.sqlite")
    odd = os.fsencode(tmp_path) + b"/trace-\xff\xfe.sqlite"
    os.link(source, odd)
    out = os.fsencode(tmp_path) + b"/out-\xff.json"
    run_nsysfrag([b"analyze", odd, b"--json", out], inputs=[source])
    assert json.loads(Path(os.fsdecode(out)).read_text())["trace"]["path"].endswith(
        "trace-\\xff\\xfe.sqlite"
    )
    long_name = tmp_path / ("x" * 300 + ".sqlite")
    outcome = run_in_process(["analyze", str(long_name)])
    assert outcome.returncode == 2 and "name is too long" in outcome.stderr
    outcome = run_in_process(
        ["analyze", str(source), "--json", str(tmp_path / ("y" * 300 + ".json"))], inputs=[source]
    )
    assert outcome.returncode == 2 and "name is too long" in outcome.stderr


def test_a_name_that_is_not_utf8_is_recorded_from_the_file_itself(tmp_path: Path) -> None:
    # The document writes the name with \\xNN escapes; --record must hash the real file, not
    # reopen that escaped text (which names no file).
    source = cases.small_trace(tmp_path / "t.sqlite")
    odd = os.fsencode(tmp_path) + b"/trace-\xff.sqlite"
    os.link(source, odd)
    db = tmp_path / "history.db"
    outcome = run_nsysfrag([b"analyze", odd, b"-q", b"--record", b"--db", str(db).encode()],
                           inputs=[source])
    assert outcome.returncode == 0 and "recorded as run 1" in outcome.stderr, outcome.stderr
    with sqlite3.connect(db) as con:
        (stored,) = con.execute("SELECT trace_path FROM runs").fetchone()
    assert stored.endswith("trace-\\xff.sqlite")


def test_a_fifo_or_a_device_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    # main: blocked forever in open()
    fifo = tmp_path / "trace.sqlite"
    os.mkfifo(fifo)
    outcome = run_nsysfrag(["analyze", fifo])
    assert outcome.returncode == 2 and "is a FIFO" in outcome.stderr
    outcome = run_in_process(["whatif", str(fifo)])
    assert outcome.returncode == 2 and "is a FIFO" in outcome.stderr
    outcome = run_in_process(["analyze", "/dev/zero"])
    assert outcome.returncode == 2 and "character device" in outcome.stderr


def test_a_database_of_another_application(tmp_path: Path) -> None:
    # main: "it was probably recorded without --cuda-memory-usage=true"
    path = cases.not_nsys(tmp_path / "notes.sqlite")
    outcome = run_in_process(["analyze", str(path)], inputs=[path])
    assert outcome.returncode == 2
    assert "not an Nsight Systems export" in outcome.stderr
    assert "cuda-memory-usage" not in outcome.stderr


# ------------------------------------------------------------------- SQLite-level damage


def test_a_wal_database_is_read_without_creating_files(tmp_path: Path) -> None:
    # main: the read-only open created wal.sqlite-wal and wal.sqlite-shm beside it
    path = cases.wal_mode(tmp_path, pending=False)
    run_in_process(["analyze", str(path), "-q"], inputs=[path])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wal.sqlite", "writer"]


def test_a_wal_database_with_unmerged_changes_is_refused(tmp_path: Path) -> None:
    path = cases.wal_mode(tmp_path, pending=True)
    wal = path.with_name(path.name + "-wal")
    outcome = run_in_process(["analyze", str(path), "-q"], inputs=[path, wal])
    assert outcome.returncode == 2 and "wal_checkpoint" in outcome.stderr
    assert not path.with_name(path.name + "-shm").exists()


@pytest.mark.parametrize("page", [2, 9, 14, 27])
def test_a_corrupt_page(tmp_path: Path, page: int) -> None:
    path = cases.corrupt_page(tmp_path, page)
    outcome = run_in_process(["analyze", str(path), "-q"], inputs=[path])
    if outcome.returncode:
        assert "corrupt" in outcome.stderr


def test_a_huge_registered_string(tmp_path: Path) -> None:
    # main: the string was copied once per NVTX range that names it (6.4 GB here)
    path = cases.huge_string(tmp_path / "huge.sqlite", 64 << 20, 100)
    outcome = run_nsysfrag(["analyze", path, "--json", "-"], inputs=[path])
    sites = [h["site"] for s in json.loads(outcome.stdout)["spaces"] for h in s["hotspots"]]
    assert sites and all(len(s) <= 4096 for s in sites)


def test_a_memory_table_with_no_rows(tmp_path: Path) -> None:
    path = cases.small_trace(tmp_path / "empty.sqlite", [])
    outcome = run_in_process(["analyze", str(path)], inputs=[path])
    assert outcome.returncode == 0 and "No device-memory allocations" in outcome.stdout


def test_many_zero_size_allocations(tmp_path: Path) -> None:
    path = cases.zero_size_rows(tmp_path / "zeros.sqlite", 100_000)
    outcome = run_nsysfrag(["analyze", path, "--json", "-"], inputs=[path])
    counts = json.loads(outcome.stdout)["spaces"][0]["counts"]
    assert counts["zero_size_allocs"] == 100_000 and counts["allocations"] == 0


def test_copies_of_tables_with_version_suffixes_are_ignored(tmp_path: Path) -> None:
    path = cases.sample_copy(tmp_path)
    want = summary(path)
    for table in (cases.MEMORY, "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "StringIds",
                  "TARGET_INFO_GPU", "META_DATA_EXPORT", "ENUM_CUDA_MEM_KIND"):
        for suffix in ("_v2", "_V3020"):
            cases.sql(path, f"CREATE TABLE {table}{suffix} AS SELECT * FROM {table}",
                      f"UPDATE {table}{suffix} SET rowid = -rowid")
            cols = [r[1] for r in sqlite3.connect(path).execute(f"PRAGMA table_info({table}{suffix})")]
            cases.sql(path, f"UPDATE {table}{suffix} SET {cols[0]} = 'garbage'")
    got = summary(path)
    assert got["spaces"] == want["spaces"]


# Every column the reader touches, in every table, set to each kind of wrong value.
COLUMNS = {
    cases.MEMORY: ["start", "globalPid", "deviceId", "address", "bytes", "memKind",
                   "memoryOperationType", "correlationId"],
    "CUPTI_ACTIVITY_KIND_RUNTIME": ["start", "eventClass", "globalTid", "correlationId",
                                    "nameId", "returnValue"],
    "NVTX_EVENTS": ["start", "end", "eventType", "text", "textId", "globalTid"],
    "StringIds": ["id", "value"],
    "TARGET_INFO_GPU": ["id", "name", "totalMemory"],
    "TARGET_INFO_CUDA_DEVICE": ["gpuId", "cudaId", "pid"],
    "META_DATA_EXPORT": ["name", "value"],
    "META_DATA_CAPTURE": ["name", "value"],
    "ENUM_CUDA_MEM_KIND": ["id", "name"],
    "ENUM_CUDA_DEV_MEM_EVENT_OPER": ["id", "name"],
    "PROCESSES": ["pid", "name"],
}
WRONG = ["NULL", "'text'", "X'00FF'", "1.5", "-9223372036854775808", "9223372036854775807",
         "'1) OR (1'"]


@pytest.mark.parametrize(
    "table,column",
    [pytest.param(t, c, id=f"{t}.{c}") for t, cols in COLUMNS.items() for c in cols],
)
def test_wrong_values_in_every_column_the_reader_touches(
    tmp_path: Path, table: str, column: str
) -> None:
    # The smallest sample; multi_gpu's NVTX names are registered strings (textId).
    name = "multi_gpu.sqlite" if table in ("NVTX_EVENTS", "StringIds") else "caching_allocator.sqlite"
    path = cases.sample_copy(tmp_path, name)
    with sqlite3.connect(path) as con:
        con.execute(f"CREATE TABLE copy AS SELECT * FROM {table}")
        con.execute(f"DROP TABLE {table}")
        con.execute(f"ALTER TABLE copy RENAME TO {table}")  # no NOT NULL, no affinity left
        rows = [r[0] for r in con.execute(f"SELECT rowid FROM {table} ORDER BY rowid LIMIT 20")]
        for rowid, value in zip(rows, WRONG * 3, strict=False):
            con.execute(f"UPDATE {table} SET {column} = {value} WHERE rowid = {rowid}")
    outcome = run_in_process(["analyze", str(path), "--json", "-"], inputs=[path])
    if outcome.returncode == 0:
        doc = json.loads(outcome.stdout)
        assert doc["spaces"] or doc["trace"]["skipped_rows"]


@needs_compiled
def test_the_compiled_and_portable_readers_agree_on_damaged_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = cases.sample_copy(tmp_path, "churn_anomalies.sqlite")
    cases.sql(path, f"UPDATE {cases.MEMORY} SET rowid = rowid * 7919 WHERE rowid % 3 = 0",
              f"UPDATE {cases.MEMORY} SET rowid = -rowid WHERE rowid % 5 = 0")
    compiled = read_trace(path)
    portable(monkeypatch)
    other = read_trace(path)
    for field in ("start_ns", "address", "bytes", "correlation_id", "device"):
        assert np.array_equal(getattr(compiled.memory, field), getattr(other.memory, field))


def test_whatif_on_hostile_inputs(tmp_path: Path) -> None:
    for path in (cases.rowid_gap(tmp_path), cases.view_memory_table(tmp_path / "v.sqlite"),
                 cases.extreme_correlation_ids(tmp_path / "c.sqlite")):
        run_in_process(["whatif", str(path), "--policy", "best-fit", "-q"], inputs=[path])


def test_samples_still_read_with_every_reader_change() -> None:
    for path in sorted(SAMPLES.glob("*.sqlite")):
        assert read_trace(path).skipped_rows == 0

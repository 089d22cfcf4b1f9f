"""The reader over every real nsys export we have, the bundled samples, and broken inputs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from nsysfrag.errors import InputError
from nsysfrag.inputs.nsys.reader import read_trace
from nsysfrag.testing.nsys_export import ApiRow, ExportOptions, MemoryRow, NvtxRow
from tests.conftest import BASE, REAL_TRACES, SAMPLES, MakeTrace, MiB

REAL = sorted(REAL_TRACES.glob("*.sqlite")) if REAL_TRACES.is_dir() else []
needs_real = pytest.mark.skipif(not REAL, reason="../shared/real_traces is absent")


@needs_real
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_export_without_memory_tracking_says_how_to_record(path: Path) -> None:
    before = (path.stat().st_mtime_ns, path.read_bytes())
    with pytest.raises(InputError) as err:
        read_trace(path)
    message = str(err.value)
    assert "--cuda-memory-usage=true" in message and "nsys profile" in message
    assert "\n" not in message
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before


@needs_real
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_export_reads_metadata_gpus_api_and_nvtx(path: Path) -> None:
    trace = read_trace(path, require_memory_events=False)
    # The file name carries the nsys version that wrote it.
    assert trace.nsys_version is not None
    assert trace.nsys_version.startswith(path.name[1:].split("_")[0])
    assert len(trace.memory) == 0
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "TARGET_INFO_GPU" in tables:
        want = {r[0]: r[1] for r in con.execute("SELECT id, totalMemory FROM TARGET_INFO_GPU")}
        assert {g.id: g.total_memory for g in trace.gpus.values()} == want
    if "NVTX_EVENTS" in tables:
        ranges = con.execute(
            "SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end > start"
        ).fetchone()[0]
        assert len(trace.nvtx.text) == ranges
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        # Allocation calls are matched by name with the _vNNNN suffix stripped.
        names = [
            r[0]
            for r in con.execute(
                "SELECT s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId"
            )
        ]
        allocs = [n for n in names if n.split("_v")[0] in {"cudaMalloc", "cuMemAlloc", "cudaMallocManaged", "cudaMallocAsync"}]
        assert trace.allocation_calls == len(allocs)
        assert len(trace.api.start_ns) == len(allocs)
    con.close()


@needs_real
def test_registered_nvtx_strings_in_a_real_export() -> None:
    trace = read_trace(REAL_TRACES / "v2023.1.2_memfusion.sqlite", require_memory_events=False)
    assert "ExecutionContext::execute" in trace.nvtx.text
    assert "(unnamed range)" not in trace.nvtx.text


@needs_real
def test_cuda_device_mapping_in_a_real_export() -> None:
    trace = read_trace(REAL_TRACES / "v2025.5.1_cestwc.sqlite", require_memory_events=False)
    assert trace.cuda_devices == {(433104, 1): 0, (433104, 0): 1}


SAMPLE_FILES = sorted(SAMPLES.glob("*.sqlite"))


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.name)
def test_samples_read(path: Path) -> None:
    trace = read_trace(path)
    assert len(trace.memory) > 100
    assert trace.skipped_rows == 0
    assert path.stat().st_size < 1 << 20


def test_samples_exist() -> None:
    assert len(SAMPLE_FILES) >= 4


def test_null_and_malformed_rows_are_skipped_and_counted(make_trace: MakeTrace) -> None:
    path = make_trace([MemoryRow(10, 1, 0, BASE, MiB), MemoryRow(20, 1, 0, BASE + MiB, MiB)])
    con = sqlite3.connect(path)
    # nsys declares these NOT NULL, but damaged or hand-made exports break that.
    con.execute("CREATE TABLE t AS SELECT * FROM CUDA_GPU_MEMORY_USAGE_EVENTS")
    con.execute("DROP TABLE CUDA_GPU_MEMORY_USAGE_EVENTS")
    con.execute("ALTER TABLE t RENAME TO CUDA_GPU_MEMORY_USAGE_EVENTS")
    con.execute("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, address, bytes, memKind, memoryOperationType) VALUES (NULL, 1, 0, 5, 5, 2, 0)")
    con.execute("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, address, bytes, memKind, memoryOperationType) VALUES (30, 1, 0, 'x', 5, 2, 0)")
    con.execute("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, address, bytes, memKind, memoryOperationType) VALUES (40, 1, 0, 5, -5, 2, 0)")
    con.execute("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, address, bytes, memKind, memoryOperationType) VALUES (50, 1, 0, 5, 5, 2, 9)")
    con.commit()
    con.close()
    trace = read_trace(path)
    assert len(trace.memory) == 2 and trace.skipped_rows == 4


def test_missing_required_column_is_an_input_error(make_trace: MakeTrace) -> None:
    path = make_trace([MemoryRow(10, 1, 0, BASE, MiB)])
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE CUDA_GPU_MEMORY_USAGE_EVENTS DROP COLUMN memKind")
    con.commit()
    con.close()
    with pytest.raises(InputError, match="memKind"):
        read_trace(path)


def test_optional_columns_may_be_missing(make_trace: MakeTrace) -> None:
    path = make_trace([MemoryRow(10, 1, 0, BASE, MiB, correlation_id=3)])
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE CUDA_GPU_MEMORY_USAGE_EVENTS DROP COLUMN correlationId")
    con.execute("ALTER TABLE CUDA_GPU_MEMORY_USAGE_EVENTS DROP COLUMN streamId")
    con.commit()
    con.close()
    assert read_trace(path).memory.correlation_id.tolist() == [-1]


def test_schema_2_without_enum_tables_uses_fallback_ids(make_trace: MakeTrace) -> None:
    path = make_trace([MemoryRow(10, 1, 0, BASE, MiB), MemoryRow(20, 1, 0, BASE + MiB, MiB, kind=1)])
    con = sqlite3.connect(path)
    con.execute("DROP TABLE ENUM_CUDA_MEM_KIND")
    con.execute("DROP TABLE ENUM_CUDA_DEV_MEM_EVENT_OPER")
    con.commit()
    con.close()
    trace = read_trace(path)
    assert trace.memory.modelled.tolist() == [True, False]


def test_enum_ids_resolved_by_name(make_trace: MakeTrace) -> None:
    # If a future nsys renumbered the enum, the names still decide.
    path = make_trace([MemoryRow(10, 1, 0, BASE, MiB, kind=7)])
    con = sqlite3.connect(path)
    con.execute("UPDATE ENUM_CUDA_MEM_KIND SET id = id + 100")
    con.execute("UPDATE ENUM_CUDA_MEM_KIND SET id = 7 WHERE name = 'CUDA_MEMOPR_MEMORY_KIND_DEVICE'")
    con.commit()
    con.close()
    assert read_trace(path).memory.modelled.tolist() == [True]


def test_memory_tracking_on_but_no_table(make_trace: MakeTrace) -> None:
    opts = ExportOptions(with_memory_table=False, collect_memory=True)
    path = make_trace([], api=[ApiRow(1, 2, 1, 1, "cudaMalloc_v3020", 1)], options=opts)
    with pytest.raises(InputError, match="no allocation was recorded"):
        read_trace(path)


def test_api_rows_for_sites_and_failures(make_trace: MakeTrace) -> None:
    api = [
        ApiRow(1, 2, 1, 5, "cudaMalloc_v3020", 1),
        ApiRow(3, 4, 1, 5, "cudaLaunchKernel_v7000", 2),
        ApiRow(5, 6, 1, 5, "cuMemAlloc_v2", 3, return_value=2, event_class=1),
    ]
    nvtx = [NvtxRow(0, 10, 1, 5, "a"), NvtxRow(0, None, 1, 5, "unclosed")]
    trace = read_trace(make_trace([MemoryRow(1, 1, 0, BASE, MiB, correlation_id=1)], api=api, nvtx=nvtx))
    assert trace.api.correlation_id.tolist() == [1, 3]
    assert trace.api.is_failed_allocation.tolist() == [False, True]
    assert trace.api.is_runtime.tolist() == [True, False]
    assert trace.nvtx.text == ["a"]


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.name)
def test_compiled_and_portable_readers_agree(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nsysfrag.inputs.nsys import sqlite_columns

    if not sqlite_columns.available():
        pytest.skip("no libsqlite3 for the compiled reader on this machine")
    compiled = read_trace(path)
    monkeypatch.setattr(sqlite_columns, "_LIB", None)
    portable = read_trace(path)
    for field in ("start_ns", "pid", "device", "address", "bytes", "is_free", "modelled", "correlation_id"):
        assert getattr(compiled.memory, field).tolist() == getattr(portable.memory, field).tolist()
    order_c = np.lexsort((compiled.api.correlation_id, compiled.api.pid))
    order_p = np.lexsort((portable.api.correlation_id, portable.api.pid))
    for field in ("start_ns", "pid", "tid", "correlation_id", "is_runtime", "is_failed_allocation"):
        assert getattr(compiled.api, field)[order_c].tolist() == getattr(portable.api, field)[order_p].tolist()
    assert (compiled.allocation_calls, compiled.vmm_calls, compiled.skipped_rows) == (
        portable.allocation_calls, portable.vmm_calls, portable.skipped_rows
    )


def _runtime_export(make_trace: MakeTrace) -> Path:
    """Allocations whose calls are allocation calls and one whose call is not (a copy to a
    symbol, correlation id 7), a launch sharing correlation id 2 with another process's
    matched allocation (not needed), VMM calls (one without a thread: still counted) and
    launches around them."""
    memory = [
        MemoryRow(10, 1, 0, BASE, MiB, correlation_id=1),
        MemoryRow(20, 1, 0, BASE + MiB, MiB, correlation_id=7),
        MemoryRow(30, 2, 0, BASE + 2 * MiB, MiB, correlation_id=2),
        MemoryRow(40, 1, 0, BASE, MiB, op=1, correlation_id=8),
    ]
    api = [
        ApiRow(9, 10, 1, 5, "cudaMalloc_v3020", 1),
        ApiRow(12, 13, 1, 5, "cudaLaunchKernel_v7000", 3),
        ApiRow(19, 20, 1, 6, "cudaMemcpyToSymbol_v3020", 7),
        ApiRow(21, 22, 1, 5, "cudaLaunchKernel_v7000", 2),
        ApiRow(29, 30, 2, 9, "cudaMalloc_v3020", 2, return_value=2),
        ApiRow(31, 32, 1, 5, "cuMemCreate", 4, event_class=1),
        ApiRow(33, 34, 1, 5, "cuMemMap", 5, event_class=1),
        ApiRow(39, 40, 1, 5, "cudaFree_v3020", 8),
    ]
    path = make_trace(memory, api=api)
    con = sqlite3.connect(path)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = NULL WHERE correlationId = 5")
    con.commit()
    con.close()
    return path


def _api_lists(trace: object) -> list[list[int]]:
    api = trace.api  # type: ignore[attr-defined]
    fields = ("start_ns", "pid", "tid", "correlation_id", "is_runtime", "is_failed_allocation")
    return [getattr(api, f).tolist() for f in fields]


def test_runtime_table_in_one_pass_reads_what_two_passes_read(
    make_trace: MakeTrace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nsysfrag.inputs.nsys import reader

    path = _runtime_export(make_trace)
    one = read_trace(path)
    # The allocation calls in row order, then the one other call an allocation needs.
    assert one.api.correlation_id.tolist() == [1, 2, 7]
    assert one.api.start_ns.tolist() == [9, 29, 19]
    assert one.api.is_failed_allocation.tolist() == [False, True, False]
    assert (one.allocation_calls, one.vmm_calls) == (2, 2)
    monkeypatch.setattr(reader, "LITERAL_IDS", 0)  # a large memory table: the second pass
    two = read_trace(path)
    assert _api_lists(two) == _api_lists(one)
    assert (two.allocation_calls, two.vmm_calls) == (one.allocation_calls, one.vmm_calls)


def test_runtime_table_read_in_two_ranges_as_in_one(
    make_trace: MakeTrace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nsysfrag.inputs.nsys import api_calls, sqlite_columns

    if not sqlite_columns.available():
        pytest.skip("no libsqlite3 for the compiled reader on this machine")
    monkeypatch.setenv("NSYSFRAG_KERNELS", "compiled")  # the compiled reader, whatever the size
    path = _runtime_export(make_trace)
    whole = read_trace(path)
    monkeypatch.setattr(api_calls, "_SPLIT_ROWS", 1)  # 8 rows: two ranges of 4
    halves = read_trace(path)
    assert _api_lists(halves) == _api_lists(whole)
    assert (halves.allocation_calls, halves.vmm_calls) == (whole.allocation_calls, whole.vmm_calls)
    monkeypatch.setattr(sqlite_columns, "_LIB", None)  # and the portable reader
    portable = read_trace(path)
    assert _api_lists(portable) == _api_lists(whole)


def test_runtime_table_read_by_sqlite_in_two_ranges_as_in_one(
    make_trace: MakeTrace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Few rows kept of a long table: SQLite's own filtered query, its two row ranges on two
    threads (no compiled reader, no numba), reads what one query reads."""
    from nsysfrag.inputs.nsys import api_calls

    monkeypatch.setenv("NSYSFRAG_KERNELS", "interpreted")
    path = _runtime_export(make_trace)
    whole = read_trace(path)
    monkeypatch.setattr(api_calls, "_SPLIT_ROWS", 1)  # 8 rows: two ranges of 4
    split: list[str] = []
    split_select = api_calls._split_select
    monkeypatch.setattr(
        api_calls, "_split_select", lambda *a: split.append(a[2]) or split_select(*a)
    )
    halves = read_trace(path)
    assert split  # the pass over the table went through the two ranges
    assert _api_lists(halves) == _api_lists(whole)
    assert (halves.allocation_calls, halves.vmm_calls) == (whole.allocation_calls, whole.vmm_calls)


@pytest.mark.parametrize("thread_of_every_call", [True, False], ids=["decoded", "declined"])
def test_runtime_table_of_a_dense_trace_decoded_from_pages_as_sqlite_reads_it(
    make_trace: MakeTrace, monkeypatch: pytest.MonkeyPatch, thread_of_every_call: bool
) -> None:
    """Where the memory table is as long as the runtime table, the page decoder reads the
    allocation and VMM calls; a VMM call without a thread (NULL) makes it decline, and SQLite's
    pass reads the table, counting that call all the same."""
    from nsysfrag.inputs.nsys import api_calls, reader, sqlite_pages

    path = _runtime_export(make_trace)
    if thread_of_every_call:
        with sqlite3.connect(path) as con:
            con.execute(
                "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = 5 WHERE globalTid IS NULL"
            )
        con.close()
    monkeypatch.setattr(reader, "LITERAL_IDS", 0)  # a large memory table: no correlated pass
    sqlite_read = read_trace(path)
    monkeypatch.setenv("NSYSFRAG_KERNELS", "compiled")  # the decoder, whatever the size
    monkeypatch.setattr(api_calls, "_DENSE_MEMORY_ROWS_PER_CALL", 0.0)
    decoded: list[bool] = []
    read_columns = sqlite_pages.read_columns

    def spied(*args: object, **kwargs: object) -> object:
        got = read_columns(*args, **kwargs)  # type: ignore[arg-type]
        if args[2] == api_calls.RUNTIME_TABLE:
            decoded.append(got is not None)
        return got

    monkeypatch.setattr(sqlite_pages, "read_columns", spied)
    dense = read_trace(path)
    assert decoded == [thread_of_every_call]
    assert _api_lists(dense) == _api_lists(sqlite_read)
    assert (dense.allocation_calls, dense.vmm_calls) == (sqlite_read.allocation_calls, 2)
    assert dense.api.is_failed_allocation.tolist() == [False, True, False]

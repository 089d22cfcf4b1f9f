"""Nesting without bound and sizes a file only claims (issue 25, items 2 and 3).

- A pickle whose dict key is a tuple nested a million deep: hashing it recursed in C until the
  interpreter crashed (SIGSEGV, exit 139, nothing on stderr). The opcodes are now checked
  before the unpickler builds them (``inputs/torch_snapshot/pickle_scan.py``).
- Limits keyed on a file's size count the bytes really there: a pickle's bytes up to its STOP,
  an export's blocks on disk and SQLite's page count, never a sparse tail.
- SQLite work on an export is bounded by time and by the size of one value, not by steps alone.
"""

from __future__ import annotations

import os
import pickle
import sqlite3
import struct
import time
from pathlib import Path

import pytest

from nsysfrag.inputs.torch_snapshot.pickle_scan import OK, TUPLES_TOO_DEEP, scan_bytes
from tests.hostile import nsys_cases as cases
from tests.hostile.contract import run_nsysfrag
from tests.hostile.pickles import entries_bomb

TIB = 1 << 40


def _sparse_tail(path: Path, size: int) -> Path:
    """Make ``path`` ``size`` bytes long, the rest a hole (no block on disk)."""
    with open(path, "r+b") as f:
        f.truncate(size)
    if os.stat(path).st_blocks * 512 >= size:
        pytest.skip("this file system stores no sparse files")
    return path


def _timed(argv: list[object], inputs: list[Path], **kw: object) -> tuple[object, float]:
    started = time.monotonic()
    out = run_nsysfrag(argv, inputs=inputs, **kw)  # type: ignore[arg-type]
    return out, time.monotonic() - started


# ---------------------------------------------------------------- nesting


def _deep_tuple_key(depth: int) -> bytes:
    """{((((…)))): None}: a dict whose key is a tuple nested ``depth`` deep (one byte a level)."""
    return b"\x80\x04}" + b")" + b"\x85" * depth + b"Ns."


@pytest.mark.parametrize("command", ["analyze", "whatif"])
def test_a_dict_key_nested_a_million_deep_is_refused_not_a_crash(
    tmp_path: Path, command: str
) -> None:
    # main: exit 139 (SIGSEGV in tuple hashing), nothing on stderr
    path = tmp_path / "deep.pickle"
    path.write_bytes(_deep_tuple_key(1_000_000))
    assert 900_000 < path.stat().st_size < 1_100_000
    out = run_nsysfrag([command, path], inputs=[path])
    assert out.returncode == 2 and "tuples nested more than 1,000 deep" in out.stderr


def test_deep_tuples_through_the_memo_are_refused_too() -> None:
    # Each level fetched back from the memo: no opcode stream shows the depth on the stack.
    out = bytearray(b"\x80\x04)\x94")
    for level in range(2000):
        out += b"j" + struct.pack("<I", level) + b"\x85\x94"
    assert scan_bytes(bytes(out) + b".", 1000).status == TUPLES_TOO_DEEP


def test_the_nesting_limit_can_be_raised(tmp_path: Path) -> None:
    path = tmp_path / "deep.pickle"
    path.write_bytes(_deep_tuple_key(1500))
    out = run_nsysfrag(["analyze", path], inputs=[path], env={"NSYSFRAG_PICKLE_NESTING": "2000"})
    assert out.returncode == 2 and "not a PyTorch memory snapshot" in out.stderr


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_the_pass_reads_every_protocol_as_pickle_does(protocol: int) -> None:
    data = {"segments": [{"k": (1, (2, (3,))), "v": [1.5, None, True, b"x" * 300]}],
            "s": {frozenset({1}), (4,)}, "big": 2**100, "text": "é" * 300}  # fmt: skip
    blob = pickle.dumps(data, protocol=protocol)
    scan = scan_bytes(blob + b"trailing bytes", 1000)
    assert scan.status == OK and scan.end == len(blob) and scan.deepest_tuple == 3


# ---------------------------------------------------------------- sizes that are claimed


def test_a_memo_bomb_padded_with_a_sparse_tail_is_refused_by_its_real_bytes(tmp_path: Path) -> None:
    # main: the 2 MB file, padded to 100 MiB, was allowed 26 M entries: 29-47 s, 3.6 GB and
    # "internal error: MemoryError"
    path = tmp_path / "bomb.pickle"
    path.write_bytes(entries_bomb(per_list=1_000_000, lists=25))
    _sparse_tail(path, 100 << 20)
    out, took = _timed(["analyze", path, "-q"], [path])
    assert out.returncode == 2 and "25,000,000 trace entries" in out.stderr  # type: ignore[attr-defined]
    assert took < 20


def test_a_snapshot_with_a_terabyte_sparse_tail_reads_as_itself(tmp_path: Path) -> None:
    path = tmp_path / "tail.pickle"
    path.write_bytes((Path(__file__).parents[2] / "sample_traces" / "training_snapshot.pickle").read_bytes())
    _sparse_tail(path, TIB)
    out, took = _timed(["analyze", path, "-q"], [path])
    assert out.returncode == 0 and took < 20  # type: ignore[attr-defined]


def test_an_endless_view_behind_a_terabyte_sparse_tail_is_stopped(tmp_path: Path) -> None:
    # main: refused in 2 s as it is; with a sparse 1 TiB tail its budget was 5·10^13 steps
    # (past 60 s)
    path = cases.view_memory_table(tmp_path / "endless.sqlite", cases.ENDLESS_VIEW)
    _sparse_tail(path, TIB)
    out, took = _timed(["analyze", path, "-q"], [path])
    assert out.returncode == 2 and "more SQLite work" in out.stderr  # type: ignore[attr-defined]
    assert took < 20


def test_a_view_of_20_mb_values_per_row_is_stopped_by_the_clock(tmp_path: Path) -> None:
    # main: 39 s: the budget counted virtual-machine steps, and each step made 20 MB
    body = cases.ENDLESS_VIEW.replace("r.bytes,", "length(randomblob(20000000)) AS bytes,").replace(
        "FROM n)", "FROM n LIMIT 1000)"
    )  # 4,000 rows of a few steps each, 90 ms each
    path = cases.view_memory_table(tmp_path / "heavy.sqlite", body)
    out, took = _timed(["analyze", path, "-q"], [path], env={"NSYSFRAG_SQLITE_SECONDS": "2"})
    assert out.returncode == 2 and "more than 2 s of SQLite work" in out.stderr  # type: ignore[attr-defined]
    assert took < 15


def test_a_value_larger_than_any_export_holds_is_refused(tmp_path: Path) -> None:
    body = "SELECT start, globalPid, deviceId, contextId, address, pc, zeroblob(300000000) AS" \
           " bytes, memKind, memoryOperationType, correlationId FROM recorded"  # fmt: skip
    path = cases.view_memory_table(tmp_path / "big.sqlite", body)
    out = run_nsysfrag(["analyze", path, "-q"], inputs=[path])
    assert out.returncode == 2 and "larger than 268,435,456 bytes" in out.stderr


def test_the_budget_counts_sqlites_pages_not_the_file_size(tmp_path: Path) -> None:
    from nsysfrag.inputs.nsys.export_file import WorkBudget, database_uri

    path = cases.small_trace(tmp_path / "t.sqlite")
    con = sqlite3.connect(path)
    pages = con.execute("PRAGMA page_count").fetchone()[0] * con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    with open(path, "ab") as f:  # bytes really there, after the last page SQLite knows
        f.write(b"\0" * (8 << 20))
    budget = WorkBudget(path)
    budget.connect(database_uri(path, path.read_bytes()[:100])).close()
    assert budget.present <= pages

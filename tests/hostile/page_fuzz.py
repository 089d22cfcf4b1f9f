"""The page decoder against SQLite on mutated pages, as a process of its own.

    python -m tests.hostile.page_fuzz --cases 100000 --seed 1 FILE.sqlite ...

Each case overwrites bytes of one table's pages in a scratch copy of a file (random bytes, bit
flips, a record header claiming 2^62-byte values, a cell count of 65,535, a child pointer to
any page, a truncated file), runs ``sqlite_pages.read_columns`` on it exactly as the reader
does (SQLite's ``count(*)`` first), and SQLite's own query of the same columns; the bytes are
put back before the next case. The decoder must return SQLite's rows or decline (None); rows
where SQLite refuses the file, or other rows, are a failure (exit 1, the case on stdout). A
crash by signal ends this process: the test that starts it (tests/test_sqlite_pages.py) reports
it as a failure, with the last case printed. Each case's mutation follows from ``seed + case``
alone, so ``--first CASE --cases 1`` replays one.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nsysfrag.inputs.nsys import sqlite_pages as pages


@dataclass(frozen=True)
class Read:
    """One read the reader makes: a table, its columns as the decoder's spec and as SQL."""

    table: str
    columns: list[pages.Column]
    sql: list[str]
    where: tuple[str, int, list[int]] | None = None  # SQL column, record column, ids


def reads(con: sqlite3.Connection) -> list[Read]:
    """The reads the reader makes of this file's tables (nsys's memory and runtime tables), or
    of every column of every other table (a generated one)."""
    found = []
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        index = pages.record_columns(con, table)
        if index is None:
            continue
        if table == "CUDA_GPU_MEMORY_USAGE_EVENTS":
            names = ["start", "address", "bytes", "correlationId", "globalPid", "deviceId",
                     "memKind", "memoryOperationType"]  # fmt: skip
            columns = [pages.Column(index[n.lower()]) for n in names]
            columns[3] = pages.Column(index["correlationid"], pages.INTEGER_OR_MINUS_ONE)
            sql = [*names[:3], "coalesce(correlationId, -1)", *names[4:]]
            found.append(Read(table, columns, sql))
        elif table == "CUPTI_ACTIVITY_KIND_RUNTIME":
            at = [index[n.lower()] for n in ("start", "globalTid", "eventClass", "returnValue", "nameId")]
            ids = sorted({r[0] for r in con.execute(f"SELECT nameId FROM {table} LIMIT 50")})[:3]
            listed = ",".join(map(str, ids)) or "NULL"
            columns = [pages.Column(at[0]), pages.Column(at[1]), pages.Column(at[2], pages.CALL_FLAGS, at[3])]
            sql = ["start", "globalTid",
                   f"coalesce(eventClass = 0, 0) + 2 * coalesce(nameId IN ({listed}) AND returnValue != 0, 0)"]  # fmt: skip
            found.append(Read(table, columns, sql, ("nameId", at[4], ids)))
        elif not table.startswith(("sqlite_", "CUDA_", "CUPTI_", "TARGET_", "ENUM_", "NVTX_", "StringIds")):
            positions = sorted(p for p in index.values() if p >= 0)
            names = [r[1] for r in con.execute(f"PRAGMA table_xinfo('{table}')")]
            found.append(Read(table, [pages.Column(p) for p in positions], [names[p] for p in positions]))
    return found


def decoded(path: Path, read: Read) -> list[tuple[int, ...]] | None | str:
    """The decoder's rows (None: declined; "refused": SQLite's count failed first)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        try:
            rows = con.execute(f"SELECT count(*) FROM {read.table}").fetchone()[0]
        except sqlite3.DatabaseError:
            return "refused"
        where = (read.where[1], read.where[2]) if read.where else None
        got = pages.read_columns(path, con, read.table, read.columns, rows, where)
    return None if got is None else [tuple(int(a[i]) for a in got) for i in range(len(got[0]) if got else 0)]


def queried(path: Path, read: Read) -> list[tuple[object, ...]] | None:
    """SQLite's own rows, or None where it refuses the file."""
    where = ""
    if read.where:
        where = f" WHERE {read.where[0]} IN ({','.join(map(str, read.where[2])) or 'NULL'})"
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
            return con.execute(
                f"SELECT {', '.join(read.sql)} FROM {read.table}{where} ORDER BY rowid"
            ).fetchall()
    except sqlite3.DatabaseError:
        return None


def table_pages(path: Path, table: str) -> list[int]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return [r[0] for r in con.execute("SELECT pageno FROM dbstat WHERE name = ?", (table,))]


Mutation = Callable[[random.Random, bytearray, int, list[int]], None]


def _random_bytes(rng: random.Random, data: bytearray, size: int, numbers: list[int]) -> None:
    for _ in range(rng.randint(1, 12)):
        page = rng.choice(numbers)
        data[(page - 1) * size + rng.randrange(size)] = rng.randrange(256)


def _bit_flips(rng: random.Random, data: bytearray, size: int, numbers: list[int]) -> None:
    for _ in range(rng.randint(1, 4)):
        at = (rng.choice(numbers) - 1) * size + rng.randrange(size)
        data[at] ^= 1 << rng.randrange(8)


def _cell(rng: random.Random, data: bytearray, size: int, numbers: list[int]) -> int:
    """A random cell's offset in the file (a leaf's or an interior page's)."""
    page = rng.choice(numbers)
    start = (page - 1) * size
    header = start + (100 if page == 1 else 0)
    cells = data[header + 3] << 8 | data[header + 4]
    if cells == 0:
        return header
    pointers = header + (12 if data[header] == 5 else 8)
    k = rng.randrange(min(cells, (size - 12) // 2))
    return start + (data[pointers + 2 * k] << 8 | data[pointers + 2 * k + 1]) % size


def _huge_serial_types(rng: random.Random, data: bytearray, size: int, numbers: list[int]) -> None:
    # A record header whose types claim 2^62-byte texts: payload, rowid, header size, then types.
    at = _cell(rng, data, size, numbers) + rng.randint(2, 8)
    huge = [0xFF] * 8 + [rng.choice([0x7F, 0xFE, 0x0C])]
    data[at : at + 9 * 2] = bytes(huge * 2)[: len(data) - at]


def _cell_counts(rng: random.Random, data: bytearray, size: int, numbers: list[int]) -> None:
    page = rng.choice(numbers)
    header = (page - 1) * size + (100 if page == 1 else 0)
    count = rng.choice([0, 1, 0xFFFF, 0x8000, (size - 8) // 6, (size - 8) // 6 + 1, rng.randrange(1 << 16)])
    data[header + 3 : header + 5] = count.to_bytes(2, "big")


def _child_pointers(rng: random.Random, data: bytearray, size: int, numbers: list[int]) -> None:
    pages_in_file = len(data) // size
    target = rng.choice([0, 1, rng.choice(numbers), pages_in_file, pages_in_file + 1, 2**32 - 1,
                         rng.randrange(1, pages_in_file + 1)])  # fmt: skip
    at = _cell(rng, data, size, numbers)
    data[at : at + 4] = target.to_bytes(4, "big")
    if rng.random() < 0.5:
        page = rng.choice(numbers)
        right = (page - 1) * size + (100 if page == 1 else 0) + 8
        data[right : right + 4] = target.to_bytes(4, "big")


def _varints(rng: random.Random, data: bytearray, size: int, numbers: list[int]) -> None:
    at = _cell(rng, data, size, numbers)
    run = rng.randint(1, 10)
    data[at : at + run] = bytes(rng.choice([0xFF, 0x80, 0x81, rng.randrange(256)]) for _ in range(run))[: len(data) - at]


MUTATIONS: list[Mutation] = [_random_bytes, _random_bytes, _bit_flips, _huge_serial_types,
                             _cell_counts, _child_pointers, _varints]  # fmt: skip


def run(sources: list[Path], first: int, cases: int, seed: int, scratch: Path) -> int:
    copies = []
    for k, source in enumerate(sources):
        copy = scratch / f"{k}.sqlite"
        shutil.copyfile(source, copy)
        with sqlite3.connect(f"file:{copy}?mode=ro", uri=True) as con:
            size = con.execute("PRAGMA page_size").fetchone()[0]
            found = reads(con)
        for read in found:
            if isinstance(decoded(copy, read), list):  # a table it declines whole fuzzes nothing
                copies.append((copy, size, read, table_pages(copy, read.table)))
    original = {c: c.read_bytes() for c, *_ in copies}
    outcomes = {"equal": 0, "declined": 0, "refused": 0}
    for case in range(first, first + cases):
        print(case, flush=True)
        rng = random.Random(seed * 1_000_003 + case)
        path, size, read, numbers = rng.choice(copies)
        data = bytearray(original[path])
        if rng.random() < 0.05:
            data = data[: rng.randrange(1, len(data) // size + 1) * size - rng.choice([0, 0, 1, 100])]
        else:
            rng.choice(MUTATIONS)(rng, data, size, numbers)
        path.write_bytes(data)
        got = decoded(path, read)
        if got == "refused":
            outcomes["refused"] += 1
        elif got is None:
            outcomes["declined"] += 1
        else:
            expected = queried(path, read)
            if expected is None or got != [tuple(r) for r in expected]:
                print(f"case {case} (seed {seed}): the decoder read {len(got)} rows of {read.table}"
                      f" where SQLite {'refuses the file' if expected is None else f'reads {len(expected)} others'}")  # fmt: skip
                return 1
            outcomes["equal"] += 1
        path.write_bytes(original[path])
    print(" ".join(f"{k}={v}" for k, v in outcomes.items()), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("sources", nargs="+", type=Path)
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        return run(args.sources, args.first, args.cases, args.seed, Path(scratch))


if __name__ == "__main__":
    os.environ.setdefault("NSYSFRAG_KERNELS", "compiled")
    sys.exit(main())

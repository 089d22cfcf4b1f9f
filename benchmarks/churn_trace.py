"""Generate large random-churn traces (one space, nsys schema) for the benchmarks.

Deterministic for a given size and seed, and cached under benchmarks/.data/ because writing
millions of rows takes longer than analyzing them.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from nsysfrag.testing.nsys_export import ExportOptions, Gpu, global_pid, global_tid, write_export

DATA = Path(__file__).resolve().parent / ".data"
PID, TID = 4242, 4243
SLOT = 1 << 20  # every block sits at the start of its own 1 MiB slot, so none overlap
BASE = 0x7F00_0000_0000


def churn_trace(events: int, seed: int = 1) -> Path:
    """A trace of ``events`` memory events: random allocations (512 B – 1 MiB, log-uniform)
    and frees of random live blocks, each with its runtime API row, under NVTX ranges."""
    DATA.mkdir(exist_ok=True)
    path = DATA / f"churn_{events}_{seed}.sqlite"
    if path.exists():
        return path
    rng = random.Random(seed)
    tmp = path.with_suffix(".tmp")
    write_export(tmp, [], gpus=[Gpu(0, "NVIDIA H100 80GB HBM3", 85_520_809_984)], options=ExportOptions())
    con = sqlite3.connect(tmp)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    name_ids = {}
    for name in ("cudaMalloc_v3020", "cudaFree_v3020"):
        name_ids[name] = con.execute("SELECT coalesce(max(id), 0) + 1 FROM StringIds").fetchone()[0]
        con.execute("INSERT INTO StringIds VALUES (?, ?)", (name_ids[name], name))
    con.execute(
        "CREATE TABLE IF NOT EXISTS CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,"
        " eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,"
        " returnValue INTEGER NOT NULL, callchainId INTEGER)"
    )
    con.execute(
        "CREATE TABLE IF NOT EXISTS NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,"
        " rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER,"
        " textId INTEGER, domainId INTEGER)"
    )
    gpid, gtid = global_pid(PID), global_tid(PID, TID)
    free_slots = list(range(60_000))
    live: list[tuple[int, int]] = []
    memory, api, nvtx = [], [], []
    t = 1_000_000
    step_start = t
    for i in range(events):
        t += rng.randint(200, 3000)
        corr = i + 1
        if live and (rng.random() < 0.5 or not free_slots):
            j = rng.randrange(len(live))
            live[j], live[-1] = live[-1], live[j]
            slot, size = live.pop()
            free_slots.append(slot)
            memory.append((t, gpid, 0, 1, BASE + slot * SLOT, 0, size, 2, 1, corr))
            api.append((t - 100, t + 100, 0, gtid, corr, name_ids["cudaFree_v3020"], 0))
        else:
            j = rng.randrange(len(free_slots))
            free_slots[j], free_slots[-1] = free_slots[-1], free_slots[j]
            slot = free_slots.pop()
            size = int(2 ** rng.uniform(9, 20))
            live.append((slot, size))
            memory.append((t, gpid, 0, 1, BASE + slot * SLOT, 0, size, 2, 0, corr))
            api.append((t - 100, t + 100, 0, gtid, corr, name_ids["cudaMalloc_v3020"], 0))
        if (i + 1) % 1000 == 0:
            nvtx.append((step_start, t + 1, 59, f"step/{rng.choice(['forward', 'backward', 'optimizer'])}", gtid))
            step_start = t + 2
        if len(memory) >= 200_000:
            _flush(con, memory, api, nvtx)
    _flush(con, memory, api, nvtx)
    con.commit()
    con.close()
    tmp.rename(path)
    return path


def _flush(con: sqlite3.Connection, memory: list, api: list, nvtx: list) -> None:  # type: ignore[type-arg]
    con.executemany(
        "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, address, pc,"
        " bytes, memKind, memoryOperationType, correlationId) VALUES (?,?,?,?,?,?,?,?,?,?)",
        memory,
    )
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?,NULL)", api)
    con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?,?,?,?,?)", nvtx)
    memory.clear()
    api.clear()
    nvtx.clear()

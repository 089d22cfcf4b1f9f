"""Record what the CUDA driver does with raw cudaMalloc/cudaFree, as a ground truth for the
observed model (the device's pages).

Needs an NVIDIA GPU and CuPy; nothing else (no nsys, no torch). Every call goes through
``cupy.cuda.runtime.malloc``/``free`` (no CuPy memory pool), and ``cudaMemGetInfo`` is read at
chosen moments. Three runs, each in a process of its own (a fresh context each):

* ``sizes``: the physical cost of each size: free memory before and after N allocations of
  1 B, 512 B, 64 KiB, 1 MiB, 2 MiB - 1, 2 MiB, 2 MiB + 1, 33 MiB and 800,000,000 B, read after
  the first few, at powers of two and after the last, then after freeing them all;
* ``checkerboard``: 92 % of the free memory in 2 MiB blocks, every other one freed, then one
  request of 40 % of the memory the run started with: no free address range is larger than
  2 MiB, but if freed pages come back wherever they lie, it succeeds;
* ``subpage``: the same with 1 MiB blocks, then requests of 10 % and 20 %: if the driver packs
  two 1 MiB blocks into one 2 MiB page, freeing every other block gives no page back and both
  fail; if it gives each block a page of its own, both succeed.

On a large card the checkerboards run inside a *budget* (``--budget``, 8 GiB by default): one
block first takes all free memory but the budget, so that the exports stay small (a 92 % fill
of an H200 in 1 MiB blocks would be 130,000 blocks); ``--budget 0`` fills the whole card.

Each run writes ``driver_<run>.sqlite``, an nsys-schema export made with the project's own
writer (memory rows with the calls' real times, API rows with correlation ids, failed calls as
API rows with returnValue 2 and no memory row, ``TARGET_INFO_GPU.totalMemory`` = the total that
cudaMemGetInfo reports), and ``driver_<run>_truth.json``: the cudaMemGetInfo readings, each
tagged with the index of the memory event after which it was read (-1: before the first), and
the big requests with their outcome. ``tests/test_driver_truth.py`` holds the model to them.
Run from the repository root on a machine with a GPU (under five minutes on an H200)::

    python sample_traces/make_driver_traces.py --out sample_traces
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # the project's export writer, without installing it
    sys.path.insert(0, str(HERE.parent))
from nsysfrag.testing.nsys_export import (  # noqa: E402
    ALLOC,
    DEVICE,
    FREE,
    ApiRow,
    ExportOptions,
    Gpu,
    MemoryRow,
    write_export,
)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
PAGE = 2 * MiB
TRUTH_SCHEMA = "nsysfrag-driver-truth/1"
FILL = 0.92  # of the free memory, in the checkerboards
DEFAULT_BUDGET = 8 * GiB
# (bytes, how many) for the sizes run: enough of each that packing shows, little memory in all.
SIZES = (
    (1, 2048),
    (512, 2048),
    (64 * KiB, 256),
    (1 * MiB, 256),
    (2 * MiB - 1, 128),
    (2 * MiB, 128),
    (2 * MiB + 1, 128),
    (33 * MiB, 32),
    (800_000_000, 8),
)
READ_EVERY = 4096  # memory events between readings during a fill
MALLOC, FREE_API = "cudaMalloc_v3020", "cudaFree_v3020"
OUT_OF_MEMORY = 2  # cudaErrorMemoryAllocation


class Recorder:
    """Raw cudaMalloc/cudaFree through CuPy's runtime, recorded as nsys records them, with the
    cudaMemGetInfo readings and big requests of the truth file."""

    def __init__(self, runtime: Any) -> None:
        self.rt = runtime
        runtime.setDevice(0)
        runtime.free(0)  # cudaFree(NULL): create the context before the first reading
        self.pid, self.tid = os.getpid(), threading.get_native_id()
        self.t0 = time.perf_counter_ns()
        self.memory: list[MemoryRow] = []
        self.api: list[ApiRow] = []
        self.readings: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.live: dict[int, int] = {}  # address -> bytes
        self._correlation = 0
        free, self.total = self.rt.memGetInfo()
        self.free_at_start = int(free)
        self.read("before the first allocation")

    def _now(self) -> int:
        return time.perf_counter_ns() - self.t0

    def _call(self, name: str, call: Callable[[], Any]) -> tuple[Any, int, int, int, int]:
        """(result, status, correlation id, start, end) of one API call."""
        self._correlation += 1
        start = self._now()
        try:
            result, status = call(), 0
        except self.rt.CUDARuntimeError as e:
            result, status = None, int(getattr(e, "status", OUT_OF_MEMORY))
        end = self._now()
        self.api.append(ApiRow(start, end, self.pid, self.tid, name, self._correlation, status))
        return result, status, self._correlation, start, end

    def malloc(self, nbytes: int) -> int | None:
        """A device address, or None when cudaMalloc failed (an API row, no memory row)."""
        address, status, corr, start, end = self._call(MALLOC, lambda: self.rt.malloc(nbytes))
        if status:
            return None
        address = int(address)
        # CUPTI stamps the memory event inside its call.
        when = (start + end) // 2
        self.memory.append(MemoryRow(when, self.pid, 0, address, nbytes, ALLOC, DEVICE, corr))
        self.live[address] = nbytes
        return address

    def free(self, address: int) -> None:
        nbytes = self.live.pop(address)
        _, status, corr, start, end = self._call(FREE_API, lambda: self.rt.free(address))
        if status:
            raise RuntimeError(f"cudaFree({address:#x}) returned {status}")
        when = (start + end) // 2
        self.memory.append(MemoryRow(when, self.pid, 0, address, nbytes, FREE, DEVICE, corr))

    def read(self, label: str) -> int:
        free, total = self.rt.memGetInfo()
        self.readings.append({
            "label": label,
            "after_event": len(self.memory) - 1,
            "free_bytes": int(free),
            "total_bytes": int(total),
            "time_ns": self._now(),
        })  # fmt: skip
        return int(free)

    def request(self, label: str, nbytes: int) -> int | None:
        """A big request whose success the model must predict: read before and after it."""
        self.read(f"before {label}")
        after_event = len(self.memory) - 1
        address = self.malloc(nbytes)
        self.requests.append({
            "label": label,
            "bytes": nbytes,
            "after_event": after_event,
            "succeeded": address is not None,
            "address": address,
        })  # fmt: skip
        self.read(f"after {label}")
        return address

    def free_all(self, label: str) -> None:
        for address in list(self.live):
            self.free(address)
        self.read(label)


# ---------------------------------------------------------------- the runs


def run_sizes(r: Recorder, budget: int) -> dict[str, Any]:
    costs = []
    for nbytes, count in SIZES:
        before = r.read(f"{nbytes} B: before")
        readings_at = {1, 2, 3, 4, count} | {1 << k for k in range(count.bit_length())}
        addresses = []
        for i in range(1, count + 1):
            address = r.malloc(nbytes)
            if address is None:
                r.read(f"{nbytes} B: failed at allocation {i}")
                break
            addresses.append(address)
            if i in readings_at:
                r.read(f"{nbytes} B: after {i}")
        after = r.readings[-1]["free_bytes"]
        for address in addresses:
            r.free(address)
        freed = r.read(f"{nbytes} B: after freeing them")
        steps = Counter(b - a for a, b in zip(addresses, addresses[1:]))
        costs.append({
            "bytes": nbytes,
            "count": len(addresses),
            "free_before": before,
            "free_after": after,
            "free_after_freeing": freed,
            "device_bytes_per_allocation": (before - after) / max(1, len(addresses)),
            # The most frequent distances between consecutive addresses: 512 says packed.
            "address_steps": [[step, n] for step, n in steps.most_common(4)],
            "pages_touched": len({a // PAGE for a in addresses}),
        })  # fmt: skip
    return {"sizes": costs}


def _take_all_but(r: Recorder, budget: int) -> int | None:
    """One block that leaves ``budget`` bytes (to a page) free, or None for no ballast."""
    free = r.read("before the ballast")
    if not budget or free <= budget + PAGE:
        return None
    ballast = (free - budget) // PAGE * PAGE
    address = r.malloc(ballast)
    r.read("after the ballast")
    return address


def _checkerboard(r: Recorder, block: int, budget: int) -> tuple[list[int], int]:
    """Fill FILL of the free memory with ``block``-byte blocks, free every other one; the
    blocks still live, and the free memory the fill started from."""
    _take_all_but(r, budget)
    start_free = r.read("before the fill")
    blocks = []
    for _ in range(int(start_free * FILL) // block):
        address = r.malloc(block)
        if address is None:
            break
        blocks.append(address)
        if len(r.memory) % READ_EVERY == 0:
            r.read("during the fill")
    r.read(f"after the fill ({len(blocks)} blocks)")
    for i, address in enumerate(blocks[::2]):
        r.free(address)
        if i % READ_EVERY == READ_EVERY - 1:
            r.read("while freeing every other block")
    r.read("after freeing every other block")
    return blocks[1::2], start_free


def run_checkerboard(r: Recorder, budget: int) -> dict[str, Any]:
    live, start_free = _checkerboard(r, 2 * MiB, budget)
    ask = int(0.4 * start_free)
    r.request("40 % of the start's free memory", ask)
    r.free_all("after freeing everything")
    return {"block_bytes": 2 * MiB, "start_free_bytes": start_free, "blocks_live": len(live)}


def run_subpage(r: Recorder, budget: int) -> dict[str, Any]:
    live, start_free = _checkerboard(r, 1 * MiB, budget)
    for share in (10, 20):
        address = r.request(f"{share} % of the start's free memory", share * start_free // 100)
        if address is not None:
            r.free(address)
            r.read(f"after freeing the {share} % block")
    r.free_all("after freeing everything")
    return {"block_bytes": 1 * MiB, "start_free_bytes": start_free, "blocks_live": len(live)}


RUNS: dict[str, tuple[Callable[[Recorder, int], dict[str, Any]], str]] = {
    "sizes": (run_sizes, "N allocations of each size, free memory before and after, then freed"),
    "checkerboard": (run_checkerboard, "92 % in 2 MiB blocks, every other one freed, then 40 %"),
    "subpage": (run_subpage, "92 % in 1 MiB blocks, every other one freed, then 10 % and 20 %"),
}


# ---------------------------------------------------------------- one run in its own process


def run_child(name: str, out: Path, budget: int) -> int:
    import cupy  # type: ignore[import-not-found]

    runtime = cupy.cuda.runtime
    t0 = time.monotonic()
    r = Recorder(runtime)
    work, summary = RUNS[name]
    details = work(r, budget)
    props = runtime.getDeviceProperties(0)
    device_name = props["name"]
    if isinstance(device_name, bytes):
        device_name = device_name.decode(errors="replace")
    export = write_export(
        out / f"driver_{name}.sqlite",
        r.memory,
        r.api,
        (),
        [Gpu(0, device_name, int(r.total))],
        ExportOptions(
            nsys_version="none: make_driver_traces.py (CuPy runtime)",
            cuda_devices=[(r.pid, 0, 0)],
            processes=[(r.pid, "python3")],
        ),
    )
    truth = {
        "schema": TRUTH_SCHEMA,
        "run": name,
        "summary": summary,
        "export": export.name,
        "device": {
            "name": device_name,
            "total_bytes": int(r.total),
            "cuda_runtime": runtime.runtimeGetVersion(),
            "cuda_driver": runtime.driverGetVersion(),
        },
        "cupy": getattr(cupy, "__version__", None),
        "python": platform.python_version(),
        "budget_bytes": budget,
        "fill": FILL,
        # What the context (and anything else on the card) held before the first allocation.
        "overhead_bytes": int(r.total) - r.free_at_start,
        "memory_events": len(r.memory),
        "readings": r.readings,
        "requests": r.requests,
        "elapsed_s": round(time.monotonic() - t0, 3),
        **details,
    }
    path = out / f"driver_{name}_truth.json"
    path.write_text(json.dumps(truth, indent=1) + "\n", encoding="utf-8")
    return 0


def run_all(names: list[str], out: Path, budget: int, timeout_s: float) -> int:
    """Each run in its own process; report each outcome; 1 if any failed."""
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in names:
        t0 = time.monotonic()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name,
               "--out", str(out), "--budget", str(budget)]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        try:
            rc = subprocess.run(cmd, check=False, env=env, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = -1
        truth = out / f"driver_{name}_truth.json"
        if rc == 0 and truth.exists():
            doc = json.loads(truth.read_text())
            outcomes = ", ".join(
                f"{q['label']}: {'ok' if q['succeeded'] else 'failed'}" for q in doc["requests"]
            )
            export = out / doc["export"]
            print(
                f"{name}: {doc['memory_events']:,} memory events, overhead"
                f" {doc['overhead_bytes'] / MiB:.1f} MiB, {outcomes or 'no big request'};"
                f" {export.name} {export.stat().st_size:,} B in {time.monotonic() - t0:.1f} s",
                flush=True,
            )
        else:
            failed += 1
            print(f"{name}: FAILED (exit {rc}) after {time.monotonic() - t0:.1f} s", flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=HERE, help="folder for the exports and truth JSON")
    p.add_argument("--run", action="append", choices=sorted(RUNS),
                   help="only this run (repeatable); default: all")  # fmt: skip
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET,
                   help="bytes the checkerboards run in (0: the whole card)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per run")
    p.add_argument("--child", choices=sorted(RUNS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return run_child(args.child, args.out, args.budget)
    return run_all(args.run or list(RUNS), args.out, args.budget, args.timeout)


if __name__ == "__main__":
    sys.exit(main())

"""Record genuine PyTorch memory snapshots whose out-of-memory outcome is known.

Unlike ``make_snapshots.py`` (which imitates the caching allocator without torch), this script
runs PyTorch's own allocator on a real CUDA device, so it needs torch with CUDA (and CuPy, or the
CUDA runtime library, to hold device memory outside PyTorch). Each scenario runs in its own
process, so its allocator settings (``PYTORCH_CUDA_ALLOC_CONF``) and ``memory_stats()`` are its
own:

* ``capacity``: a request larger than everything free, even after the allocator releases its
  cached segment (PyTorch raises OOM);
* ``capacity_expandable``: the same under ``expandable_segments:True``;
* ``fragmentation``: a 1 GiB segment cut into 16 blocks of 64 MiB, every other one freed, so
  512 MiB sits free between live blocks; a 384 MiB request fits in no hole, the device has too
  little left for a new segment, and PyTorch raises OOM;
* ``expandable``: the same workload under ``expandable_segments:True``: whether it raises OOM is
  what the run records;
* ``recovered``: a request that succeeds only after the allocator frees its cached segments (the
  OOM path that ends well);
* ``window``: the fragmentation workload with a 20-entry trace ring buffer, so the snapshot's
  window opens mid-run with blocks live that its trace never allocated.

A card of 141 GB is made small by holding all of it but a scenario's *budget* with plain
``cudaMalloc`` outside PyTorch's allocator, in the same process, after history recording starts.
The snapshot's ``oom`` entries therefore record a small ``device_free``, as on a full card.

Each scenario writes ``torch_<name>_snapshot.pickle`` (``torch.cuda.memory._dump_snapshot``,
``stacks="python"``) and ``torch_<name>_truth.json``: what PyTorch itself said, right at the OOM
or right after the last request: the exception's message (and its figures), the whole
``torch.cuda.memory_stats()``, ``torch.cuda.mem_get_info()``, the scenario's parameters, the
torch and CUDA versions and the device. ``tests/test_torch_ground_truth.py`` holds nsysfrag to
these files. Run from the repository root on a machine with a GPU::

    python sample_traces/make_torch_snapshots.py --out sample_traces
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MiB = 1 << 20
GiB = 1 << 30
TRUTH_SCHEMA = "nsysfrag-torch-truth/1"
MAX_ENTRIES = 10_000
# The environment variables that carry allocator settings; a scenario sets its own.
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    alloc_conf: str  # PYTORCH_CUDA_ALLOC_CONF for its process ("" = the defaults)
    budget_bytes: int  # device memory left free for PyTorch when the workload starts
    summary: str
    workload: str = ""  # the workload it runs, when not its own name
    max_entries: int = MAX_ENTRIES  # the trace ring buffer; every full run records far fewer


SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "capacity", "", 1024 * MiB,
            "three 200 MiB tensors and three small ones live, a fourth 200 MiB tensor freed "
            "(a cached, releasable segment); then a request of 512 MiB + 1000 B: more than "
            "device free + every free byte, so OOM after the cached segment is released",
        ),
        Scenario(
            "capacity_expandable", "expandable_segments:True", 1024 * MiB,
            "the capacity workload, budget and request under expandable_segments:True",
            workload="capacity",
        ),
        Scenario(
            "fragmentation", "", 1184 * MiB,
            "a 1 GiB tensor freed (one cached 1 GiB segment), 16 tensors of 64 MiB split from "
            "it, every other one freed (512 MiB stranded in 64 MiB holes); then a 384 MiB "
            "request: larger than any hole and than device free, smaller than the total free",
        ),
        Scenario(
            "expandable", "expandable_segments:True", 1184 * MiB,
            "the fragmentation workload, budget and request under expandable_segments:True",
            workload="fragmentation",
        ),
        Scenario(
            "window", "", 1184 * MiB,
            "the fragmentation workload with a 20-entry trace: the ring buffer drops the first "
            "allocations, so the window opens with blocks live that the trace never allocated",
            workload="fragmentation", max_entries=20,
        ),
        Scenario(
            "recovered", "", 1024 * MiB,
            "a 200 MiB tensor live and two 300 MiB tensors freed (600 MiB cached in two "
            "segments); then a 500 MiB request: no cached block holds it and the device has "
            "too little left, so the allocator frees the cached segments and retries",
        ),
    )
}  # fmt: skip


# ---------------------------------------------------------------- PyTorch's words, parsed


def format_size(n: int) -> str:
    """PyTorch's ``format_size`` (c10/cuda/CUDACachingAllocator.cpp): how the OOM message
    writes a byte count, two decimals, KiB up to 1 MiB, MiB up to 1 GiB."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= MiB:
        return f"{n / 1024:.2f} KiB"
    if n <= GiB:
        return f"{n / MiB:.2f} MiB"
    return f"{n / GiB:.2f} GiB"


_SIZE = r"(\d+(?:\.\d+)? (?:bytes|KiB|MiB|GiB))"
_MESSAGE_FIGURES = {
    "tried_to_allocate": rf"Tried to allocate {_SIZE}",
    "total_capacity": rf"total capacity of {_SIZE}",
    "device_free": rf"of which {_SIZE} is free",
    "allocated_by_pytorch": rf"{_SIZE} is allocated by PyTorch",
    "reserved_unallocated": rf"{_SIZE} is reserved by PyTorch but unallocated",
}


def oom_message_figures(message: str) -> dict[str, str | None]:
    """The figures an OOM message states, as PyTorch wrote them (``"386.00 MiB"``), or None for
    a figure this torch version does not state."""
    out: dict[str, str | None] = {}
    for key, pattern in _MESSAGE_FIGURES.items():
        m = re.search(pattern, message)
        out[key] = m.group(1) if m else None
    return out


# ---------------------------------------------------------------- the parent: one process each


def child_env(scenario: Scenario) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ALLOC_CONF_VARS}
    if scenario.alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = scenario.alloc_conf
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_all(names: list[str], out: Path, timeout_s: float) -> int:
    """Run each scenario in its own process; report each outcome; 1 if any failed."""
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in names:
        scenario = SCENARIOS[name]
        t0 = time.monotonic()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--out", str(out)]
        try:
            rc = subprocess.run(
                cmd, check=False, env=child_env(scenario), timeout=timeout_s
            ).returncode
        except subprocess.TimeoutExpired:
            rc = -1
        took = time.monotonic() - t0
        truth = out / f"torch_{name}_truth.json"
        if rc == 0 and truth.exists():
            doc = json.loads(truth.read_text())
            snap = out / doc["snapshot"]
            print(
                f"{name}: {doc['outcome']} in {took:.1f} s; {snap.name} {snap.stat().st_size:,} B, "
                f"{truth.name} {truth.stat().st_size:,} B",
                flush=True,
            )
        else:
            failed += 1
            print(f"{name}: FAILED (exit {rc}) after {took:.1f} s", flush=True)
    return 1 if failed else 0


# ---------------------------------------------------------------- the child: the workload


class DeviceHold:
    """Device memory taken with plain cudaMalloc, outside PyTorch's allocator (CuPy's raw
    runtime call, else the CUDA runtime library that torch loaded), so that PyTorch meets a
    nearly full card. The primary context is shared, so the driver's free memory counts it."""

    def __init__(self) -> None:
        self.pointers: list[int] = []
        self.bytes = 0
        self.via, self._malloc, self._free = self._runtime()

    @staticmethod
    def _runtime() -> tuple[str, Callable[[int], int | None], Callable[[int], None]]:
        try:
            import cupy  # type: ignore[import-not-found]

            runtime = cupy.cuda.runtime

            def cupy_malloc(n: int) -> int | None:
                try:
                    return int(runtime.malloc(n))
                except runtime.CUDARuntimeError:
                    return None

            return "cupy.cuda.runtime.malloc", cupy_malloc, runtime.free
        except ImportError:
            pass
        import ctypes

        lib = None
        for soname in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
            try:
                lib = ctypes.CDLL(soname)
                break
            except OSError:
                continue
        if lib is None:
            raise SystemExit("make_torch_snapshots: need CuPy or libcudart to hold device memory")

        def ctypes_malloc(n: int) -> int | None:
            ptr = ctypes.c_void_p()
            if lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(n)) != 0:
                lib.cudaGetLastError()  # clear the sticky-free error state
                return None
            return int(ptr.value or 0)

        def ctypes_free(p: int) -> None:
            lib.cudaFree(ctypes.c_void_p(p))

        return "ctypes libcudart cudaMalloc", ctypes_malloc, ctypes_free

    def leave_free(self, target: int, free_now: Callable[[], int]) -> int:
        """Take device memory in chunks until ``target`` bytes (to 2 MiB) are free; the free
        bytes reached."""
        chunk = 16 * GiB
        while True:
            excess = free_now() - target
            if excess < 2 * MiB:
                return free_now()
            n = min(chunk, excess) // (2 * MiB) * (2 * MiB)
            p = self._malloc(n)
            if p is None:
                chunk //= 2
                if chunk < 2 * MiB:
                    return free_now()
                continue
            self.pointers.append(p)
            self.bytes += n

    def release(self) -> None:
        for p in self.pointers:
            self._free(p)
        self.pointers.clear()


class Workload:
    """One scenario's tensors and what happened to them, in order."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.live: dict[str, Any] = {}
        self.steps: list[dict[str, Any]] = []

    def alloc(self, name: str, nbytes: int) -> None:
        self.live[name] = self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")
        self.steps.append({"step": "alloc", "tensor": name, "bytes": nbytes})

    def free(self, name: str) -> None:
        del self.live[name]
        self.steps.append({"step": "free", "tensor": name})


def workload_capacity(w: Workload) -> int:
    for k in range(4):
        w.alloc(f"big{k}", 200 * MiB)
    for k in range(3):
        w.alloc(f"small{k}", 300_000)  # small pool: one 2 MiB segment, partly used
    w.free("big3")  # a whole cached segment: the OOM path releases it first
    return 512 * MiB + 1000  # rounded to 512 MiB + 1024 by the allocator


def workload_fragmentation(w: Workload) -> int:
    w.alloc("slab", 1024 * MiB)
    w.free("slab")  # cached: the 64 MiB tensors below split it from its low end
    for k in range(16):
        w.alloc(f"t{k:02d}", 64 * MiB)
    for k in range(1, 16, 2):
        w.free(f"t{k:02d}")
    return 384 * MiB


def workload_recovered(w: Workload) -> int:
    w.alloc("keep", 200 * MiB)
    w.alloc("a", 300 * MiB)
    w.alloc("b", 300 * MiB)
    w.free("a")
    w.free("b")
    return 500 * MiB


WORKLOADS: dict[str, Callable[[Workload], int]] = {
    "capacity": workload_capacity,
    "fragmentation": workload_fragmentation,
    "recovered": workload_recovered,
}


def run_child(name: str, out: Path) -> int:
    import torch

    if not torch.cuda.is_available():
        print("make_torch_snapshots: no CUDA device", file=sys.stderr)
        return 3
    scenario = SCENARIOS[name]
    torch.cuda.init()
    free0, total = torch.cuda.mem_get_info()  # creates the context before anything is held
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all", stacks="python", max_entries=scenario.max_entries
    )
    hold = DeviceHold()
    budget = hold.leave_free(scenario.budget_bytes, lambda: int(torch.cuda.mem_get_info()[0]))
    print(f"{name}: held {hold.bytes / GiB:.2f} GiB via {hold.via}; {budget / MiB:.1f} MiB free")

    out_of_memory = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    w = Workload(torch)
    request = WORKLOADS[scenario.workload or name](w)
    oom: dict[str, Any] | None = None
    try:
        w.alloc("request", request)
        outcome = "allocated"
    except out_of_memory as e:
        outcome = "oom"
        message = str(e)
        oom = {"type": type(e).__name__, "message": message,
               "figures": oom_message_figures(message)}  # fmt: skip
        w.steps.append({"step": "oom", "tensor": "request", "bytes": request})
    except RuntimeError as e:  # not an OOM (a driver without the VMM calls, say): say so
        outcome = "error"
        oom = {"type": type(e).__name__, "message": str(e), "figures": {}}
    # PyTorch's own figures at that moment: nothing ran between the failure (or the last
    # allocation) and these calls.
    stats = dict(torch.cuda.memory_stats())
    free_after, total_after = torch.cuda.mem_get_info()
    snapshot = out / f"torch_{name}_snapshot.pickle"
    torch.cuda.memory._dump_snapshot(str(snapshot))
    torch.cuda.memory._record_memory_history(enabled=None)
    w.live.clear()
    hold.release()

    truth = {
        "schema": TRUTH_SCHEMA,
        "scenario": name,
        "summary": scenario.summary,
        "snapshot": snapshot.name,
        "alloc_conf": scenario.alloc_conf,
        "parameters": {
            "budget_bytes": scenario.budget_bytes,
            "request_bytes": request,
            "max_entries": scenario.max_entries,
            "stacks": "python",
        },
        "steps": w.steps,
        "outcome": outcome,
        "oom": oom,
        "memory_stats": stats,
        "mem_get_info": {"free_bytes": int(free_after), "total_bytes": int(total_after)},
        "before_workload": {
            "context_free_bytes": int(free0),
            "held_outside_torch_bytes": hold.bytes,
            "held_via": hold.via,
            "free_bytes": int(budget),
        },
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "device_name": torch.cuda.get_device_name(0),
        "device_total_bytes": int(total),
    }
    (out / f"torch_{name}_truth.json").write_text(
        json.dumps(truth, indent=1, sort_keys=True) + "\n"
    )
    return 0


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=HERE, help="folder for the pickles and truth JSON")
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                   help="run only this scenario (repeatable); default: all")  # fmt: skip
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per scenario")
    p.add_argument("--child", choices=sorted(SCENARIOS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return run_child(args.child, args.out)
    names = args.scenario or list(SCENARIOS)
    return run_all(names, args.out, args.timeout)


if __name__ == "__main__":
    sys.exit(main())

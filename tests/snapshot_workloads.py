"""Random PyTorch memory snapshots from the sample generator's caching allocator.

``sample_traces/make_snapshots.py`` re-implements PyTorch's caching allocator to write the
sample snapshots; here the same engine serves random workloads (mallocs of every pool's sizes,
frees on the side stream, ``empty_cache()``, OOMs on a small device, expandable segments), and
the trace is cut at a random point as the ring buffer would. ``perturb`` then edits the trace the
way a corrupt or concatenated snapshot would (drops, duplicates, moved addresses, other streams),
so the replays' conflict paths are exercised too.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from hypothesis import strategies as st

from tests.conftest import SAMPLES

MiB = 1 << 20


def make_snapshots() -> ModuleType:
    """``sample_traces/make_snapshots.py`` as a module (it is a script, not a package)."""
    name = "tests_make_snapshots"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SAMPLES / "make_snapshots.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return sys.modules[name]


@dataclass(frozen=True)
class Op:
    kind: str  # "malloc", "free", "free_side", "empty_cache"
    size: int = 0  # malloc: requested bytes
    pick: int = 0  # free: which live block (modulo how many there are)
    site: int = 0  # malloc: which call site


def run_workload(
    ops: list[Op], *, expandable: bool, capacity: int, keep: int, device: int = 0,
    gc: bool = False,
) -> dict[str, Any]:
    """The snapshot the allocator would dump after ``ops``, its trace cut to the last
    ``keep`` entries; with ``gc``, a memory fraction and a garbage-collection threshold set
    (the allocator then frees cached segments on its own)."""
    ms = make_snapshots()
    va = 0x7F00_0000_0000 + device * (1 << 40)
    pressure = {"memory_fraction": 0.8, "gc_threshold": 0.5} if gc else {}
    a = ms.CachingAllocator(capacity, 4 * MiB, expandable=expandable, va_base=va, **pressure)
    stacks = ms.Stacks(f"/work/project{device}")
    sites = [
        stacks.py(("model.py", 10, "forward")),
        stacks.py(("model.py", 20, "forward"), ("train.py", 5, "step"), torch_frames=ms.LINEAR),
        stacks.autograd("MmBackward0"),
        stacks.py(("data.py", 3, "load")),
        [],
    ]
    live = []
    for op in ops:
        if op.kind == "malloc":
            try:
                live.append(a.malloc(op.size, sites[op.site % len(sites)]))
            except ms.OutOfMemory:
                pass
        elif op.kind in ("free", "free_side") and live:
            a.free(live.pop(op.pick % len(live)), side_stream=op.kind == "free_side")
        elif op.kind == "empty_cache":
            a.empty_cache()
        a.tick(10)
    snap: dict[str, Any] = a.snapshot("expandable_segments:True" if expandable else "")
    snap["device_traces"] = [a.trace[len(a.trace) - min(keep, len(a.trace)) :]]
    if device:
        for s in snap["segments"]:
            s["device"] = device
        snap["device_traces"] = [[] for _ in range(device)] + snap["device_traces"]
    return snap


def merge(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two devices' snapshots as one (the second's traces already sit at its device index)."""
    out = dict(first)
    out["segments"] = first["segments"] + second["segments"]
    traces = list(second["device_traces"])
    traces[0] = first["device_traces"][0]
    out["device_traces"] = traces
    return out


def perturb(snap: dict[str, Any], edits: list[tuple[int, int, int]]) -> dict[str, Any]:
    """Apply ``(kind, where, value)`` edits to device 0's trace: 0 drop an entry, 1 duplicate
    one, 2 give an entry another entry's address, 3 change an entry's stream, 4 swap two
    neighbours, 5 shift an address by a few hundred bytes."""
    snap = copy.deepcopy(snap)
    trace = snap["device_traces"][0]
    for kind, where, value in edits:
        if not trace:
            break
        i = where % len(trace)
        e = trace[i]
        if kind == 0:
            del trace[i]
        elif kind == 1:
            trace.insert(i, dict(e))
        elif kind == 2 and "addr" in e:
            other = trace[value % len(trace)]
            if "addr" in other:
                e["addr"] = other["addr"]
        elif kind == 3:
            e["stream"] = value % 3
        elif kind == 4 and i + 1 < len(trace):
            trace[i], trace[i + 1] = trace[i + 1], trace[i]
        elif kind == 5 and "addr" in e:
            e["addr"] = max(0, e["addr"] + 512 * (value % 5 - 2))
    return snap


# ------------------------------------------------------------------ hypothesis strategies


@st.composite
def ops(draw: st.DrawFn) -> list[Op]:
    n = draw(st.integers(1, 90))
    out = []
    for _ in range(n):
        k = draw(st.integers(0, 19))
        if k < 9:
            pool = draw(st.integers(0, 9))
            if pool < 6:  # small pool: up to 1 MiB
                size = draw(st.integers(1, MiB))
            elif pool < 9:  # 1-10 MiB: carved from 20 MiB segments
                size = draw(st.integers(MiB + 1, 10 * MiB))
            else:
                size = draw(st.integers(10 * MiB, 60 * MiB))
            out.append(Op("malloc", size=size, site=draw(st.integers(0, 4))))
        elif k < 16:
            out.append(Op("free", pick=draw(st.integers(0, 1000))))
        elif k < 19:
            out.append(Op("free_side", pick=draw(st.integers(0, 1000))))
        else:
            out.append(Op("empty_cache"))
    return out


@st.composite
def snapshots(draw: st.DrawFn, corrupt: bool) -> dict[str, Any]:
    workload = draw(ops())
    capacity = draw(st.sampled_from([48 * MiB, 96 * MiB, 1 << 30]))
    expandable = draw(st.booleans())
    snap = run_workload(
        workload, expandable=expandable, capacity=capacity, keep=draw(st.integers(0, 400)),
        gc=draw(st.booleans()),
    )  # fmt: skip
    if draw(st.integers(0, 4)) == 0:
        other = run_workload(draw(ops()), expandable=not expandable, capacity=capacity,
                             keep=draw(st.integers(0, 400)), device=1)  # fmt: skip
        snap = merge(snap, other)
    if corrupt:
        edits = draw(
            st.lists(
                st.tuples(st.integers(0, 5), st.integers(0, 10_000), st.integers(0, 100)),
                max_size=6,
            )
        )
        snap = perturb(snap, edits)
    return snap

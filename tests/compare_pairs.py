"""Pairs of runs with a planted change, for compare: the same workload twice, the second with
one site holding ``planted`` more bytes at the memory peak and one new out-of-order free that
leaves a hole (a new hotspot). Everything else is the same, so a compare that attributes
changes to sites must rank the planted site first, by exactly ``planted`` bytes.

Snapshots come from the sample generator's caching allocator (``sample_traces/
make_snapshots.py``); exports from ``nsysfrag.testing.nsys_export``, one NVTX range per
allocation naming its site.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from nsysfrag.testing.nsys_export import FREE, ApiRow, Gpu, MemoryRow, NvtxRow, write_export
from tests.snapshot_workloads import make_snapshots

MiB = 1 << 20
GiB = 1 << 30
# The site that grows, and the one that frees out of order in the second run.
GROWING_FRAME = "proj/model.py:150 forward"
HOTSPOT_FRAME = "proj/attention.py:88 forward"
GROWING_RANGE = "step/forward"
HOTSPOT_RANGE = "step/attention"
HOTSPOT_BYTES = 4 * MiB  # the hole the new hotspot leaves (a multiple of every rounding)
PAGE_HOLE_BYTES = 1536 * 1024  # the same in an export: inside one 2 MiB page


def snapshot_run(path: Path, planted: int, hotspot: bool, line_shift: int = 0) -> Path:
    """A snapshot of a small training step; ``planted`` extra bytes live at the peak from the
    growing site, and with ``hotspot`` a 4 MiB block of the hotspot site freed between two
    live blocks. ``line_shift`` moves every line of model.py (an edit above them)."""
    ms = make_snapshots()
    a = ms.CachingAllocator(8 * GiB, 300 * MiB, expandable=False, va_base=0x7F00_0000_0000)
    stacks = ms.Stacks("/home/user/proj")
    weights = stacks.py(("model.py", 20 + line_shift, "__init__"))
    growing = stacks.py(("model.py", 150 + line_shift, "forward"))
    scratch = stacks.py(("model.py", 160 + line_shift, "forward"))
    attention = stacks.py(("attention.py", 88, "forward"))
    for _ in range(4):
        a.malloc(64 * MiB, weights)  # live to the end
    a.tick(100)
    acts = [a.malloc(20 * MiB, growing) for _ in range(3)]
    acts += [a.malloc(6 * MiB, scratch) for _ in range(2)]
    if planted:
        acts.append(a.malloc(planted, growing))
    a.tick(100)
    for block in reversed(acts):  # in stack order: no holes
        a.free(block)
        a.tick(10)
    if hotspot:
        left = a.malloc(HOTSPOT_BYTES, scratch)
        middle = a.malloc(HOTSPOT_BYTES, attention)
        right = a.malloc(HOTSPOT_BYTES, scratch)
        a.tick(10)
        a.free(middle)  # out of order: ``right`` is newer and stays
        a.free(right)
        a.free(left)
    a.tick(10)
    snap = a.snapshot("")
    snap["device_traces"] = [a.trace]
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return path


def snapshot_pair(folder: Path, planted: int) -> tuple[Path, Path]:
    return (
        snapshot_run(folder / "base.pickle", 0, hotspot=False),
        snapshot_run(folder / "current.pickle", planted, hotspot=True),
    )


BASE_ADDRESS = 0x7F10_0000_0000
S = 1_000_000  # a millisecond apart, in ns


def export_run(path: Path, planted: int, hotspot: bool) -> Path:
    """An nsys export of the same shape: weights, activations of the growing range (``planted``
    more bytes in one more block), all freed in order; with ``hotspot`` three blocks in one
    page, the middle one (the hotspot range, 1.5 MiB) freed first."""
    steps: list[tuple[str, int, int, str]] = []  # (op, address, bytes, site)
    address = BASE_ADDRESS
    live: list[tuple[int, int]] = []

    def alloc(size: int, site: str) -> int:
        nonlocal address
        at = address
        address += -(-size // (2 * MiB)) * (2 * MiB)  # each block on pages of its own
        steps.append(("alloc", at, size, site))
        live.append((at, size))
        return at

    for _ in range(4):
        alloc(64 * MiB, "model_init")
    acts = [alloc(20 * MiB, GROWING_RANGE) for _ in range(3)]
    acts += [alloc(6 * MiB + 4096, "step/scratch") for _ in range(2)]
    if planted:
        acts.append(alloc(planted, GROWING_RANGE))
    for at in reversed(acts):
        steps.append(("free", at, 0, ""))
    if hotspot:
        page = address
        address += 2 * MiB
        quarter = 256 * 1024
        for offset, size, site in (
            (0, quarter, "step/scratch"),
            (quarter, PAGE_HOLE_BYTES, HOTSPOT_RANGE),
            (quarter + PAGE_HOLE_BYTES, quarter, "step/scratch"),
        ):
            steps.append(("alloc", page + offset, size, site))
        for offset in (quarter, quarter + PAGE_HOLE_BYTES, 0):
            steps.append(("free", page + offset, 0, ""))
    memory, api, nvtx = [], [], []
    for i, (op, at, size, site) in enumerate(steps, start=1):
        t = i * S
        if op == "alloc":
            memory.append(MemoryRow(t, 1, 0, at, size, correlation_id=i))
            api.append(ApiRow(t - 100, t + 100, 1, 7, "cudaMalloc_v3020", i))
            nvtx.append(NvtxRow(t - 1000, t + 1000, 1, 7, site))
        else:
            memory.append(MemoryRow(t, 1, 0, at, 0, op=FREE))
    return write_export(path, memory, api, nvtx, [Gpu(0, total_memory=4 * GiB)])


def export_pair(folder: Path, planted: int) -> tuple[Path, Path]:
    return (
        export_run(folder / "base.sqlite", 0, hotspot=False),
        export_run(folder / "current.sqlite", planted, hotspot=True),
    )

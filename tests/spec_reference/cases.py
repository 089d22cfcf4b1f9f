"""Hand-made GIVEN/WHEN/THEN cases for the SPEC 1.2 rules, small enough to check by hand.

Each builder writes its input (an nsys-shaped export through
``nsysfrag.testing.nsys_export``, or a snapshot dict pickled here) and returns a ``Case``: the
input, the ``analyze`` options, and the values SPEC 1.2 implies, worked out by hand in the
builder's docstring. Keys are dotted paths
into one space of the JSON (``peak.global_frag``, ``ooms.0.verdict``, ``health_basis``).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsysfrag.testing.nsys_export import ALLOC, FREE, ApiRow, Gpu, MemoryRow, write_export

KiB, MiB = 1 << 10, 1 << 20
BASE = 0x7F00_0000_0000
PID = 4242


@dataclass
class Case:
    name: str
    doc: str
    path: Path
    capacity: int | None = None
    # (pid, device) -> dotted path -> expected value
    expect: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)

    @property
    def cli_args(self) -> list[str]:
        return ["--capacity", str(self.capacity)] if self.capacity is not None else []


# ------------------------------------------------------------------------------- nsys inputs


@dataclass
class _Trace:
    """Memory rows, each with its API row on a thread; failed calls with no memory row."""

    memory: list[MemoryRow] = field(default_factory=list)
    api: list[ApiRow] = field(default_factory=list)

    def _corr(self) -> int:
        return len(self.api) + 1

    def alloc(self, t: int, addr: int, nbytes: int, device: int = 0, tid: int = 1) -> None:
        corr = self._corr()
        self.api.append(ApiRow(t - 5, t + 5, PID, tid, "cudaMalloc_v3020", corr))
        self.memory.append(MemoryRow(t, PID, device, addr, nbytes, ALLOC, correlation_id=corr))

    def free(self, t: int, addr: int, nbytes: int, device: int = 0, tid: int = 1) -> None:
        corr = self._corr()
        self.api.append(ApiRow(t - 5, t + 5, PID, tid, "cudaFree_v3020", corr))
        self.memory.append(MemoryRow(t, PID, device, addr, nbytes, FREE, correlation_id=corr))

    def failed(self, t: int, name: str, tid: int = 1, event_class: int = 0) -> None:
        self.api.append(ApiRow(t, t + 5, PID, tid, name, self._corr(), 2, event_class))

    def write(self, path: Path, capacity: int, devices: int = 1) -> Path:
        gpus = [Gpu(d, total_memory=capacity) for d in range(devices)]
        return write_export(path, self.memory, self.api, gpus=gpus)


PAGE = 2 * MiB


def stranded_in_pages(tmp: Path) -> Case:
    """GIVEN a 64 MiB device whose 32 pages each hold sixteen 128 KiB blocks (full),
    WHEN 15 of the 16 blocks of every page are freed (all but each page's first), page by page,
    THEN every page stays resident: reserved 64 MiB, allocated 4 MiB, stranded 60 MiB, device
    free 0; the largest free run is a page's tail (1,920 KiB), so global_frag is
    (60 MiB − 1,920 KiB) / 64 MiB = 0.908 (critical) and local_frag 0.969; 32 free blocks (no
    whole free page). The worst fragmentation is the last free; the memory peak the last
    allocation (reserved 64 MiB, allocated 64 MiB: ties go to the larger allocated)."""
    cap, size, per_page = 64 * MiB, 128 * KiB, 16
    tr = _Trace()
    t = 1000
    for page in range(32):
        for i in range(per_page):
            tr.alloc(t, BASE + page * PAGE + i * size, size)
            t += 10
    last_alloc = t - 10
    for page in range(32):
        for i in range(1, per_page):
            tr.free(t, BASE + page * PAGE + i * size, size)
            t += 10
    stranded, largest = 60 * MiB, PAGE - size
    expect = {
        "health": "critical",
        "health_basis": {"metric": "global_frag", "value": (stranded - largest) / cap,
                         "time_ns": t - 10},  # fmt: skip
        "counts.overlaps": 0,
        "peak.time_ns": t - 10,
        "peak.reserved_bytes": cap,
        "peak.allocated_bytes": 32 * size,
        "peak.stranded_bytes": stranded,
        "peak.device_free_bytes": 0,
        "peak.largest_block_bytes": largest,
        "peak.largest_free_bytes": largest,
        "peak.free_bytes": stranded,
        "peak.free_blocks": 32,
        "peak.local_frag": 1 - largest / stranded,
        "memory_peak.time_ns": last_alloc,
        "memory_peak.reserved_bytes": cap,
        "memory_peak.allocated_bytes": cap,
        "final.free_blocks": 32,
        "ooms": [],
    }
    return Case("stranded_in_pages", stranded_in_pages.__doc__ or "",
                tr.write(tmp / "stranded.sqlite", cap), expect={(PID, 0): expect})  # fmt: skip


def _twenty_blocks(tr: _Trace, t: int) -> int:
    for i in range(20):
        tr.alloc(t, BASE + i * 2 * MiB, 2 * MiB)
        t += 10
    return t


def whole_free_pages_strand_nothing(tmp: Path) -> Case:
    """GIVEN a 40 MiB device filled by twenty 2 MiB blocks, one page each,
    WHEN all are freed but the 10th and the 20th (blocks 1–9, then 11–19),
    THEN the freed pages go back to the device: reserved 4 MiB, nothing stranded, device free
    36 MiB, and a request of up to 36 MiB fits (the driver maps free pages wherever they lie),
    so global_frag and local_frag are 0 and health is ok — the virtual holes between the two
    live blocks are no fragmentation. One free block: the device's free pages."""
    tr = _Trace()
    t = _twenty_blocks(tr, 1000)
    last_alloc = t - 10
    for i in [*range(9), *range(10, 19)]:
        tr.free(t, BASE + i * 2 * MiB, 2 * MiB)
        t += 10
    expect = {
        "health": "ok",
        "health_basis": None,
        "max.global_frag": 0.0,
        "max.local_frag": 0.0,
        "final.reserved_bytes": 4 * MiB,
        "final.stranded_bytes": 0,
        "final.device_free_bytes": 36 * MiB,
        "final.largest_free_bytes": 36 * MiB,
        "final.free_blocks": 1,
        "memory_peak.time_ns": last_alloc,
        "ooms": [],
    }
    return Case("whole_free_pages_strand_nothing", whole_free_pages_strand_nothing.__doc__ or "",
                tr.write(tmp / "g.sqlite", 40 * MiB), expect={(PID, 0): expect})  # fmt: skip


def basis_local(tmp: Path) -> Case:
    """GIVEN a 64 MiB device with 28 pages each holding two 1 MiB blocks (56 MiB; 8 MiB device
    free),
    WHEN the second block of 24 pages is freed,
    THEN 24 MiB is stranded: local_frag = 1 − 8 / 32 = 0.75 (critical) while global_frag is
    (32 − 8) / 64 = 0.375 (warn), both at their maximum at the last free: health is critical
    and health_basis names local_frag 0.75 there; 25 free blocks (24 runs, the free pages)."""
    tr = _Trace()
    t = 1000
    for page in range(28):
        for i in range(2):
            tr.alloc(t, BASE + page * PAGE + i * MiB, MiB)
            t += 10
    for page in range(24):
        tr.free(t, BASE + page * PAGE + MiB, MiB)
        t += 10
    expect = {
        "health": "critical",
        "health_basis": {"metric": "local_frag", "value": 0.75, "time_ns": t - 10},
        "max.local_frag": 0.75,
        "max.global_frag": 24 * MiB / (64 * MiB),
        "final.free_blocks": 25,
        "final.stranded_bytes": 24 * MiB,
        "final.largest_block_bytes": MiB,
        "final.largest_free_bytes": 8 * MiB,
        "ooms": [],
    }
    return Case("basis_local", basis_local.__doc__ or "", tr.write(tmp / "l.sqlite", 64 * MiB),
                expect={(PID, 0): expect})  # fmt: skip


def basis_free_blocks(tmp: Path) -> Case:
    """GIVEN a 64 MiB device holding 510 pairs of 512-byte blocks at the start of one page,
    WHEN the first block of every pair is freed,
    THEN the page holds 510 free runs of 512 B and its tail, and the device's 31 free pages are
    one more free block: 512 free blocks (critical) while almost everything is free: local_frag
    and global_frag stay under 3 %, and health is critical by free_blocks 512 at the last free."""
    tr = _Trace()
    t = 1000
    for i in range(510):
        tr.alloc(t, BASE + i * 1024, 512)
        tr.alloc(t + 5, BASE + i * 1024 + 512, 512)
        t += 10
    for i in range(510):
        tr.free(t, BASE + i * 1024, 512)
        t += 10
    stranded = PAGE - 510 * 512
    expect = {
        "health": "critical",
        "health_basis": {"metric": "free_blocks", "value": 512, "time_ns": t - 10},
        "max.free_blocks": 512,
        "final.stranded_bytes": stranded,
        "final.global_frag": stranded / (64 * MiB),
        "ooms": [],
    }
    return Case("basis_free_blocks", basis_free_blocks.__doc__ or "",
                tr.write(tmp / "n.sqlite", 64 * MiB), expect={(PID, 0): expect})  # fmt: skip


def failures_at_their_moment(tmp: Path) -> Case:
    """GIVEN a process with two 64 MiB devices; thread 1 allocates three 8 MiB blocks on
    device 0 (t = 1000, 2000, 3000) and frees the 1st and 3rd (t = 5000, 6000); thread 2
    allocates 4 MiB and then 1 MiB (in a page of its own) on device 1 (t = 3500, 3600);
    WHEN cudaMalloc fails on thread 1 at t = 500 (before any event) and at t = 3000 (the start
    of the third allocation), and cuMemAlloc (a driver call) fails on thread 2 at t = 4000,
    THEN device 0 lists two failures: the first with nothing reserved (64 MiB device free, one
    free block), the second with the state after the third allocation (24 MiB reserved, 40 MiB
    device free); device 1 lists one with 6 MiB reserved, 1 MiB stranded in the second block's
    page, 58 MiB device free and 2 free blocks; none is described with another moment;
    requested_bytes is null and the verdict "unknown" (SPEC 1.2 §3). Device 0 never strands a
    byte: its worst fragmentation (0) is its first event; its memory peak is t = 3000."""
    cap = 64 * MiB
    tr = _Trace()
    tr.failed(500, "cudaMalloc_v3020", tid=1)
    tr.alloc(1000, BASE, 8 * MiB)
    tr.alloc(2000, BASE + 8 * MiB, 8 * MiB)
    tr.alloc(3000, BASE + 16 * MiB, 8 * MiB)
    tr.failed(3000, "cudaMalloc_v3020", tid=1)
    tr.alloc(3500, BASE + (1 << 36), 4 * MiB, device=1, tid=2)
    tr.alloc(3600, BASE + (1 << 36) + 4 * MiB, MiB, device=1, tid=2)
    tr.failed(4000, "cuMemAlloc_v2", tid=2, event_class=1)
    tr.free(5000, BASE, 8 * MiB)
    tr.free(6000, BASE + 16 * MiB, 8 * MiB)
    # A failed cudaFree is no failed allocation.
    tr.api.append(ApiRow(6500, 6510, PID, 1, "cudaFree_v3020", len(tr.api) + 1, 1))

    def oom(t: int, reserved: int, allocated: int, blocks: int, live: int) -> dict[str, Any]:
        device_free = cap - reserved
        stranded = reserved - allocated
        return {"time_ns": t, "requested_bytes": None, "free_bytes": device_free + stranded,
                "largest_free_bytes": device_free, "free_blocks": blocks, "live_bytes": live,
                "reserved_bytes": reserved, "allocated_bytes": allocated,
                "stranded_bytes": stranded, "device_free_bytes": device_free,
                "verdict": "unknown"}  # fmt: skip

    dev0 = {
        "counts.failed_allocations": 2,
        "alloc_failure_rate": 2 / 5,
        "peak.time_ns": 1000,
        "peak.global_frag": 0.0,
        "memory_peak.time_ns": 3000,
        "memory_peak.reserved_bytes": 24 * MiB,
        "ooms": [oom(500, 0, 0, 1, 0), oom(3000, 24 * MiB, 24 * MiB, 1, 24 * MiB)],
    }
    dev1 = {
        "counts.failed_allocations": 1,
        "peak.time_ns": 3600,
        "ooms": [oom(4000, 6 * MiB, 5 * MiB, 2, 5 * MiB)],
    }
    return Case("failures_at_their_moment", failures_at_their_moment.__doc__ or "",
                tr.write(tmp / "f.sqlite", cap, devices=2),
                expect={(PID, 0): dev0, (PID, 1): dev1})  # fmt: skip


def module_symbols_share_a_page(tmp: Path) -> Case:
    """GIVEN device-static module data as a genuine export has it — 112 B at A, then 16 B at
    A + 0x100 and 16 B at A + 0x110, each footprint (512 B) reaching over the next block —
    and then a 16 B allocation at A + 0x108,
    WHEN replayed,
    THEN the first three are no overlap (their bytes do not meet; footprints may), allocated
    is their footprints' union, 0x310 = 784 B, in one resident page (2 MiB − 784 B stranded);
    the fourth, [A + 0x108, A + 0x118), overlaps the two 16 B blocks in bytes: one overlap,
    which removes both (allocated then [A, A + 0x308), 128 B live)."""
    tr = _Trace()
    for t, offset, size in ((1000, 0, 112), (2000, 0x100, 16), (3000, 0x110, 16)):
        corr = tr._corr()
        tr.api.append(ApiRow(t - 5, t + 5, PID, 1, "cuModuleLoadData", corr))
        tr.memory.append(MemoryRow(t, PID, 0, BASE + offset, size, ALLOC, kind=5,
                                   correlation_id=corr))  # fmt: skip
    tr.alloc(4000, BASE + 0x108, 16)
    expect = {
        "counts.overlaps": 1,
        "counts.allocations": 4,
        "memory_peak.time_ns": 3000,
        "memory_peak.allocated_bytes": 0x310,
        "memory_peak.reserved_bytes": PAGE,
        "memory_peak.stranded_bytes": PAGE - 0x310,
        "memory_peak.free_blocks": 2,
        "final.allocated_bytes": 0x308,
        "final.live_bytes": 112 + 16,
        "health": "ok",
    }
    return Case("module_symbols_share_a_page", module_symbols_share_a_page.__doc__ or "",
                tr.write(tmp / "module.sqlite", 64 * MiB), expect={(PID, 0): expect})  # fmt: skip


def export_without_times(tmp: Path) -> Case:
    """GIVEN an export whose memory rows all have start = 0 (as nsys 2022.1 wrote them): a
    4 MiB allocation, a 1 MiB one in the next page, then the 4 MiB freed,
    WHEN replayed,
    THEN the rows keep their order and every moment is an event number: the worst
    fragmentation (1 MiB stranded beside the 1 MiB block, from event 1 on) is event 1, the
    memory peak event 1, the final state event 2."""
    tr = _Trace()
    tr.alloc(0, BASE, 4 * MiB)
    tr.alloc(0, BASE + 4 * MiB, MiB)
    tr.free(0, BASE, 4 * MiB)
    expect = {
        "peak.time_ns": 1,
        "memory_peak.time_ns": 1,
        "memory_peak.reserved_bytes": 6 * MiB,
        "final.time_ns": 2,
        "final.stranded_bytes": MiB,
    }
    return Case("export_without_times", export_without_times.__doc__ or "",
                tr.write(tmp / "timeless.sqlite", 64 * MiB), expect={(PID, 0): expect})  # fmt: skip


def reserved_beyond_capacity(tmp: Path) -> Case:
    """GIVEN 16 pages each holding one 512 KiB block (32 MiB reserved, 24 MiB stranded),
    WHEN analyzed with --capacity 8MiB (less than the process holds),
    THEN device free is 0 and global_frag, (24 − 1.5) / 8 MiB, is clamped to 1; local_frag is
    1 − 1.5 / 24."""
    tr = _Trace()
    for page in range(16):
        tr.alloc(1000 + page, BASE + page * PAGE, 512 * KiB)
    expect = {
        "final.device_free_bytes": 0,
        "final.global_frag": 1.0,
        "final.local_frag": 1 - 1.5 / 24,
        "max.global_frag": 1.0,
        "health": "critical",
    }
    return Case("reserved_beyond_capacity", reserved_beyond_capacity.__doc__ or "",
                tr.write(tmp / "over.sqlite", 64 * MiB), capacity=8 * MiB,
                expect={(PID, 0): expect})  # fmt: skip


def memory_pool(tmp: Path) -> Case:
    """GIVEN a 64 MiB device and a memory pool at P holding 32 MiB with a 16 MiB release
    threshold; cudaMallocAsync takes 4 MiB (utilized 4 MiB) and 4 MiB more (8 MiB), then
    cudaMalloc 2 MiB outside the pool (a page of its own), then the first pool block is freed
    (utilized 4 MiB),
    WHEN replayed,
    THEN the pool counts its 32 MiB in reserved, not its blocks' pages; a trim would keep
    max(utilized, threshold) = 16 MiB, so releasable is 16 MiB throughout; stranded is
    32 − 4 − 16 = 12 MiB at first (global_frag 12 / 64 = 0.1875, its maximum, first reached
    there), 8 MiB after the second block, and 12 MiB again at the end (reserved 34 MiB,
    allocated 6 MiB). The memory peak is the cudaMalloc (reserved 34 MiB, allocated 10 MiB)."""
    pool = 0x7F80_0000_0000
    tr = _Trace()

    def pooled(t: int, offset: int, op: int, used: int) -> None:
        corr = tr._corr()
        name = "cudaMallocAsync_v11020" if op == ALLOC else "cudaFreeAsync_v11020"
        tr.api.append(ApiRow(t - 5, t + 5, PID, 1, name, corr))
        tr.memory.append(MemoryRow(t, PID, 0, pool + offset, 4 * MiB, op, correlation_id=corr,
                                   pool=(pool, 32 * MiB, used, 16 * MiB)))  # fmt: skip

    pooled(1000, 0, ALLOC, 4 * MiB)
    pooled(2000, 4 * MiB, ALLOC, 8 * MiB)
    tr.alloc(3000, BASE, 2 * MiB)
    pooled(4000, 0, FREE, 4 * MiB)
    expect = {
        "peak.time_ns": 1000,
        "peak.global_frag": 12 / 64,
        "peak.releasable_bytes": 16 * MiB,
        "peak.stranded_bytes": 12 * MiB,
        "peak.largest_free_bytes": 32 * MiB + 16 * MiB,
        "memory_peak.time_ns": 3000,
        "memory_peak.reserved_bytes": 34 * MiB,
        "memory_peak.allocated_bytes": 10 * MiB,
        "final.reserved_bytes": 34 * MiB,
        "final.allocated_bytes": 6 * MiB,
        "final.stranded_bytes": 12 * MiB,
        "final.releasable_bytes": 16 * MiB,
        "final.device_free_bytes": 30 * MiB,
    }
    return Case("memory_pool", memory_pool.__doc__ or "", tr.write(tmp / "pool.sqlite", 64 * MiB),
                expect={(PID, 0): expect})  # fmt: skip


# ------------------------------------------------------------------------------- snapshots

SEG = 0x7F10_0000_0000


class _Snapshot:
    """A PyTorch 2.6-shaped snapshot: final segments written by hand, traces entry by entry."""

    def __init__(self, expandable: bool = False, setting: bool | None = None) -> None:
        self.segments: list[dict[str, Any]] = []
        self.traces: dict[int, list[dict[str, Any]]] = {}
        self.expandable = expandable  # the segments' is_expandable
        # allocator_settings' expandable_segments (toggled at run time when it differs)
        self.setting = expandable if setting is None else setting
        self.clock_us = 1_757_000_000_000_000

    def segment(self, device: int, address: int, pool: str, blocks: list[tuple[str, int, int]],
                expandable: bool | None = None) -> None:
        """blocks: (state, size, requested) in address order."""
        out, addr = [], address
        for state, size, requested in blocks:
            out.append({"address": addr, "size": size, "requested_size": requested,
                        "state": state, "frames": []})  # fmt: skip
            addr += size
        self.segments.append({
            "device": device, "address": address, "total_size": addr - address,
            "allocated_size": sum(b["size"] for b in out if b["state"] != "inactive"),
            "active_size": sum(b["size"] for b in out if b["state"] != "inactive"),
            "requested_size": sum(b["requested_size"] for b in out if b["state"] != "inactive"),
            "stream": 0, "segment_type": pool, "segment_pool_id": (0, 0),
            "is_expandable": self.expandable if expandable is None else expandable,
            "frames": [], "blocks": out,
        })  # fmt: skip

    def entry(self, device: int, action: str, addr: int, size: int) -> int:
        """Appends one trace entry 10 µs after the previous one; returns its time in ns
        since the first entry."""
        self.clock_us += 10
        e: dict[str, Any] = {"action": action, "size": size, "stream": 0,
                             "time_us": self.clock_us, "frames": [], "compile_context": "N/A"}
        if action == "oom":
            e["device_free"] = addr
        else:
            e["addr"] = addr
        self.traces.setdefault(device, []).append(e)
        return (self.clock_us - 1_757_000_000_000_010) * 1000

    def free(self, device: int, addr: int, size: int) -> int:
        self.entry(device, "free_requested", addr, size)
        return self.entry(device, "free_completed", addr, size)

    def write(self, path: Path) -> Path:
        n = max([*self.traces, *(s["device"] for s in self.segments)]) + 1
        conf = "expandable_segments:True" if self.setting else ""
        data = {
            "segments": sorted(self.segments, key=lambda s: s["address"]),
            "device_traces": [self.traces.get(d, []) for d in range(n)],
            "allocator_settings": {
                "PYTORCH_CUDA_ALLOC_CONF": conf, "max_split_size": -1,
                "garbage_collection_threshold": 0.0, "expandable_segments": self.setting,
                "roundup_power2_divisions": {str(1 << k): 0 for k in range(16)},
            },
            "external_annotations": [],
        }  # fmt: skip
        path.write_bytes(pickle.dumps(data, protocol=4))
        return path


def oom_verdicts(tmp: Path) -> Case:
    """GIVEN two devices, each with two 20 MiB segments; in each segment an 8 MiB block at
    the start and one after it, then the first block of each segment freed: 24 MiB free in
    segments (8 + 4 MiB per segment), all of it stranded beside a live block, none releasable;
    WHEN the allocator records an oom with 2 MiB of device memory free, for 10 MiB on device 0
    and for 30 MiB on device 1,
    THEN each capacity is reserved + device_free = 42 MiB; device 0's failure is
    "fragmentation" (10 MiB <= 2 + 24 + 0: the memory existed, the largest free range held
    8 MiB), device 1's is "capacity" (30 MiB > 26 MiB); each ooms entry carries the state at
    the oom: 26 MiB free (D + F), largest usable 8 MiB, 5 free blocks, 40 MiB reserved, 16 MiB
    allocated, 24 MiB stranded; health is critical by global_frag 18/42 at the second free
    (local_frag 0.69 is critical at the same moment; global_frag comes first in SPEC's table)."""
    snap = _Snapshot()
    expect: dict[tuple[int, int], dict[str, Any]] = {}
    for device, request in ((0, 10 * MiB), (1, 30 * MiB)):
        s1 = SEG + device * (1 << 32)
        s2 = s1 + 20 * MiB
        snap.entry(device, "segment_alloc", s1, 20 * MiB)
        snap.entry(device, "alloc", s1, 8 * MiB)
        snap.entry(device, "alloc", s1 + 8 * MiB, 8 * MiB)
        snap.entry(device, "segment_alloc", s2, 20 * MiB)
        snap.entry(device, "alloc", s2, 8 * MiB)
        snap.entry(device, "alloc", s2 + 8 * MiB, 8 * MiB)
        snap.free(device, s1, 8 * MiB)
        second_free = snap.free(device, s2, 8 * MiB)
        t_oom = snap.entry(device, "oom", 2 * MiB, request)
        for s in (s1, s2):
            snap.segment(device, s, "large", [("inactive", 8 * MiB, 0),
                         ("active_allocated", 8 * MiB, 8 * MiB), ("inactive", 4 * MiB, 0)])  # fmt: skip
        g = 18 * MiB / (42 * MiB)
        expect[(0, device)] = {
            "capacity_bytes": 42 * MiB,
            "counts.failed_allocations": 1,
            "health": "critical",
            "health_basis": {"metric": "global_frag", "value": g, "time_ns": second_free},
            "peak.time_ns": second_free,
            "ooms": [{
                "time_ns": t_oom, "requested_bytes": request,
                "verdict": "fragmentation" if device == 0 else "capacity",
                "free_bytes": 26 * MiB, "largest_free_bytes": 8 * MiB, "free_blocks": 5,
                "live_bytes": 16 * MiB, "reserved_bytes": 40 * MiB, "allocated_bytes": 16 * MiB,
                "releasable_bytes": 0, "stranded_bytes": 24 * MiB, "device_free_bytes": 2 * MiB,
                "largest_block_bytes": 8 * MiB,
            }],
        }  # fmt: skip
    return Case("oom_verdicts", oom_verdicts.__doc__ or "", snap.write(tmp / "oom.pickle"),
                expect=expect)  # fmt: skip


def cached_memory(tmp: Path) -> Case:
    """GIVEN a 100 MiB device (--capacity) and three 20 MiB segments: two hold one 19 MiB
    tensor each (a 1 MiB remainder is not split off in the large pool, so each block is the
    whole segment), the third an 8 MiB tensor;
    WHEN both 19 MiB tensors are freed,
    THEN their segments are releasable (40 MiB), only the 12 MiB beside the 8 MiB tensor is
    stranded, and the largest usable request is D + R = 40 + 40 = 80 MiB: global_frag stays
    at 12/100 (ok) where the free-block view alone would say (52 - 20)/100 = 0.32 (warn);
    the peak is the first moment at 0.12 (the 8 MiB allocation)."""
    snap = _Snapshot()
    s1, s2, s3 = SEG, SEG + 20 * MiB, SEG + 40 * MiB
    snap.entry(0, "segment_alloc", s1, 20 * MiB)
    snap.entry(0, "alloc", s1, 19 * MiB)
    snap.entry(0, "segment_alloc", s2, 20 * MiB)
    snap.entry(0, "alloc", s2, 19 * MiB)
    snap.entry(0, "segment_alloc", s3, 20 * MiB)
    t_third = snap.entry(0, "alloc", s3, 8 * MiB)
    snap.free(0, s1, 19 * MiB)
    snap.free(0, s2, 19 * MiB)
    snap.segment(0, s1, "large", [("inactive", 20 * MiB, 0)])
    snap.segment(0, s2, "large", [("inactive", 20 * MiB, 0)])
    snap.segment(0, s3, "large", [("active_allocated", 8 * MiB, 8 * MiB), ("inactive", 12 * MiB, 0)])
    expect = {
        "capacity_bytes": 100 * MiB,
        "health": "ok",
        "health_basis": None,
        "peak.time_ns": t_third,
        "peak.global_frag": 12 * MiB / (100 * MiB),
        "max.local_frag": 1 - 40 / 52,
        "final.releasable_bytes": 40 * MiB,
        "final.stranded_bytes": 12 * MiB,
        "final.device_free_bytes": 40 * MiB,
        "final.largest_block_bytes": 20 * MiB,
        "final.largest_free_bytes": 80 * MiB,
        "final.free_bytes": 92 * MiB,
        "final.free_blocks": 4,
        "final.reserved_bytes": 60 * MiB,
        "final.allocated_bytes": 8 * MiB,
        "ooms": [],
    }
    return Case("cached_memory", cached_memory.__doc__ or "", snap.write(tmp / "cached.pickle"),
                capacity=100 * MiB, expect={(0, 0): expect})  # fmt: skip


def expandable_pages(tmp: Path) -> Case:
    """GIVEN expandable segments on a 100 MiB device (--capacity): a 50 MiB tensor maps three
    20 MiB pages (60 MiB), a 4 MiB tensor follows it in the same range;
    WHEN the 50 MiB tensor is freed,
    THEN the free block [0, 50 MiB) holds two whole pages: 40 MiB releasable, 16 MiB stranded
    (10 MiB of the third page and the 6 MiB tail); largest usable = max(50, 40 + 40) = 80 MiB;
    global_frag = (40 + 56 - 80) / 100 = 0.16, ok. (Counted as a native segment with a live
    block, nothing would be releasable and global_frag would be 0.46, critical.)"""
    snap = _Snapshot(expandable=True)
    v = SEG
    snap.entry(0, "segment_map", v, 60 * MiB)
    snap.entry(0, "alloc", v, 50 * MiB)
    snap.entry(0, "alloc", v + 50 * MiB, 4 * MiB)
    t_free = snap.free(0, v, 50 * MiB)
    snap.segment(0, v, "large", [("inactive", 50 * MiB, 0),
                 ("active_allocated", 4 * MiB, 4 * MiB), ("inactive", 6 * MiB, 0)])  # fmt: skip
    expect = {
        "health": "ok",
        "peak.time_ns": t_free,
        "peak.global_frag": 16 * MiB / (100 * MiB),
        "peak.releasable_bytes": 40 * MiB,
        "peak.stranded_bytes": 16 * MiB,
        "peak.largest_block_bytes": 50 * MiB,
        "peak.largest_free_bytes": 80 * MiB,
        "peak.free_blocks": 3,
        "max.local_frag": 0.2,
        "ooms": [],
    }
    return Case("expandable_pages", expandable_pages.__doc__ or "",
                snap.write(tmp / "expandable.pickle"), capacity=100 * MiB,
                expect={(0, 0): expect})  # fmt: skip


def snapshot_nearly_full(tmp: Path) -> Case:
    """GIVEN a state-only snapshot (no trace) of ten 2 MiB small-pool segments, each cut into
    64 live 31.5 KiB blocks with a 512-byte hole after each, on a device with 64 KiB more than
    reserved (--capacity);
    WHEN it is analyzed,
    THEN 641 free blocks (640 holes and the device's free memory) and local_frag 0.83 are
    reported in max, but D + F = 384 KiB is under 5 % of the device, so health is ok."""
    snap = _Snapshot()
    live, hole = 63 * 512, 512
    for i in range(10):
        snap.segment(0, SEG + i * 2 * MiB, "small",
                     [b for _ in range(64) for b in (("active_allocated", live, live), ("inactive", hole, 0))])  # fmt: skip
    cap = 20 * MiB + 64 * KiB
    free = 64 * KiB + 640 * hole
    expect = {
        "health": "ok",
        "health_basis": None,
        "max.free_blocks": 641,
        "max.local_frag": 1 - 64 * KiB / free,
        "final.free_bytes": free,
        "final.stranded_bytes": 640 * hole,
        "final.releasable_bytes": 0,
        "ooms": [],
    }
    return Case("snapshot_nearly_full", snapshot_nearly_full.__doc__ or "",
                snap.write(tmp / "full.pickle"), capacity=cap, expect={(0, 0): expect})  # fmt: skip


def initial_block_not_split(tmp: Path) -> Case:
    """GIVEN a 20 MiB segment whose only block was allocated before the trace window for
    20 MiB − 600 KiB (so PyTorch, leaving less than 1 MiB, did not split: the block is the
    whole segment), on a 40 MiB device (--capacity);
    WHEN the window holds only its free,
    THEN at the window's start 20 MiB are allocated and nothing is free inside the segment
    (1 free block: the device's), not a 600 KiB sliver (QUESTIONS.md Q10)."""
    snap = _Snapshot()
    req = 20 * MiB - 600 * KiB
    snap.free(0, SEG, req)
    snap.segment(0, SEG, "large", [("inactive", 20 * MiB, 0)])
    expect = {
        "peak.time_ns": 0,
        "peak.allocated_bytes": 20 * MiB,
        "peak.stranded_bytes": 0,
        "peak.free_blocks": 1,
        "peak.global_frag": 0.0,
        "max.global_frag": 0.0,
        "final.releasable_bytes": 20 * MiB,
    }
    return Case("initial_block_not_split", initial_block_not_split.__doc__ or "",
                snap.write(tmp / "initial.pickle"), capacity=40 * MiB, expect={(0, 0): expect})  # fmt: skip


def window_opens_on_cached_segments(tmp: Path) -> Case:
    """GIVEN a 100 MiB device (--capacity) whose trace window opens on two empty cached 20 MiB
    segments and no live block,
    WHEN both are released (empty_cache) and a 20 MiB tensor fills a new segment,
    THEN the window's start is a moment of its own (QUESTIONS.md Q8): 3 free blocks (the two
    segments and the device's free memory), 40 MiB reserved and releasable. Nothing is ever
    fragmented (global_frag 0), so that first moment is also the peak."""
    snap = _Snapshot()
    s1, s2, s3 = SEG, SEG + 20 * MiB, SEG + 40 * MiB
    snap.entry(0, "segment_free", s1, 20 * MiB)
    snap.entry(0, "segment_free", s2, 20 * MiB)
    snap.entry(0, "segment_alloc", s3, 20 * MiB)
    snap.entry(0, "alloc", s3, 20 * MiB)
    snap.segment(0, s3, "large", [("active_allocated", 20 * MiB, 20 * MiB)])
    expect = {
        "peak.time_ns": 0,
        "peak.free_blocks": 3,
        "peak.reserved_bytes": 40 * MiB,
        "peak.releasable_bytes": 40 * MiB,
        "peak.device_free_bytes": 60 * MiB,
        "max.free_blocks": 3,
        "max.global_frag": 0.0,
        "final.free_blocks": 1,
        "health": "ok",
    }
    return Case("window_opens_on_cached_segments", window_opens_on_cached_segments.__doc__ or "",
                snap.write(tmp / "cached_start.pickle"), capacity=100 * MiB,
                expect={(0, 0): expect})  # fmt: skip


def window_opens_on_an_empty_device(tmp: Path) -> Case:
    """GIVEN a 100 MiB device (--capacity) and a trace from an empty device: a 20 MiB segment,
    a 20 MiB tensor that fills it, its free;
    WHEN it is analyzed,
    THEN the empty device before the first entry is a moment (QUESTIONS.md Q8): nothing is ever
    fragmented, so the peak is that first moment, at the time of the first entry, with nothing
    reserved and one free block (the device's)."""
    snap = _Snapshot()
    snap.entry(0, "segment_alloc", SEG, 20 * MiB)
    snap.entry(0, "alloc", SEG, 20 * MiB)
    snap.free(0, SEG, 20 * MiB)
    snap.segment(0, SEG, "large", [("inactive", 20 * MiB, 0)])
    expect = {
        "peak.time_ns": 0,
        "peak.reserved_bytes": 0,
        "peak.free_blocks": 1,
        "peak.free_bytes": 100 * MiB,
        "max.free_blocks": 2,
        "final.releasable_bytes": 20 * MiB,
        "health": "ok",
    }
    return Case("window_opens_on_an_empty_device", window_opens_on_an_empty_device.__doc__ or "",
                snap.write(tmp / "empty_start.pickle"), capacity=100 * MiB,
                expect={(0, 0): expect})  # fmt: skip


def native_device_beside_expandable_one(tmp: Path) -> Case:
    """GIVEN a snapshot recorded with expandable segments off (allocator_settings), whose
    device 1 holds a 20 MiB expandable range (the setting was on for a while) and whose device 0
    a native 20 MiB large-pool segment;
    WHEN device 0 allocates 19.5 MiB there and frees it inside the window,
    THEN the block took the whole segment (large pool, setting off: PyTorch splits only when
    more than 1 MiB remains, ALLOCATORS.md §1.5): nothing is ever stranded, global and local
    fragmentation stay 0, where the 512-byte rule of expandable segments would strand a 512 KiB
    sliver beside the block: device 1's segments do not decide how device 0 splits (found by
    test_spec_differential)."""
    snap = _Snapshot(setting=False)
    snap.entry(0, "segment_alloc", SEG, 20 * MiB)
    snap.entry(0, "alloc", SEG, 20 * MiB - 512 * KiB)
    snap.free(0, SEG, 20 * MiB - 512 * KiB)
    snap.segment(0, SEG, "large", [("inactive", 20 * MiB, 0)])
    other = SEG + (1 << 32)
    snap.entry(1, "segment_map", other, 20 * MiB)
    snap.entry(1, "alloc", other, 4 * MiB)
    snap.segment(1, other, "large", [("active_allocated", 4 * MiB, 4 * MiB), ("inactive", 16 * MiB, 0)],
                 expandable=True)  # fmt: skip
    expect = {
        "max.global_frag": 0.0,
        "max.local_frag": 0.0,
        "max.live_bytes": 20 * MiB - 512 * KiB,
        "final.releasable_bytes": 20 * MiB,
    }
    return Case("native_device_beside_expandable_one", native_device_beside_expandable_one.__doc__ or "",
                snap.write(tmp / "mixed.pickle"), capacity=100 * MiB, expect={(0, 0): expect})  # fmt: skip


def live_block_keeps_its_recorded_size(tmp: Path) -> Case:
    """GIVEN a snapshot recorded with expandable segments on (allocator_settings) whose only
    segment is a native 20 MiB large-pool one (made while the setting was off), and a trace that
    allocates 19.5 MiB there, still live at the snapshot, recorded as the whole 20 MiB block;
    WHEN it is analyzed (100 MiB device),
    THEN the block has its recorded size from its allocation on (README: "a block still live at
    the snapshot has its recorded size"): 20 MiB allocated, nothing free in the segment, the
    replay ends on the snapshot's own layout (no final mismatch); the split rule of the current
    setting would have left a 512 KiB sliver that the snapshot does not have (found by
    test_spec_differential)."""
    snap = _Snapshot(setting=True)
    snap.entry(0, "segment_alloc", SEG, 20 * MiB)
    snap.entry(0, "alloc", SEG, 20 * MiB - 512 * KiB)
    snap.segment(0, SEG, "large", [("active_allocated", 20 * MiB, 20 * MiB - 512 * KiB)],
                 expandable=False)  # fmt: skip
    expect = {
        "final.allocated_bytes": 20 * MiB,
        "final.stranded_bytes": 0,
        "final.free_blocks": 1,
        "window.final_mismatches": 0,
    }
    return Case("live_block_keeps_its_recorded_size", live_block_keeps_its_recorded_size.__doc__ or "",
                snap.write(tmp / "recorded.pickle"), capacity=100 * MiB, expect={(0, 0): expect})  # fmt: skip


def time_never_runs_backwards(tmp: Path) -> Case:
    """GIVEN a 20 MiB segment holding two 8 MiB blocks on a 40 MiB device (--capacity), and a
    trace whose last entry, the first block's free_completed, is stamped before the entries it
    follows (an edited trace: PyTorch stamps a device's entries in order);
    WHEN it is analyzed,
    THEN that entry takes the time of the one before it (QUESTIONS.md Q21): the final state
    (8 MiB stranded beside the live block, 4 MiB at the tail, the device's 20 MiB: 3 free
    blocks) is at the free_requested's time, not at the earlier stamp."""
    snap = _Snapshot()
    snap.entry(0, "segment_alloc", SEG, 20 * MiB)
    snap.entry(0, "alloc", SEG, 8 * MiB)
    snap.entry(0, "alloc", SEG + 8 * MiB, 8 * MiB)
    t_request = snap.entry(0, "free_requested", SEG, 8 * MiB)
    snap.entry(0, "free_completed", SEG, 8 * MiB)
    snap.traces[0][-1]["time_us"] = snap.traces[0][1]["time_us"]  # stamped back in time
    snap.segment(0, SEG, "large", [("inactive", 8 * MiB, 0), ("active_allocated", 8 * MiB, 8 * MiB),
                                   ("inactive", 4 * MiB, 0)])  # fmt: skip
    expect = {"final.time_ns": t_request, "final.free_blocks": 3, "final.stranded_bytes": 12 * MiB}
    return Case("time_never_runs_backwards", time_never_runs_backwards.__doc__ or "",
                snap.write(tmp / "backwards.pickle"), capacity=40 * MiB, expect={(0, 0): expect})  # fmt: skip


def unfollowed_segment_map_is_a_moment(tmp: Path) -> Case:
    """GIVEN expandable segments on a 100 MiB device (--capacity) and a trace that ends on a
    segment_map of 20 MiB that no allocation follows (an edited trace: PyTorch maps for the
    malloc it records next), the snapshot holding that empty range;
    WHEN it is analyzed,
    THEN the segment_map belongs to no allocation, so it is a moment of its own (QUESTIONS.md
    Q9): the final state has the 20 MiB reserved and releasable, as the snapshot records, and
    two free blocks (the range and the device's 80 MiB)."""
    snap = _Snapshot(expandable=True)
    snap.entry(0, "segment_map", SEG, 20 * MiB)
    snap.segment(0, SEG, "large", [("inactive", 20 * MiB, 0)])
    expect = {"final.reserved_bytes": 20 * MiB, "final.releasable_bytes": 20 * MiB,
              "final.free_blocks": 2, "max.free_blocks": 2}  # fmt: skip
    return Case("unfollowed_segment_map_is_a_moment", unfollowed_segment_map_is_a_moment.__doc__ or "",
                snap.write(tmp / "unfollowed.pickle"), capacity=100 * MiB, expect={(0, 0): expect})  # fmt: skip


BUILDERS: list[Callable[[Path], Case]] = [
    stranded_in_pages, whole_free_pages_strand_nothing, basis_local, basis_free_blocks,
    failures_at_their_moment, module_symbols_share_a_page, export_without_times,
    reserved_beyond_capacity, memory_pool, oom_verdicts, cached_memory, expandable_pages,
    snapshot_nearly_full, initial_block_not_split, window_opens_on_cached_segments,
    window_opens_on_an_empty_device, native_device_beside_expandable_one,
    live_block_keeps_its_recorded_size, time_never_runs_backwards,
    unfollowed_segment_map_is_a_moment,
]  # fmt: skip


def lookup(space: dict[str, Any], dotted: str) -> Any:
    node: Any = space
    for part in dotted.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node

"""nsysfrag against the independent SPEC reference (tests/spec_reference) on random inputs.

test_spec_conformance.py holds nsysfrag to the reference on inputs someone picked; here
hypothesis makes them, so the bugs nobody thought of get a chance to show:

- nsys exports (SPEC §1–§7): several processes and devices, a device map
  (TARGET_INFO_CUDA_DEVICE) or none, allocations freed in and out of order, frees of addresses
  nobody allocated, re-allocations over live blocks (a missed free), zero-size allocations,
  failed allocation calls (runtime and driver, charged through the calling thread), calls that
  are no allocation, events of other memory kinds, tiny and huge sizes, addresses from 2^63 up
  (stored negative), equal timestamps and rows written out of time order, session and UNIX
  times, exports without times (every memory row at start 0), memory pools' rows, module data
  packed 256 B apart, exports without enum tables (schema 2.x) or with the memory kinds
  numbered otherwise (resolved by name), with and without ``--capacity``;
- PyTorch snapshots (SPEC §8–§9) from the sample generator's caching allocator
  (tests/snapshot_workloads.py): every pool's sizes, frees on a side stream, ``empty_cache()``,
  garbage collection, expandable segments, OOMs on a small device, the ring buffer's cut, two
  devices in one snapshot, traces edited the way a corrupt one would be, the formats of older
  PyTorch versions (no ``allocator_settings``, no times); with and without ``--capacity``.

Both sides are compared with tests/spec_compare.py, the comparison test_spec_conformance.py
uses. A failure lists every differing field and the path where the input was saved, so
``nsysfrag analyze PATH --json -`` (and ``tests.spec_reference.reference(PATH)``) reproduce it.

CI runs a few examples of each kind; ``NSYSFRAG_DIFFERENTIAL_EXAMPLES=500`` runs a deep local
check (each kind gets that many).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsysfrag.testing.nsys_export import (
    ALLOC,
    DEVICE,
    FREE,
    MEM_KINDS,
    ApiRow,
    ExportOptions,
    Gpu,
    MemoryRow,
    write_export,
)
from tests.snapshot_workloads import snapshots
from tests.spec_compare import differences, nsysfrag_json, run_nsysfrag
from tests.spec_reference import is_snapshot, reference
from tests.kernel_modes import both_kernels  # noqa: F401  (every test both ways)

EXAMPLES = int(os.environ.get("NSYSFRAG_DIFFERENTIAL_EXAMPLES", "0"))
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
KEPT = Path(tempfile.gettempdir()) / "nsysfrag-differential"  # inputs of failed examples
CI_EXAMPLES = {"nsys": 150, "snapshot": 100, "corrupt_snapshot": 80}


def _settings(kind: str) -> Callable[[Any], Any]:
    return settings(
        max_examples=EXAMPLES or CI_EXAMPLES[kind],
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def check(path: Path, capacity: int | None, consistent_only: bool = False) -> None:
    """nsysfrag and the reference agree on ``path``; if not, the input is kept where the
    message says and every differing field is listed."""
    try:
        diffs = _differences(path, capacity, consistent_only)
    except Exception as error:  # noqa: BLE001 -- a crash on either side is a divergence too
        diffs = [f"{type(error).__name__}: {error}"]
    if diffs:
        # Named by content: hypothesis replays the shrunk example last, so the message of the
        # failure it reports names that example's file.
        KEPT.mkdir(exist_ok=True)
        kept = KEPT / f"{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}{path.suffix}"
        shutil.copy(path, kept)
        option = f" --capacity {capacity}" if capacity is not None else ""
        raise AssertionError(
            f"{len(diffs)} field(s) differ between nsysfrag and the SPEC reference;"
            f" input kept at {kept} (nsysfrag analyze {kept}{option} --json -)\n"
            + "\n".join(diffs[:60])
        )


def _differences(path: Path, capacity: int | None, consistent_only: bool = False) -> list[str]:
    """The fields in which nsysfrag and the reference differ on ``path``. With
    ``consistent_only``, none for a snapshot that contradicts itself (see below)."""
    if consistent_only and _self_contradictory(path, capacity):
        return []
    ref = reference(path, capacity)
    if not ref["spaces"]:  # nothing to analyze: nsysfrag may refuse the input, not crash
        result = run_nsysfrag(path, capacity)
        if result.exit_code == 2 and "nothing to analyze" in result.output:
            return []
    got = nsysfrag_json(path, capacity)
    return differences(ref, got, is_snapshot(path))


def _self_contradictory(path: Path, capacity: int | None) -> bool:
    """OPEN PROBLEM (not compared): a snapshot whose trace does not fit its own final segments
    (an edited, truncated or concatenated one: nsysfrag counts ``window.conflicts`` or
    ``window.final_mismatches`` and warns that the layout is approximate). SPEC says nothing of
    how to repair such a trace, and nsysfrag and the reference repair it differently (which
    entries they drop, where a block outside every segment goes, whether a trailing
    ``segment_alloc`` is a moment), so their figures differ on about a third of the perturbed
    snapshots; the reference also crashes (KeyError) on some. Consistent perturbed snapshots
    (an entry's stream changed, a harmless duplicate) are still compared."""
    result = run_nsysfrag(path, capacity)
    if result.exit_code != 0:
        return False  # let the comparison report it
    spaces = json.loads(result.stdout)["spaces"]
    return any(s["window"]["conflicts"] or s["window"]["final_mismatches"] for s in spaces)


# ------------------------------------------------------------------------------- nsys exports

ALLOC_NAMES = ("cudaMalloc_v3020", "cudaMallocAsync_v11020", "cuMemAlloc_v2", "cudaMallocPitch",
               "cuMemAllocAsync", "cudaMallocManaged_v6000", "cuMemAllocFromPoolAsync")  # fmt: skip
OTHER_NAMES = ("cudaFree_v3020", "cudaMemcpy_v3020", "cudaMallocHost_v3020", "cuMemCreate")
OTHER_KINDS = (0, 1, 4, 6, 7)  # pageable, pinned, managed, managed static, unknown
DEVICE_KINDS = (DEVICE, DEVICE, DEVICE, DEVICE, 3, 5)  # mostly Device; Array, Device Static
# Where a space's addresses live: the usual 0x7f.. range, a low one, and one from 2^63 up,
# which SQLite stores as negative integers.
REGIONS = (0x7F00_0000_0000, 0x2_0000_0000, 0xFFFF_8000_0000_0000)


def sizes() -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(1, 2 * KiB),  # tiny: rounding to 512 B matters
        st.integers(2 * KiB, 16 * MiB),
        st.sampled_from([512, 1024, 2 * MiB, 20 * MiB]),
        st.integers(64 * MiB, 8 * GiB),  # huge: span mode on small devices
    )


@dataclass
class _Space:
    region: int
    cursor: int = 0
    live: list[tuple[int, int]] = field(default_factory=list)  # (address, bytes), oldest first
    freed: list[int] = field(default_factory=list)


@dataclass
class NsysExample:
    memory: list[MemoryRow]
    api: list[ApiRow]
    gpus: list[Gpu]
    cuda_devices: list[tuple[int, int, int]]
    capacity: int | None
    enums: str  # "nsys": as nsys writes them; "none": schema 2.x; "renumbered": kinds moved
    kind_ids: list[int]  # "renumbered": the id each of MEM_KINDS' kinds gets

    def write(self, path: Path) -> Path:
        write_export(path, self.memory, self.api, gpus=self.gpus,
                     options=ExportOptions(cuda_devices=self.cuda_devices))  # fmt: skip
        con = sqlite3.connect(path)
        if self.enums == "none":  # schema 2.x: no ENUM_* tables, the kinds are SPEC's numbers
            con.execute("DROP TABLE ENUM_CUDA_MEM_KIND")
            con.execute("DROP TABLE ENUM_CUDA_DEV_MEM_EVENT_OPER")
        elif self.enums == "renumbered":  # SPEC §1: kinds are resolved by name, not number
            con.execute("DELETE FROM ENUM_CUDA_MEM_KIND")
            con.executemany("INSERT INTO ENUM_CUDA_MEM_KIND VALUES (?,?,?)",
                            [(self.kind_ids[i], name, label) for i, name, label in MEM_KINDS])  # fmt: skip
            cases = " ".join(f"WHEN {old} THEN {new}" for old, new in enumerate(self.kind_ids))
            con.execute(f"UPDATE CUDA_GPU_MEMORY_USAGE_EVENTS SET memKind = CASE memKind {cases} END")
        con.commit()
        con.close()
        return path


@st.composite
def nsys_exports(draw: st.DrawFn) -> NsysExample:
    pids = draw(st.lists(st.sampled_from([1, 77, 4242, 0xFFFFFF]), min_size=1, max_size=3, unique=True))
    devices = draw(st.lists(st.integers(0, 2), min_size=1, max_size=3, unique=True))
    memories = [draw(st.sampled_from([512 * KiB, 40 * MiB, 1 * GiB, 80 * GiB])) for _ in range(3)]
    gpus = [Gpu(i, total_memory=memories[i]) for i in range(3)]
    cuda_devices: list[tuple[int, int, int]] = []
    if draw(st.booleans()):  # the process saw the GPUs under other CUDA ids (SPEC §2)
        for pid in pids:
            perm = draw(st.permutations([0, 1, 2]))
            cuda_devices += [(pid, cuda, perm[cuda]) for cuda in range(3) if draw(st.booleans())]
    spaces = {(p, d): _Space(draw(st.sampled_from(REGIONS)) + (p % 7 << 36) + (d << 32))
              for p in pids for d in devices}  # fmt: skip
    tids = [1, 2, 3]
    corr = {pid: 0 for pid in [*pids, 999]}
    memory: list[MemoryRow] = []
    api: list[ApiRow] = []
    # Session time, or UNIX time in ns (nsys export --ts-normalize=true).
    t = draw(st.sampled_from([1000, 1_764_000_000_000_000_000]))

    def call(pid: int, tid: int, t: int, name: str, ret: int = 0, driver: bool = False) -> int:
        corr[pid] += 1
        api.append(ApiRow(t - 3, t + 3, pid, tid, name, corr[pid], ret, 1 if driver else 0))
        return corr[pid]

    def correlated(pid: int, t: int, name: str) -> int | None:
        """The API row(s) of a memory event, or none (the correlation id left NULL)."""
        how = draw(st.integers(0, 9))
        if how == 0:
            return None
        tid = draw(st.sampled_from(tids))
        driver = name.startswith("cu") and not name.startswith("cuda")
        c = call(pid, tid, t, name, driver=driver)
        if how == 1:  # the runtime call and the driver call beneath it share the id
            api.append(ApiRow(t - 2, t + 2, pid, tid, "cuMemAlloc_v2", c, 0, 1))
        return c

    def pool_row(space: _Space) -> tuple[int, int, int, int] | None:
        """Now and then, a memory pool's row (cudaMallocAsync): one of two pools of the space,
        its size, bytes in use and release threshold as this row records them."""
        if draw(st.integers(0, 7)):
            return None
        size = draw(st.sampled_from([0, 2 * MiB, 32 * MiB, 1 * GiB]))
        used = draw(st.integers(0, size))
        threshold = draw(st.sampled_from([0, 16 * MiB, 1 << 62]))
        return (space.region + (1 << 31) + draw(st.integers(0, 1)) * (1 << 30), size, used, threshold)

    for _ in range(draw(st.integers(1, 60))):
        t += draw(st.sampled_from([0, 0, 1, 10, 1000]))  # equal timestamps are common
        pid, device = draw(st.sampled_from(sorted(spaces)))
        space = spaces[(pid, device)]
        what = draw(st.integers(0, 19))
        if what < 8:  # an allocation
            nbytes = draw(sizes())
            where = draw(st.integers(0, 9))
            if where < 6 or not (space.live or space.freed):
                # 256: module data as genuine exports pack it, footprints overlapping
                address = space.region + space.cursor + draw(st.sampled_from([0, 0, 512, 1, 256, 4096]))
            elif where < 8 and space.freed:  # an address used before
                address = draw(st.sampled_from(space.freed))
            else:  # over a live block: the trace missed its free
                at, n = draw(st.sampled_from(space.live)) if space.live else (space.region, 512)
                address = at + draw(st.integers(0, max(n - 1, 0)))
            space.cursor = max(space.cursor, address - space.region + nbytes)
            space.live.append((address, nbytes))
            kind = draw(st.sampled_from(DEVICE_KINDS))
            c = correlated(pid, t, draw(st.sampled_from(ALLOC_NAMES[:3])))
            memory.append(MemoryRow(t, pid, device, address, nbytes, ALLOC, kind, c, pool_row(space)))
        elif what < 13 and space.live:  # a free of a live block, most often the latest
            i = len(space.live) - 1 if draw(st.booleans()) else draw(st.integers(0, len(space.live) - 1))
            address, nbytes = space.live.pop(i)
            space.freed.append(address)
            nbytes = draw(st.sampled_from([nbytes, nbytes, 0, 512]))  # a free's bytes are ignored
            c = correlated(pid, t, "cudaFree_v3020")
            kind = draw(st.sampled_from(DEVICE_KINDS))  # any device kind frees any device block
            memory.append(MemoryRow(t, pid, device, address, nbytes, FREE, kind, c, pool_row(space)))
        elif what < 14:  # a free of an address nobody allocated (before the capture)
            address = space.region + draw(st.integers(0, 1 << 30))
            memory.append(MemoryRow(t, pid, device, address, 4096, FREE, DEVICE, None))
        elif what < 15:  # a zero-size allocation, sometimes at address 0
            address = draw(st.sampled_from([0, space.region + space.cursor]))
            memory.append(MemoryRow(t, pid, device, address, 0, ALLOC, DEVICE, correlated(pid, t, "cudaMalloc_v3020")))
        elif what < 17:  # an event of another memory kind
            kind = draw(st.sampled_from(OTHER_KINDS))
            op = draw(st.sampled_from([ALLOC, FREE]))
            memory.append(MemoryRow(t, pid, device, 0x1000_0000 + draw(st.integers(0, 1 << 20)) * 512,
                                    draw(sizes()), op, kind, None))  # fmt: skip
        else:  # a failed call: an allocation (charged to a space) or another call (not)
            who = draw(st.sampled_from([*pids, 999]))  # 999: a process with no device memory
            name = draw(st.sampled_from(ALLOC_NAMES + OTHER_NAMES))
            driver = draw(st.booleans())
            ret = draw(st.sampled_from([2, 2, 1, -1, 0]))  # 0: a call that succeeded
            call(who, draw(st.sampled_from(tids)), t + draw(st.sampled_from([0, 0, 1, -1])) + 3,
                 name, ret, driver)  # fmt: skip
    order = draw(st.permutations(range(len(memory))))
    if draw(st.booleans()):  # rows written out of time order: (start, rowid) must sort them
        memory = [memory[i] for i in order]
    if not draw(st.integers(0, 5)):  # an export without times (nsys 2022.1): start = 0 everywhere
        memory = [dataclasses.replace(m, start=0) for m in memory]
    capacity = draw(st.one_of(st.none(), st.sampled_from([1 * MiB, 64 * MiB, 24 * GiB]),
                              st.integers(512 * KiB, 100 * GiB)))  # fmt: skip
    enums = draw(st.sampled_from(["nsys", "nsys", "nsys", "none", "renumbered"]))
    kind_ids = [10 + k for k in draw(st.permutations(range(len(MEM_KINDS))))]
    return NsysExample(memory, api, gpus, cuda_devices, capacity, enums, kind_ids)


@_settings("nsys")
@given(nsys_exports())
def test_random_nsys_exports_match_the_reference(example: NsysExample) -> None:
    with tempfile.TemporaryDirectory(prefix="nsysfrag-diff-") as tmp:
        check(example.write(Path(tmp) / "random.sqlite"), example.capacity)


# ------------------------------------------------------------------------------- snapshots

SNAPSHOT_CAPACITIES = [None, None, 40 * MiB, 96 * MiB, 1 * GiB, 80 * GiB]


@st.composite
def snapshot_formats(draw: st.DrawFn, corrupt: bool) -> dict[str, Any]:
    """A generated snapshot as the PyTorch version of the draw would write it: current (2.5+,
    with ``allocator_settings``), 2.1-2.4 (no ``allocator_settings``), or 2.0-2.1 without
    times (no ``time_us``: entries 1 ns apart)."""
    snap = draw(snapshots(corrupt=corrupt))
    version = draw(st.sampled_from(["current", "current", "no_settings", "no_times"]))
    if version == "no_settings":
        # OPEN (QUESTIONS.md Q18): without allocator_settings, a snapshot mixing native and
        # expandable segments (only a setting toggled at run time makes one) splits its native
        # blocks differently in the two readings; the generator mixes them only across the
        # devices of a merge, so those keep their settings. The trace's segments count too: a
        # device with no segment left at the snapshot may have freed native ones in its window.
        kinds = {bool(seg["is_expandable"]) for seg in snap["segments"]}
        kinds |= {e["action"] in ("segment_map", "segment_unmap") for t in snap["device_traces"]
                  for e in t if e["action"].startswith("segment_")}  # fmt: skip
        if len(kinds) <= 1:
            snap = {k: v for k, v in snap.items() if k != "allocator_settings"}
    elif version == "no_times":
        snap = {**snap, "device_traces": [[{k: v for k, v in e.items() if k != "time_us"} for e in t]
                                          for t in snap["device_traces"]]}  # fmt: skip
    return snap


def _check_snapshot(snap: dict[str, Any], capacity: int | None, consistent_only: bool = False) -> None:
    with tempfile.TemporaryDirectory(prefix="nsysfrag-diff-") as tmp:
        path = Path(tmp) / "random.pickle"
        path.write_bytes(pickle.dumps(snap, protocol=4))
        check(path, capacity, consistent_only)


@_settings("snapshot")
@given(snapshot_formats(corrupt=False), st.sampled_from(SNAPSHOT_CAPACITIES))
def test_random_snapshots_match_the_reference(snap: dict[str, Any], capacity: int | None) -> None:
    _check_snapshot(snap, capacity)


@_settings("corrupt_snapshot")
@given(snapshot_formats(corrupt=True), st.sampled_from(SNAPSHOT_CAPACITIES))
def test_random_corrupt_snapshots_match_the_reference(snap: dict[str, Any], capacity: int | None) -> None:
    _check_snapshot(snap, capacity, consistent_only=True)


BASE = 0x7F00_0000_0000


def _pending_free_snapshot(blocks: int, trace: list[dict[str, Any]]) -> dict[str, Any]:
    """One 2 MiB small segment of ``blocks`` 512 B blocks, the first awaiting its free
    (``active_pending_free``), the rest of the segment free; ``trace`` its device's history."""
    used = blocks * 512
    layout = [
        {"address": BASE + i * 512, "size": 512, "requested_size": 1,
         "state": "active_pending_free" if i == 0 else "active_allocated", "frames": []}
        for i in range(blocks)
    ] + [{"address": BASE + used, "size": 2 * MiB - used, "requested_size": 0, "state": "inactive",
          "frames": []}]  # fmt: skip
    return {
        "segments": [{"device": 0, "address": BASE, "total_size": 2 * MiB,
                      "allocated_size": used - 512, "active_size": used, "requested_size": blocks,
                      "stream": 0, "segment_type": "small", "is_expandable": False, "frames": [],
                      "blocks": layout}],
        "device_traces": [[{"stream": 0, "frames": [], **e} for e in trace]],
    }  # fmt: skip


_REQUESTED_FREE = {"action": "free_requested", "addr": BASE, "size": 1}


def test_a_trace_of_only_a_requested_free_ends_the_start_moment_too(tmp_path: Path) -> None:
    """Found by CI: a trace whose one entry is a free_requested makes no point of its own, so
    the window's start is its last moment and the free counts there (allocated 1536, not the
    2048 the start's points held before the trace's end was written into all of them)."""
    snap = _pending_free_snapshot(4, [{**_REQUESTED_FREE, "time_us": 1_757_000_000_000_052}])
    path = tmp_path / "requested_free_only.pickle"
    path.write_bytes(pickle.dumps(snap))
    check(path, None)


def test_an_oom_before_a_requested_free_keeps_its_own_allocated(tmp_path: Path) -> None:
    """Found by CI: an oom at the last point, then a free_requested. The last point carries the
    trace's end (final allocated 3072), but the oom came before the free was requested: its
    allocated is 3584, the reference's."""
    oom = {"action": "oom", "device_free": 42 * MiB, "size": 42 * MiB + 512,
           "time_us": 1_757_000_000_000_088}  # fmt: skip
    snap = _pending_free_snapshot(7, [oom, {**_REQUESTED_FREE, "time_us": 1_757_000_000_000_100}])
    path = tmp_path / "oom_then_requested_free.pickle"
    path.write_bytes(pickle.dumps(snap))
    check(path, None)

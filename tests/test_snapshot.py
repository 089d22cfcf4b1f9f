"""PyTorch memory snapshots: the restricted reader, the window's start, the pytorch-segments
model, the CLI, every bad input, the samples and the genuine snapshots in ../shared."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from nsysfrag.analysis import EVENT_NAMES, Analysis, SpaceAnalysis, State
from nsysfrag.analysis import analyze as analyze_recording
from nsysfrag.cli import cli
from nsysfrag.errors import InputError
from nsysfrag.inputs import InputOptions, open_input
from nsysfrag.inputs.torch_snapshot.reader import (
    NO_PYTHON_FRAME,
    NO_STACK,
    is_snapshot,
    parse_snapshot,
    read_snapshot,
    site_of,
)
from nsysfrag.inputs.torch_snapshot.spaces import recording_of
from nsysfrag.inputs.torch_snapshot.stacks import MAX_STACK_FRAMES, frames_of, program_stack
from nsysfrag.models.observed.kernel import ALLOCATED, FREED
from nsysfrag.models.segments import MODEL_NAME
from nsysfrag.models.segments.rules import round_size
from nsysfrag.models.series import OOM, SEGMENT_FREE
from nsysfrag.reporters import csv_report, json_report
from tests.conftest import REPO, SAMPLES, MiB

REAL_SNAPSHOTS = REPO.parent / "shared" / "real_snapshots"
REAL = (
    sorted(p for p in REAL_SNAPSHOTS.glob("*") if p.suffix in (".pickle", ".pkl"))
    if REAL_SNAPSHOTS.is_dir()
    else []
)
needs_real = pytest.mark.skipif(not REAL, reason="../shared/real_snapshots is absent")
SAMPLE_FILES = (
    "training_snapshot.pickle",
    "inference_snapshot.pickle",
    "inference_expandable_snapshot.pickle",
    "pressure_snapshot.pickle",
    "pressure_gc_snapshot.pickle",
    "pressure_expandable_snapshot.pickle",
)
KiB = 1 << 10
S = 0x7F00_0000_0000  # a segment address

USER = [
    {"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
    {
        "name": "forward",
        "filename": "/env/lib/python3.11/site-packages/torch/nn/modules/linear.py",
        "line": 125,
    },
    {"name": "forward", "filename": "/home/me/proj/model.py", "line": 42},
    {"name": "main", "filename": "/home/me/proj/train.py", "line": 7},
]


# ---------------------------------------------------------------- builders


def block(
    address: int,
    size: int,
    requested: int | None = None,
    state: str = "active_allocated",
    frames: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": size if requested is None else requested,
            "state": state, "frames": frames or []}  # fmt: skip


def segment(
    address: int,
    size: int,
    blocks: list[dict[str, Any]] | None = None,
    *,
    device: int = 0,
    kind: str = "large",
    expandable: bool = False,
) -> dict[str, Any]:
    """A segment; the span its ``blocks`` leave uncovered is one inactive block per gap."""
    filled, at = [], address
    for b in sorted(blocks or [], key=lambda b: b["address"]):
        if b["address"] > at:
            filled.append(block(at, b["address"] - at, 0, "inactive"))
        filled.append(b)
        at = b["address"] + b["size"]
    if at < address + size:
        filled.append(block(at, address + size - at, 0, "inactive"))
    active = [b for b in filled if b["state"] != "inactive"]
    return {"device": device, "address": address, "total_size": size,
            "allocated_size": sum(b["size"] for b in active), "active_size": sum(b["size"] for b in active),
            "requested_size": sum(b["requested_size"] for b in active), "stream": 0, "segment_type": kind,
            "segment_pool_id": (0, 0), "is_expandable": expandable, "frames": [], "blocks": filled}  # fmt: skip


def ev(
    action: str,
    addr: int,
    size: int,
    t_us: int,
    frames: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    e: dict[str, Any] = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1_000_000 + t_us,
                         "frames": frames or []}  # fmt: skip
    e.update(extra)
    return e


def snap(
    segments: list[dict[str, Any]], *traces: list[dict[str, Any]], **top: Any
) -> dict[str, Any]:
    return {"segments": segments, "device_traces": list(traces) or [[]], **top}


def analyze(data: Any, capacity: int | None = 64 * MiB) -> Analysis:
    snapshot = parse_snapshot(data, "test.pickle")
    return analyze_recording(recording_of(snapshot, InputOptions(capacity_bytes=capacity)))


def analyze_snapshot_file(path: Path) -> Analysis:
    return analyze_recording(open_input(path))


def extras(s: SpaceAnalysis) -> dict[str, Any]:
    """The snapshot's own keys of the space's JSON document."""
    assert s.snapshot is not None
    return json_report.snapshot_document(s.snapshot)


def one(data: Any, capacity: int | None = 64 * MiB) -> SpaceAnalysis:
    a = analyze(data, capacity)
    assert len(a.spaces) == 1
    return a.spaces[0]


def inside(state: State) -> int:
    """The free bytes inside the segments at ``state``: reserved − active."""
    assert state.pool is not None
    return state.pool.reserved_bytes - state.pool.active_bytes


def names(s: SpaceAnalysis) -> list[str]:
    return [EVENT_NAMES[c] for c in s.timeline.event.tolist()]


def write(tmp_path: Path, data: Any, name: str = "snap.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(data, protocol=4))
    return path


def run(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "nsysfrag", *args], check=False, capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "120"})  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


# ---------------------------------------------------------------- the allocator's rules


@pytest.mark.parametrize(
    ("requested", "rounded"),
    [
        (1, 512),
        (512, 512),
        (513, 1024),
        (1200, 1536),
        (MiB, MiB),
        (MiB + 1, MiB + 512),
        (11 * MiB + 1, 11 * MiB + 512),
    ],
)
def test_round_size_matches_the_allocator(requested: int, rounded: int) -> None:
    assert round_size(requested) == rounded


def test_round_size_with_power_of_two_divisions() -> None:
    # ALLOCATORS.md §1.2: 1 MiB + 1 -> 1.25 MiB with 4 divisions; 1200 B is below 512 x 4.
    assert round_size(MiB + 1, {1: 4}) == MiB + MiB // 4
    assert round_size(1200, {1: 4}) == 1536


# ---------------------------------------------------------------- GIVEN/WHEN/THEN: the model


def test_free_blocks_are_the_gaps_inside_segments_and_never_cross_them() -> None:
    # GIVEN two adjacent, entirely free 20 MiB segments
    s = one(snap([segment(S, 20 * MiB), segment(S + 20 * MiB, 20 * MiB)]))
    # THEN they are two free blocks of 20 MiB, not one of 40, beside the device's other 24 MiB
    assert s.final.pool is not None
    assert (s.final.free_blocks, s.final.pool.largest_block_bytes) == (3, 20 * MiB)
    # and being wholly free they are releasable: a 64 MiB request would succeed, nothing is
    # fragmented
    assert s.final.pool.releasable_bytes == 40 * MiB and s.final.pool.stranded_bytes == 0
    assert (s.final.free_bytes, s.final.largest_free_bytes) == (64 * MiB, 64 * MiB)
    assert s.final.global_frag == 0 and s.final.local_frag == 0
    assert s.model == MODEL_NAME


def test_free_is_reserved_minus_active_and_live_is_requested() -> None:
    # GIVEN a 20 MiB segment holding a 4 MiB block (requested 3 MiB) and a pending-free 2 MiB block
    seg = segment(
        S,
        20 * MiB,
        [block(S, 4 * MiB, 3 * MiB), block(S + 8 * MiB, 2 * MiB, state="active_pending_free")],
    )
    s = one(snap([seg]))
    # THEN the pending block still counts (it cannot be reused until free_completed)
    assert inside(s.final) == 14 * MiB and s.final.free_bytes == 14 * MiB + 44 * MiB
    assert s.final.pool is not None and s.final.pool.largest_block_bytes == 10 * MiB
    assert s.final.live_bytes == 5 * MiB
    assert extras(s)["reserved_bytes_final"] == 20 * MiB
    # AND PyTorch's allocated bytes leave it out (its free was requested); active counts it
    assert (s.final.pool.allocated_bytes, s.final.pool.active_bytes) == (4 * MiB, 6 * MiB)
    assert extras(s)["allocated_bytes_final"] == 4 * MiB
    assert extras(s)["active_bytes_final"] == 6 * MiB


def test_window_start_is_rebuilt_so_frees_of_older_blocks_match() -> None:
    # GIVEN a block A allocated before the trace window and freed inside it
    a, b = S, S + 4 * MiB
    final = segment(S, 20 * MiB, [block(b, 4 * MiB, frames=USER)])
    trace = [
        ev("alloc", b, 4 * MiB, 10, USER),
        ev("free_requested", a, 4 * MiB, 20),
        ev("free_completed", a, 4 * MiB, 21),
    ]
    s = one(snap([final], trace))
    # THEN A is live at the start (an initial block), and its free is an ordinary, matched free
    assert extras(s)["window"]["initial_blocks"] == 1
    assert extras(s)["window"]["conflicts"] == 0 and extras(s)["window"]["final_mismatches"] == 0
    assert s.counts.unmatched_frees == 0 and s.counts.frees == 1 and s.counts.allocations == 1
    assert names(s) == ["alloc", "alloc", "free"]
    # and the free of A, below B at the segment's start, leaves no hole
    assert s.hole_creating_frees == 0
    assert s.timeline.removed_at.tolist() == [2, -1, -1]


def test_a_free_between_live_blocks_of_a_segment_is_a_hole_pinned_by_them() -> None:
    # GIVEN blocks A, B, C packed into one 20 MiB segment, allocated in the window
    other = [{"name": "step", "filename": "/home/me/proj/optim.py", "line": 9}]
    trace = [
        ev("segment_alloc", S, 20 * MiB, 1),
        ev("alloc", S, 2 * MiB, 2, other),
        ev("alloc", S + 2 * MiB, 2 * MiB, 3, USER),
        ev("alloc", S + 4 * MiB, 2 * MiB, 4, other),
        ev("free_requested", S + 2 * MiB, 2 * MiB, 5, USER),
        ev("free_completed", S + 2 * MiB, 2 * MiB, 6, USER),
    ]
    final = segment(
        S, 20 * MiB, [block(S, 2 * MiB, frames=other), block(S + 4 * MiB, 2 * MiB, frames=other)]
    )
    s = one(snap([final], trace))
    # THEN freeing B (not the newest block) is out of order and leaves a hole pinned by A and C
    assert s.out_of_order_frees == 1 and s.hole_creating_frees == 1
    (h,) = s.hotspots
    assert (h.site, h.size_class, h.hole_bytes) == ("proj/model.py:42 forward", "2–4 MiB", 2 * MiB)
    assert h.pinned_by == ("proj/optim.py:9 step",)
    # and the segment_alloc folded into the alloc that needed it: no point of its own (the
    # first point is the empty device the window opens on)
    assert names(s) == ["window_start", "alloc", "alloc", "alloc", "free"]
    assert s.final.free_blocks == 3  # two in the segment, and the device's own
    assert s.final.pool is not None and s.final.pool.largest_block_bytes == 14 * MiB


def test_a_block_carved_from_a_large_free_block_takes_the_unsplittable_remainder() -> None:
    # GIVEN a 20 MiB large-pool segment; a 19.5 MiB request leaves 0.5 MiB, which PyTorch does not split
    trace = [ev("segment_alloc", S, 20 * MiB, 1), ev("alloc", S, 19 * MiB + 512 * KiB, 2),
             ev("free_requested", S, 19 * MiB + 512 * KiB, 3), ev("free_completed", S, 19 * MiB + 512 * KiB, 4)]  # fmt: skip
    s = one(snap([segment(S, 20 * MiB)], trace))
    # THEN while it is live the segment has no free byte: free memory (D + F) is the device's
    # 44 MiB outside it, after the window's start (the empty device) and before the free
    assert names(s) == ["window_start", "alloc", "free"]
    assert s.timeline.free_bytes.tolist() == [64 * MiB, 44 * MiB, 64 * MiB]
    assert s.internal_frag == pytest.approx(0.5 / 20)


def test_small_pool_blocks_split_at_512_bytes() -> None:
    trace = [ev("segment_alloc", S, 2 * MiB, 1), ev("alloc", S, 1000, 2)]
    s = one(snap([segment(S, 2 * MiB, [block(S, 1024, 1000)], kind="small")], trace))
    assert inside(s.final) == 2 * MiB - 1024
    assert extras(s)["window"]["final_mismatches"] == 0


def test_segment_free_gives_memory_back_and_is_a_point() -> None:
    trace = [ev("alloc", S, 4 * MiB, 1), ev("free_requested", S, 4 * MiB, 2), ev("free_completed", S, 4 * MiB, 3),
             ev("segment_free", S, 20 * MiB, 4)]  # fmt: skip
    s = one(snap([], trace))
    assert extras(s)["window"]["initial_reserved_bytes"] == 20 * MiB
    # the window opens on the empty segment: a moment of its own
    assert names(s) == ["segment_alloc", "alloc", "free", "segment_free"]
    # free memory D + F: the device's 44 MiB beside the segment's 20, 16, 20 MiB, then all 64
    assert s.timeline.free_bytes.tolist() == [64 * MiB, 60 * MiB, 64 * MiB, 64 * MiB]
    assert extras(s)["reserved_bytes_peak"] == 20 * MiB and extras(s)["reserved_bytes_final"] == 0


def test_expandable_ranges_join_when_mapped_and_split_when_unmapped() -> None:
    # GIVEN one expandable range of 40 MiB at the end, after mapping 20 MiB twice and unmapping the middle
    trace = [
        ev("segment_map", S, 20 * MiB, 1),
        ev("alloc", S, 30 * MiB, 2),  # maps below are joined: one 40 MiB range
        ev("segment_map", S + 20 * MiB, 20 * MiB, 1),
        ev("alloc", S + 30 * MiB, MiB, 3),
    ]
    trace[1], trace[2] = trace[2], trace[1]
    final = segment(S, 40 * MiB, [block(S, 30 * MiB), block(S + 30 * MiB, MiB)], expandable=True)
    s = one(snap([final], trace))
    assert extras(s)["window"]["conflicts"] == 0 and extras(s)["window"]["final_mismatches"] == 0
    assert s.final.free_blocks == 2 and inside(s.final) == 9 * MiB  # and the device's 24 MiB
    # WHEN the middle is freed and its pages unmapped, the range splits in two
    trace += [ev("free_requested", S, 30 * MiB, 4), ev("free_completed", S, 30 * MiB, 5),
              ev("segment_unmap", S, 20 * MiB, 6)]  # fmt: skip
    final = segment(S + 20 * MiB, 20 * MiB, [block(S + 30 * MiB, MiB)], expandable=True)
    s = one(snap([final], trace))
    assert extras(s)["window"]["final_mismatches"] == 0
    assert names(s)[-1] == "segment_unmap"
    assert inside(s.final) == 19 * MiB and s.final.free_blocks == 3



@pytest.fixture(params=["compiled", "python"])
def either_replay(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test that takes it runs with the compiled replay and with the Python one."""
    if request.param == "python":
        monkeypatch.setenv("NSYSFRAG_SEGMENTS_REFERENCE", "1")
    return str(request.param)


def test_an_allocation_past_its_segments_end_is_a_conflict(either_replay: str) -> None:
    # GIVEN an expandable range of 20 MiB and a 30 MiB allocation in it whose segment_map (the
    # next 20 MiB) comes only after it: a trace edited out of order (PyTorch maps first)
    trace = [
        ev("segment_map", S, 20 * MiB, 1),
        ev("alloc", S, 30 * MiB, 2),
        ev("segment_map", S + 20 * MiB, 20 * MiB, 3),
    ]
    final = segment(S, 40 * MiB, [block(S, 30 * MiB)], expandable=True)
    # WHEN it is replayed
    s = one(snap([final], trace))
    # THEN the allocation that runs past its segment's end is an entry that did not fit: a
    # conflict, so the report says the layout is approximate (it was clipped silently, and the
    # SPEC reference, which does not clip, gave other figures: test_spec_differential)
    assert extras(s)["window"]["conflicts"] == 1


def test_a_block_live_at_the_start_that_cannot_fit_is_a_conflict(either_replay: str) -> None:
    # GIVEN a 2 MiB small-pool segment with a block live through the window at 64 KiB, and a
    # trace that frees a 100 KiB block at the segment's start: a block live at the window's
    # start that would reach into the next one (an edited trace)
    trace = [ev("free_requested", S, 100 * 1024, 1), ev("free_completed", S, 100 * 1024, 2)]
    final = segment(S, 2 * MiB, [block(S + 64 * 1024, 32 * 1024)], kind="small")
    # WHEN it is replayed
    s = one(snap([final], trace))
    # THEN the block is cut to the room it has, and that is a conflict: the report says the
    # layout is approximate (it was cut silently: test_spec_differential)
    assert extras(s)["window"]["conflicts"] == 1

def test_oom_sets_capacity_and_records_the_largest_free_block() -> None:
    seg = segment(S, 20 * MiB, [block(S, 8 * MiB), block(S + 12 * MiB, 8 * MiB)])
    trace = [ev("alloc", S + 12 * MiB, 8 * MiB, 1, USER)]
    oom = {
        "action": "oom",
        "device_free": 44 * MiB,
        "size": 30 * MiB,
        "stream": 0,
        "time_us": 1_000_002,
        "frames": USER,
    }
    s = one(snap([seg], trace + [oom]), capacity=None)
    assert s.capacity_bytes == 64 * MiB  # reserved 20 MiB + 44 MiB CUDA had free
    assert s.capacity_source == "oom"
    assert s.counts.failed_allocations == 1 and s.alloc_failure_rate == pytest.approx(0.5)
    (o,) = extras(s)["oom_events"]
    assert o["largest_free_bytes"] == 4 * MiB and o["requested_bytes"] == 30 * MiB
    assert o["device_free_bytes"] == 44 * MiB and o["site"] == "proj/model.py:42 forward"
    assert names(s)[-1] == "oom" and s.timeline.event[-1] == OOM


def test_without_capacity_or_oom_the_peak_reserved_is_used_with_a_warning() -> None:
    a = analyze(snap([segment(S, 20 * MiB, [block(S, MiB)])]), capacity=None)
    assert a.spaces[0].capacity_bytes == 20 * MiB
    assert a.spaces[0].capacity_source == "reserved_peak"
    assert any("--capacity" in w for w in a.warnings)


def test_one_space_per_device() -> None:
    data = snap(
        [segment(S, 20 * MiB, [block(S, MiB)]), segment(S * 2, 2 * MiB, device=2, kind="small")],
        [],
        [],
        [],
    )
    a = analyze(data)
    assert [(s.pid, s.device) for s in a.spaces] == [(0, 0), (0, 2)]
    assert a.model == MODEL_NAME


def test_pending_free_keeps_the_block_until_free_completed() -> None:
    trace = [ev("alloc", S, 4 * MiB, 1), ev("free_requested", S, 4 * MiB, 2)]
    s = one(snap([segment(S, 20 * MiB, [block(S, 4 * MiB, state="active_pending_free")])], trace))
    assert names(s) == ["segment_alloc", "alloc"]  # the window opens on the empty segment
    assert inside(s.final) == 16 * MiB


def test_unknown_actions_are_counted_and_warned_about() -> None:
    trace = [
        ev("alloc", S, MiB, 1),
        ev("teleport", S, 1, 2),
        ev("teleport", S, 1, 3),
        {"action": "alloc"},
    ]
    a = analyze(snap([segment(S, 20 * MiB, [block(S, MiB)])], trace))
    assert any(
        "2 trace entries with an unknown action" in w and "'teleport' ×2" in w for w in a.warnings
    )
    assert a.input_counts.skipped_rows == 1


def test_a_trace_without_timestamps_uses_entry_numbers() -> None:
    trace = [{"action": "alloc", "addr": S, "size": MiB, "stream": 0}]
    a = analyze(snap([segment(S, 20 * MiB, [block(S, MiB)])], trace))
    assert a.spaces[0].growth_per_s == 0.0
    assert any("no timestamps" in w for w in a.warnings)


def test_pytorch_2_0_blocks_carry_history_instead_of_address() -> None:
    seg = {"device": 0, "address": S, "total_size": 20 * MiB, "allocated_size": 2 * MiB, "active_size": 2 * MiB,
           "stream": 0, "segment_type": "large",
           "blocks": [{"size": 2 * MiB, "state": "inactive", "history": []},
                      {"size": 2 * MiB, "state": "active_allocated",
                       "history": [{"addr": S + 2 * MiB, "real_size": 1_500_000, "frames": USER}]},
                      {"size": 16 * MiB, "state": "inactive"}]}  # fmt: skip
    s = one(snap([seg], [{"action": "free_completed", "addr": S, "size": MiB, "stream": 0}]))
    assert extras(s)["snapshot_layout"].startswith("PyTorch 2.0")
    assert s.final.live_bytes == 1_500_000
    assert inside(s.final) == 18 * MiB and s.final.free_blocks == 3
    assert s.timeline.site_names[s.timeline.site[1]] == "proj/model.py:42 forward"


def test_the_segment_list_of_memory_snapshot_is_a_state_only_input() -> None:
    a = analyze([segment(S, 20 * MiB, [block(S, MiB)])])
    (s,) = a.spaces
    assert names(s) == ["alloc"] and s.counts.allocations == 0
    assert any("no trace entries" in w for w in a.warnings)


def test_sites_name_the_innermost_python_frame_outside_torch() -> None:
    assert site_of(USER) == "proj/model.py:42 forward"
    assert site_of(USER[:2]) == "modules/linear.py:125 forward"
    assert (
        site_of(
            [
                {
                    "name": "torch::autograd::generated::MmBackward0::apply(x)",
                    "filename": "??",
                    "line": 0,
                }
            ]
        )
        == "autograd MmBackward0"
    )
    assert site_of(USER[:1]) == NO_PYTHON_FRAME
    assert site_of([]) == NO_STACK


def test_an_oom_s_stack_is_the_program_s_frames_innermost_first() -> None:
    frames = frames_of(USER)
    assert program_stack(frames) == ("proj/model.py:42 forward", "proj/train.py:7 main")
    # Only torch's own Python frames: those, as the site falls back to them; C++ frames never.
    assert program_stack(frames_of(USER[:2])) == ("modules/linear.py:125 forward",)
    assert program_stack(frames_of(USER[:1])) == () and program_stack(()) == ()
    deep = frames_of([{"filename": "a.py", "line": i, "name": "f"} for i in range(1000)])
    assert len(program_stack(deep)) == MAX_STACK_FRAMES


def test_timeline_is_consistent_for_figures_and_csv(tmp_path: Path) -> None:
    s = one(
        snap(
            [],
            [
                ev("alloc", S, MiB, 1),
                ev("free_completed", S, MiB, 2),
                ev("segment_free", S, 20 * MiB, 3),
            ],
        )
    )
    t = s.timeline
    n = len(t.time_ns)
    assert {
        len(a)
        for a in (t.event, t.address, t.bytes, t.global_frag, t.removed_at, t.site, t.live_bytes)
    } == {n}
    allocs = np.flatnonzero(t.event == ALLOCATED)
    assert all(t.event[t.removed_at[i]] == FREED for i in allocs if t.removed_at[i] >= 0)
    assert t.event[-1] == SEGMENT_FREE
    a = analyze(
        snap(
            [],
            [
                ev("alloc", S, MiB, 1),
                ev("free_completed", S, MiB, 2),
                ev("segment_free", S, 20 * MiB, 3),
            ],
        )
    )
    out = tmp_path / "t.csv"
    csv_report.write(a, out)
    assert [line.split(",")[4] for line in out.read_text().splitlines()[1:]] == [
        "segment_alloc",
        "alloc",
        "free",
        "segment_free",
    ]


def test_json_names_the_model_and_merges_the_extras() -> None:
    doc = json_report.document(analyze(snap([segment(S, 20 * MiB, [block(S, MiB)])])))
    assert doc["model"]["name"] == MODEL_NAME
    (space,) = doc["spaces"]
    assert space["model"] == MODEL_NAME
    for key in (
        "reserved_bytes_peak",
        "allocated_bytes_peak",
        "requested_bytes_peak",
        "oom_events",
        "window",
    ):
        assert key in space
    json.dumps(doc)


# ---------------------------------------------------------------- reading files


def test_is_snapshot_by_suffix_or_pickle_header(tmp_path: Path) -> None:
    assert is_snapshot(Path("x.pkl")) and is_snapshot(Path("y.PICKLE"))
    sniffed = write(tmp_path, {"segments": []}, "dump.bin")
    assert is_snapshot(sniffed)
    assert not is_snapshot(SAMPLES / "training_loop.sqlite")


def test_unpickler_builds_plain_data_only(tmp_path: Path) -> None:
    data = snap([segment(S, 20 * MiB, [block(S, MiB)])])
    assert read_snapshot(write(tmp_path, data)).segments[0].blocks[0].size == MiB


class Payload:
    """A local class: pickling it references tests.test_snapshot.Payload."""

    def __init__(self) -> None:
        self.x = 1


def _os_system_pickle(marker: Path) -> bytes:
    # Protocol 2: GLOBAL 'os system', the command as argument, REDUCE: what an attack looks like.
    cmd = f"touch {marker}".encode()
    return b"\x80\x02cos\nsystem\nX" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R."


BAD_INPUTS: dict[str, Any] = {
    "not_a_pickle": b"SQLite format 3\x00 but called .pickle",
    "text": b"hello",
    "empty": b"",
    "truncated": pickle.dumps(snap([segment(S, 20 * MiB, [block(S, MiB)])]), protocol=4)[:-40],
    "wrong_shape_list_of_ints": pickle.dumps([1, 2, 3], protocol=4),
    "wrong_shape_dict": pickle.dumps({"hello": "world"}, protocol=4),
    "segment_without_address": pickle.dumps(
        {"segments": [{"total_size": 1, "blocks": []}]}, protocol=4
    ),
    "block_with_bad_state": pickle.dumps(
        snap([segment(S, MiB, [block(S, 512, state="weird")])]), protocol=4
    ),
    "torch_tensor": b"\x80\x02ctorch\nTensor\nq\x00)\x81q\x01.",
    "local_class": pickle.dumps({"segments": [Payload()]}, protocol=4),
    "persistent_id": b"\x80\x02X\x01\x00\x00\x00aQ.",
    "empty_trace": pickle.dumps({"segments": [], "device_traces": [[]]}, protocol=4),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(BAD_INPUTS[case])
    code, out, err = run("analyze", str(path))
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nsysfrag: error:"), err
    assert "Traceback" not in err and "internal error" not in err


def test_a_pickle_that_calls_os_system_is_refused_before_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(_os_system_pickle(marker))
    with pytest.raises(InputError, match="os.system"):
        read_snapshot(path)
    code, _, err = run("analyze", str(path))
    assert code == 2 and "references os.system" in err
    assert not marker.exists()


def test_refusal_messages_name_the_global(tmp_path: Path) -> None:
    path = tmp_path / "t.pickle"
    path.write_bytes(BAD_INPUTS["torch_tensor"])
    with pytest.raises(InputError, match=r"torch\.Tensor"):
        read_snapshot(path)
    path.write_bytes(BAD_INPUTS["local_class"])
    with pytest.raises(InputError, match=r"test_snapshot\.Payload"):
        read_snapshot(path)


def test_missing_snapshot_file_says_what_to_pass(tmp_path: Path) -> None:
    code, _, err = run("analyze", str(tmp_path / "nope.pickle"))
    assert code == 2 and "no such file" in err


def test_reexport_does_not_apply_to_a_snapshot(tmp_path: Path) -> None:
    path = write(tmp_path, snap([segment(S, 20 * MiB, [block(S, MiB)])]))
    result = CliRunner().invoke(cli, ["analyze", str(path), "--reexport"])
    assert result.exit_code == 2


def test_unknown_actions_are_a_warning_not_an_error(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        snap(
            [segment(S, 20 * MiB, [block(S, MiB)])],
            [ev("alloc", S, MiB, 1), ev("beam_me_up", 0, 0, 2)],
        ),
    )
    result = CliRunner().invoke(cli, ["analyze", str(path), "--json", "-"])
    assert result.exit_code == 0, result.output
    assert any("beam_me_up" in w for w in json.loads(result.output)["trace"]["warnings"])


# ---------------------------------------------------------------- the CLI on the samples


def test_samples_exist_and_are_small() -> None:
    for name in SAMPLE_FILES:
        path = SAMPLES / name
        assert path.exists(), name
        assert path.stat().st_size < 2_000_000


def test_samples_are_reproducible() -> None:
    spec = importlib.util.spec_from_file_location("make_snapshots", SAMPLES / "make_snapshots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
        for name, build in module.SAMPLES.items():
            assert pickle.dumps(build(), protocol=4) == (SAMPLES / name).read_bytes(), name
    finally:
        del sys.modules[spec.name]


@pytest.mark.parametrize("name", SAMPLE_FILES)
def test_samples_replay_exactly_to_their_final_state(name: str) -> None:
    a = analyze_snapshot_file(SAMPLES / name)
    (s,) = a.spaces
    window = extras(s)["window"]
    assert window["conflicts"] == 0 and window["final_mismatches"] == 0
    assert window["initial_blocks"] > 0 and window["trace_entries"] == 8000
    assert s.hotspots and s.size_histogram and s.free_block_histogram


def test_inference_samples_run_out_of_memory_with_and_without_expandable_segments() -> None:
    native = analyze_snapshot_file(SAMPLES / "inference_snapshot.pickle").spaces[0]
    expandable = analyze_snapshot_file(SAMPLES / "inference_expandable_snapshot.pickle").spaces[0]
    for s in (native, expandable):
        assert s.counts.failed_allocations == 1
        assert s.capacity_source == "oom"
        assert s.capacity_bytes == 16 * (1 << 30) - 512 * MiB  # the device less the CUDA context
    assert "segment_free" in names(native) and "segment_unmap" in names(expandable)
    assert extras(expandable)["expandable_segments"] and not extras(native)["expandable_segments"]


def test_cli_json_terminal_csv_and_html_on_a_sample(tmp_path: Path) -> None:
    sample = SAMPLES / "training_snapshot.pickle"
    out = {k: tmp_path / f"r.{k}" for k in ("json", "csv", "html")}
    code, stdout, err = run("analyze", str(sample), "--capacity", "80GiB", "--json", str(out["json"]),
                            "--csv", str(out["csv"]), "--html", str(out["html"]))  # fmt: skip
    assert code == 0, err
    # The header line holds the path, so where it wraps depends on where the checkout is.
    words = " ".join(stdout.split())
    assert "pytorch-segments address space" in words and "model: pytorch-segments" in words
    doc = json.loads(out["json"].read_text())
    assert doc["schema"] == "nsysfrag/1" and doc["model"]["name"] == MODEL_NAME
    (space,) = doc["spaces"]
    assert space["capacity_bytes"] == 80 << 30 and space["capacity_source"] == "--capacity"
    assert space["timeline"]["time_ns"][-1] == space["final"]["time_ns"]
    assert len(out["csv"].read_text().splitlines()) == 1 + len(
        analyze_snapshot_file(sample).spaces[0].timeline.time_ns
    )
    page = out["html"].read_text()
    assert "pytorch-segments address space" in page and "<svg" in page


def test_sniffed_pickle_without_suffix_routes_to_the_snapshot_reader(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.dump"
    path.write_bytes((SAMPLES / "training_snapshot.pickle").read_bytes())
    result = CliRunner().invoke(cli, ["analyze", str(path), "--json", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["spaces"][0]["model"] == MODEL_NAME


def test_nsys_spaces_still_say_observed() -> None:
    result = CliRunner().invoke(
        cli, ["analyze", str(SAMPLES / "training_loop.sqlite"), "--json", "-"]
    )
    assert {s["model"] for s in json.loads(result.output)["spaces"]} == {"observed"}


# ---------------------------------------------------------------- genuine snapshots


@needs_real
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name[:60])
def test_real_snapshot_analyzes(path: Path) -> None:
    a = analyze_snapshot_file(path)
    assert a.model == MODEL_NAME and a.spaces
    doc = json.loads(json_report.dumps(json_report.document(a)))
    for s, space in zip(a.spaces, doc["spaces"], strict=True):
        assert space["model"] == MODEL_NAME
        # The layout rebuilt at the window's start replays exactly onto the final segments.
        assert extras(s)["window"]["conflicts"] == 0
        assert extras(s)["window"]["final_mismatches"] == 0
        assert s.counts.unmatched_frees == 0 and s.counts.overlaps == 0
        assert 0 <= s.max_local_frag <= 1 and 0 <= s.max_global_frag <= 1
        assert extras(s)["reserved_bytes_peak"] <= s.capacity_bytes
        assert (s.timeline.free_bytes >= s.timeline.largest_free_bytes).all()
        t = s.timeline
        assert len(t.time_ns) > 0 and (np.diff(t.time_ns) >= 0).all()


@needs_real
def test_real_multi_device_snapshot_with_an_oom() -> None:
    a = analyze_snapshot_file(
        REAL_SNAPSHOTS / "Constructor-Sun+code_location__memory_snapshot.pickle"
    )
    assert [s.device for s in a.spaces] == [0, 1, 2]
    dev1 = a.spaces[1]
    (o,) = extras(dev1)["oom_events"]
    assert dev1.capacity_bytes == o["reserved_bytes"] + o["device_free_bytes"]
    assert o["largest_free_bytes"] < o["requested_bytes"]
    assert o["site"].endswith("update_nodes")


@needs_real
def test_real_legacy_list_and_segment_only_snapshots_are_state_only() -> None:
    for name in ("Muduard+LayoutEditing__memory_snapshot.pkl", "volcengine+verl__mem.pickle"):
        a = analyze_snapshot_file(REAL_SNAPSHOTS / name)
        assert any("no trace entries" in w for w in a.warnings)
        assert all(s.counts.allocations == 0 for s in a.spaces)
    legacy = analyze_snapshot_file(
        REAL_SNAPSHOTS / "Yiyi-philosophy+LLM-inference__1.3b_snapshot.pickle"
    )
    assert extras(legacy.spaces[0])["snapshot_layout"].startswith("PyTorch 2.0")

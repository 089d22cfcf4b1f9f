"""``nsysfrag whatif``: request streams from snapshots and nsys exports, the JSON contract, the
ranking, a recommendation that follows from the numbers, every bad input, and the torch model's
validation against each genuine snapshot in ../shared/real_snapshots."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from nsysfrag.allocators import Policy, parse_policy
from nsysfrag.analysis import State
from nsysfrag.analysis.metrics import Health
from nsysfrag.cli import cli
from nsysfrag.inputs.torch_snapshot.reader import read_snapshot
from nsysfrag.testing.nsys_export import FREE, Gpu, MemoryRow
from nsysfrag.whatif import (
    PolicyOutcome,
    matched_in_order,
    rank_key,
    recommend,
    validate_snapshot,
    whatif,
)
from tests.conftest import BASE, REPO, SAMPLES, MakeTrace, MiB

REAL_SNAPSHOTS = REPO.parent / "shared" / "real_snapshots"
REAL = (
    sorted(p for p in REAL_SNAPSHOTS.glob("*") if p.suffix in (".pickle", ".pkl"))
    if REAL_SNAPSHOTS.is_dir()
    else []
)
needs_real = pytest.mark.skipif(not REAL, reason="../shared/real_snapshots is absent")
KiB, GiB = 1 << 10, 1 << 30
POLICY_KEYS = {
    "policy", "options", "peak", "max", "final", "health", "internal_frag",
    "peak_reserved_bytes", "peak_requested_bytes", "simulated_ooms", "first_oom_time_ns",
    "largest_free_at_oom_bytes", "reserved_over_requested_at_peak",
    "max_reserved_over_max_requested", "rank", "baseline",
}  # fmt: skip
STATE_KEYS = {"time_ns", "global_frag", "local_frag", "free_blocks", "largest_free_bytes",
              "free_bytes", "live_bytes"}  # fmt: skip


def run(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "nsysfrag", *args], check=False,
                          capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "120"})  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["whatif", *args], env={"COLUMNS": "120"})


def event(action: str, addr: int, size: int, t: int, stream: int = 0, **extra: Any) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": 1_000_000 + t, "frames": [], **extra}  # fmt: skip


def snapshot(tmp_path: Path, *traces: list[dict[str, Any]], name: str = "snap.pickle", **top: Any) -> Path:
    path = tmp_path / name
    data = {"segments": [], "device_traces": list(traces), **top}
    path.write_bytes(pickle.dumps(data, protocol=4))
    return path


# A 60 MiB block is freed, 30 MiB and 10 MiB are carved from its cached segment, the 30 MiB goes
# again, and 50 MiB is asked for: on a 100 MiB device the native allocator cannot release its
# split segment (simulated OOM); expandable segments and the heaps can.
FRAGMENTING = [
    event("alloc", 0x1000_0000, 60 * MiB, 1),
    event("free_completed", 0x1000_0000, 60 * MiB, 2),
    event("alloc", 0x1000_0000, 30 * MiB, 3),
    event("alloc", 0x1000_0000 + 30 * MiB, 10 * MiB, 4),
    event("free_completed", 0x1000_0000, 30 * MiB, 5),
    event("alloc", 0x2000_0000, 50 * MiB, 6),
]


# --------------------------------------------------------------------------------- the CLI


def test_help_has_an_example() -> None:
    result = CliRunner().invoke(cli, ["whatif", "--help"])
    assert result.exit_code == 0 and "Example:" in result.output
    assert "nsysfrag whatif snap.pickle" in result.output


def test_terminal_report_ranks_every_default_policy() -> None:
    result = invoke(str(SAMPLES / "training_loop.sqlite"))
    assert result.exit_code == 0, result.output
    out = result.output
    for name in ("torch", "torch:expandable_segments=True", "cuda-async", "best-fit",
                 "first-fit", "buddy", "slab", "Recommendation:", "driver-level"):  # fmt: skip
        assert name in out, name


def test_json_contract(tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    result = invoke(str(SAMPLES / "training_loop.sqlite"), "--json", str(out), "-q",
                    "--policy", "torch:expandable_segments=True", "--policy", "best-fit")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output == ""
    doc = json.loads(out.read_text())
    assert doc["schema"] == "nsysfrag-whatif/1"
    assert doc["input"]["kind"] == "nsys-trace" and "driver-level" in doc["input"]["request_level"]
    (space,) = doc["spaces"]
    assert space["capacity_bytes"] == 85_899_345_920
    names = [p["policy"] for p in space["policies"]]
    # the baseline (PyTorch's defaults) is added to the two asked for
    assert sorted(names) == ["best-fit", "torch", "torch:expandable_segments=True"]
    assert space["ranking"] == names and space["baseline"] == "torch"
    for p in space["policies"]:
        assert POLICY_KEYS <= set(p), POLICY_KEYS - set(p)
        assert set(p["peak"]) == STATE_KEYS == set(p["final"])
        assert set(p["max"]) == {"global_frag", "local_frag", "free_blocks", "live_bytes"}
        assert p["health"] in ("ok", "warn", "critical")
        assert p["peak_reserved_bytes"] >= p["peak_requested_bytes"] > 0
        assert 0 <= p["peak"]["global_frag"] <= 1 and 0 <= p["max"]["local_frag"] <= 1
        assert p["simulated_ooms"] == 0 and p["first_oom_time_ns"] is None
    expandable = next(p for p in space["policies"] if p["policy"].startswith("torch:"))
    assert expandable["options"]["expandable_segments"] is True
    assert expandable["alloc_conf"] == "expandable_segments:True"
    assert [p["rank"] for p in space["policies"]] == [1, 2, 3]


def test_json_to_stdout_replaces_the_terminal_report() -> None:
    code, out, err = run("whatif", str(SAMPLES / "training_loop.sqlite"), "--json", "-",
                         "--policy", "best-fit")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["spaces"][0]["policies"]


def test_ranking_is_fewest_ooms_then_least_peak_reserved(tmp_path: Path) -> None:
    path = snapshot(tmp_path, FRAGMENTING)
    report = whatif(path, capacity=100 * MiB)
    (space,) = report.spaces
    keys = [rank_key(o) for o in space.outcomes]
    assert keys == sorted(keys)
    by_name = {o.name: o for o in space.outcomes}
    assert by_name["torch"].simulated_ooms == 1
    assert by_name["torch:expandable_segments=True"].simulated_ooms == 0
    assert space.outcomes[-1].simulated_ooms >= 1


def test_recommendation_follows_from_the_numbers(tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    path = snapshot(tmp_path, FRAGMENTING)
    result = invoke(str(path), "--capacity", "100MiB", "--json", str(out), "-q")
    assert result.exit_code == 0, result.output
    space = json.loads(out.read_text())["spaces"][0]
    rec = space["recommendation"]
    policies = {p["policy"]: p for p in space["policies"]}
    base, best = policies[rec["baseline"]], policies[rec["policy"]]
    # the recommended policy is the best one a PyTorch user can switch to
    switchable = [p for p in space["policies"] if p["alloc_conf"] is not None]
    assert best is min(switchable, key=lambda p: (p["simulated_ooms"], p["peak_reserved_bytes"]))
    assert best["simulated_ooms"] == 0 and base["simulated_ooms"] == 1
    # and the sentence quotes those very numbers
    text = rec["text"]
    mib = lambda b: f"{b / MiB:.1f}"
    assert f"peak reserved {mib(base['peak_reserved_bytes'])} → {mib(best['peak_reserved_bytes'])} MiB" in text
    change = (best["peak_reserved_bytes"] - base["peak_reserved_bytes"]) / base["peak_reserved_bytes"]
    assert f"{abs(change) * 100:.0f} %" in text and rec["peak_reserved_change"] == pytest.approx(change)
    assert "no simulated OOM at 100 MiB (vs 1 with torch)" in text
    assert text.endswith(f"set PYTORCH_CUDA_ALLOC_CONF={best['alloc_conf']}")


def test_expandable_segments_recommended_over_a_backend_switch_when_equal(tmp_path: Path) -> None:
    path = snapshot(tmp_path, FRAGMENTING)
    report = whatif(path, ["torch", "torch:expandable_segments=True"], capacity=100 * MiB)
    rec = report.spaces[0].recommendation
    assert rec.policy == "torch:expandable_segments=True"
    assert rec.text.startswith("expandable_segments:True: peak reserved 60.0 → 100.0 MiB (+67 %)")
    assert rec.text.endswith("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def _outcome(name: str, peak: int, ooms: int = 0, baseline: bool = False) -> PolicyOutcome:
    s = State(0, 0.0, 0.0, 0, 0, 0, 0)
    return PolicyOutcome(
        parse_policy(name), baseline, s, s, 0.0, 0.0, 0, 0, Health.OK, 0.0, 0.0, peak, peak,
        peak, 1.0, 1.0, ooms, None, [], [], [], 0.0,
    )  # fmt: skip


def test_keep_the_baseline_when_nothing_is_1_percent_better() -> None:
    outcomes = [_outcome("torch", 1000 * MiB, baseline=True),
                _outcome("torch:expandable_segments=True", 995 * MiB),
                _outcome("best-fit", 900 * MiB)]  # fmt: skip
    rec = recommend(outcomes, 80 * GiB)
    assert rec.policy is None
    assert rec.text.startswith("Keep torch: no allocator setting tried lowers peak reserved by 1 %")
    assert "no simulated OOM at 80 GiB" in rec.text
    # the reference models are quoted for scale, not recommended
    assert rec.reference is not None and "the best-fit reference model peaks at 900.00 MiB" in rec.reference


def test_fewer_ooms_beat_a_lower_peak() -> None:
    outcomes = [_outcome("torch", 50 * GiB, ooms=3, baseline=True),
                _outcome("torch:max_split_size_mb=128", 48 * GiB, ooms=2),
                _outcome("torch:expandable_segments=True", 60 * GiB, ooms=0)]  # fmt: skip
    rec = recommend(outcomes, 64 * GiB)
    assert rec.policy == "torch:expandable_segments=True"
    assert "peak reserved 50.0 → 60.0 GiB (+20 %), no simulated OOM at 64 GiB (vs 3 with torch)" in rec.text


def test_html_is_self_contained_and_escaped(tmp_path: Path) -> None:
    path = snapshot(tmp_path, FRAGMENTING, name="<script>x.pickle")
    out = tmp_path / "w.html"
    result = invoke(str(path), "--capacity", "100MiB", "--html", str(out), "-q", "--validate")
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "<style>" in page and "<svg" in page
    assert not re.search(r"(src|href)\s*=\s*[\"']?https?:", page) and "http" not in page
    assert "<script" not in page and "&lt;script&gt;x.pickle" in page
    assert "Recommendation." in page and "Validation" in page


def test_caching_allocator_segments_are_warned_about() -> None:
    result = invoke(str(SAMPLES / "caching_allocator.sqlite"), "--policy", "best-fit")
    assert result.exit_code == 0, result.output
    assert "caching allocator's segments" in result.output and "meaningless" in result.output
    assert "No recommendation" in result.output


def test_snapshot_stream_has_its_streams_initial_blocks_and_ooms(tmp_path: Path) -> None:
    # a block live before the window (freed in it), two streams, and a recorded OOM
    trace = [
        event("free_completed", 0x5000, 3 * MiB, 0),
        event("alloc", 0x1000_0000, 4 * MiB, 1, stream=7),
        event("alloc", 0x2000_0000, 4 * MiB, 2, stream=9),
        event("oom", 0, 100 * GiB, 3, device_free=1 * GiB),
        event("free_completed", 0x1000_0000, 4 * MiB, 4, stream=7),
    ]
    report = whatif(snapshot(tmp_path, trace), ["best-fit"])
    (space,) = report.spaces
    # streams: the old block's (default: it lies in no segment the snapshot shows), 7 and 9
    assert space.requests == 4 and space.frees == 3 and space.streams == 3
    # the capacity comes from the OOM: reserved then (nothing) + free device memory
    assert space.capacity_bytes == 1 * GiB and "OOM" in space.capacity_source
    by_name = {o.name: o for o in space.outcomes}
    assert by_name["best-fit"].simulated_ooms == 1 and by_name["torch"].simulated_ooms == 1


def test_one_space_per_snapshot_device(tmp_path: Path) -> None:
    t0 = [event("alloc", 0x1000, MiB, 1)]
    t1 = [event("alloc", 0x1000, 2 * MiB, 1), event("free_completed", 0x1000, 2 * MiB, 2)]
    report = whatif(snapshot(tmp_path, t0, t1), ["best-fit"])
    assert [s.device for s in report.spaces] == [0, 1]
    assert report.spaces[0].capacity_bytes == 80 * GiB and "assumed" in report.spaces[0].capacity_source


def test_nsys_lifetimes_follow_the_observed_model(tmp_path: Path, make_trace: MakeTrace) -> None:
    # a free, an unmatched free, and an allocation over a live block (its free went missing)
    rows = [
        MemoryRow(1, 1, 0, BASE, 4 * MiB),
        MemoryRow(2, 1, 0, BASE + 8 * MiB, 4 * MiB),
        MemoryRow(3, 1, 0, BASE, 0, op=FREE),
        MemoryRow(4, 1, 0, BASE + 99 * MiB, 0, op=FREE),
        MemoryRow(5, 1, 0, BASE + 6 * MiB, 4 * MiB),  # overlaps the block at +8 MiB
    ]
    report = whatif(make_trace(rows, gpus=[Gpu(0, total_memory=64 * MiB)]), ["best-fit"])
    (space,) = report.spaces
    assert space.requests == 3 and space.frees == 2
    best = next(o for o in space.outcomes if o.name == "best-fit")
    assert best.peak_requested_bytes == 8 * MiB and best.final.live_bytes == 4 * MiB


# ---------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "tcmalloc"], "unknown policy"),
        (["--policy", "torch:expandable_segments=maybe"], "True or False"),
        (["--policy", "best-fit:x=1"], "takes no options"),
        (["--validate"], "--validate needs a PyTorch memory snapshot"),
        (["--json", "/no/such/folder/w.json"], "does not exist"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(args: list[str], message: str) -> None:
    code, out, err = run("whatif", str(SAMPLES / "training_loop.sqlite"), *args)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("case", ["missing", "empty", "not_a_pickle", "wrong_shape", "no_memory"])
def test_bad_inputs_are_one_line_exit_2(tmp_path: Path, make_trace: MakeTrace, case: str) -> None:
    if case == "missing":
        path = tmp_path / "none.pickle"
    elif case == "empty":
        path = tmp_path / "e.pickle"
        path.write_bytes(b"")
    elif case == "not_a_pickle":
        path = tmp_path / "t.pickle"
        path.write_text("hello")
    elif case == "wrong_shape":
        path = tmp_path / "w.pickle"
        path.write_bytes(pickle.dumps({"hello": 1}))
    else:
        path = make_trace([MemoryRow(1, 1, 0, BASE, MiB)])
        path.unlink()
        path.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    code, out, err = run("whatif", str(path))
    assert code == 2 and out == "" and err.startswith("nsysfrag: error:")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_capacity_must_be_a_size() -> None:
    code, _, err = run("whatif", str(SAMPLES / "training_loop.sqlite"), "--capacity", "lots")
    assert code == 2 and "not a size" in err


def test_a_snapshot_with_nothing_to_replay_says_so(tmp_path: Path) -> None:
    code, _, err = run("whatif", str(snapshot(tmp_path, [])))
    assert code == 2 and "no allocation to replay" in err


# ------------------------------------------------------------------------------ validation


def test_lcs_counts_sizes_in_the_same_order() -> None:
    assert matched_in_order([1, 2, 3, 4], [1, 3, 2, 4]) == 3
    assert matched_in_order([5, 5, 5], [5, 5]) == 2
    assert matched_in_order([], [1]) == 0


def test_validation_json_keys_on_a_sample(tmp_path: Path) -> None:
    out = tmp_path / "v.json"
    result = invoke(str(SAMPLES / "inference_snapshot.pickle"), "--validate", "--json", str(out),
                    "-q", "--policy", "torch")  # fmt: skip
    assert result.exit_code == 0, result.output
    v = json.loads(out.read_text())["validation"]
    for key in ("segment_alloc_match", "peak_reserved_simulated_bytes", "peak_reserved_recorded_bytes"):
        assert key in v
    assert v["segment_alloc_match"] >= 0.95 and v["meets_target"] is True
    (device,) = v["devices"]
    assert device["recorded_segment_allocs"] > 0 and device["recorded_oom_paths"] >= 1


def test_validation_detects_the_wrong_model() -> None:
    # the same requests through a torch model with power-of-two rounding: far fewer matches
    from nsysfrag.allocators.torch_caching import TorchConfig
    from nsysfrag.whatif import _validate_device

    snap = read_snapshot(SAMPLES / "inference_snapshot.pickle")
    right = _validate_device(snap, 0, TorchConfig())
    wrong = _validate_device(snap, 0, TorchConfig.parse("roundup_power2_divisions=2"))
    assert right is not None and wrong is not None
    assert right.segment_alloc_match == 1.0
    assert wrong.segment_alloc_match is not None and wrong.segment_alloc_match < right.segment_alloc_match


def _has_segment_events(path: Path) -> bool:
    snap = read_snapshot(path)
    return any(e.action in ("segment_alloc", "segment_map") for t in snap.histories.values() for e in t)


@needs_real
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name[:40])
def test_real_snapshot_validates(path: Path) -> None:
    """The target: >= 95 % of recorded segment allocations reproduced in order and the peak
    reserved within 1 %, on every genuine snapshot with segment events."""
    v = validate_snapshot(read_snapshot(path))
    if not _has_segment_events(path):
        assert v.segment_alloc_match is None or v.recorded == 0
        return
    assert v.segment_alloc_match is not None and v.segment_alloc_match >= 0.95, v
    assert v.peak_error is not None and abs(v.peak_error) <= 0.01, v
    assert v.meets_target


@needs_real
def test_real_snapshot_whatif_runs_every_policy(tmp_path: Path) -> None:
    path = REAL_SNAPSHOTS / "kkaitlyn111+cs336-a2-systems__memory_files__memory_ctx256_forward_.pickle"
    if not path.exists():
        pytest.skip("snapshot absent")
    out = tmp_path / "w.json"
    result = invoke(str(path), "--validate", "--json", str(out), "-q")
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["validation"]["segment_alloc_match"] >= 0.95
    (space,) = doc["spaces"]
    assert len(space["policies"]) == 7
    assert space["recorded_peak_reserved_bytes"] == doc["validation"]["peak_reserved_recorded_bytes"]


def test_policy_objects_compare_by_effective_settings() -> None:
    a = parse_policy("torch:expandable_segments=True")
    b = parse_policy("torch:expandable_segments:True")
    assert a.torch == b.torch and isinstance(a, Policy)


def test_an_impossible_request_size_is_one_line_exit_2(tmp_path: Path) -> None:
    path = snapshot(tmp_path, [event("alloc", 0x1000, 1 << 60, 1)])
    code, _, err = run("whatif", str(path))
    assert code == 2 and "cannot be replayed" in err and len(err.strip().splitlines()) == 1


def test_warnings_of_several_spaces_are_one_stderr_line(make_trace: MakeTrace) -> None:
    # Two processes whose every allocation is a whole 2 MiB segment: each space is warned
    # about, and stderr still holds one line (a CI log reads one line per run).
    rows = [MemoryRow(1 + pid, pid, 0, BASE + pid * 64 * MiB, 2 * MiB) for pid in (1, 2)]
    code, _, stderr = run("whatif", str(make_trace(rows)), "--policy", "best-fit")
    assert code == 0, stderr
    (line,) = stderr.splitlines()
    assert line.startswith("nsysfrag: warning: ") and line.count("caching allocator") == 2
    assert "process 1" in line and "process 2" in line

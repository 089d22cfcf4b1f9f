"""``nsysfrag record -- python launch.py train.py``: two ranks on the fake torch, end to end.

Rank 1 runs into a fragmentation OOM and exits 1; the launcher (as torchrun) then ends rank 0
with SIGTERM. The record must hold both ranks, the OOM snapshot, the alerts, the device's size,
and the command's exit code; its snapshots must pass every check a genuine snapshot passes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nsysfrag.inputs.torch_snapshot.unpickle import load_plain_pickle
from nsysfrag.reporters.job import heatmap
from nsysfrag.record.layout import rank_folders
from nsysfrag.record.rating import rate_state
from tests.conftest import REPO
from tests.record_helpers import LAUNCH, TRAIN, GiB, Run, fake_env, jsonl, record, warnings_of
from tests.test_snapshot import test_real_snapshot_analyzes as check_like_a_real_snapshot
from tests.test_snapshot_columns import test_columns_hold_what_the_records_hold as check_columns


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run, dict[str, Any]]:
    base = tmp_path_factory.mktemp("record")
    out = base / "rec"
    run = record(
        # A state snapshot of the fake costs far more than PyTorch's (its allocator is Python):
        # a larger budget lets rank 1's fragmented state be rated before its OOM.
        out, "--interval", "1", "--state-budget", "1", "--json", str(base / "job.json"),
        "--html", str(base / "job.html"),
        "--", sys.executable, str(LAUNCH), str(TRAIN),
        env=fake_env(
            FAKE_TORCH_GPUS="2", FAKE_TORCH_DEVICE_MEMORY=str(DEVICE), STEPS="30", STEP_S="0.5",
            HOLD_S="4",
        ),
    )  # fmt: skip
    return out, run, json.loads((base / "job.json").read_text())


DEVICE = 4 * GiB
# The line of train.py whose tensors pin rank 1's segments.
PINNING_LINE = next(
    n for n, line in enumerate(TRAIN.read_text().splitlines(), 1) if "blocks = [torch.empty" in line
)


def rank_doc(doc: dict[str, Any], rank: int) -> dict[str, Any]:
    return next(e["analysis"] for e in doc["ranks"] if e["rank"] == rank)


def test_the_command_exit_code_is_kept(job: tuple[Path, Run, dict[str, Any]]) -> None:
    _, run, _ = job
    assert run.code == 1, run.err  # the launcher's, as torchrun's: a rank failed
    assert "nsysfrag: the command exited with code 1" in run.err
    assert "torch.cuda.OutOfMemoryError: CUDA out of memory" in run.err  # the program's own
    assert warnings_of(run.err) == []


def test_each_rank_has_its_folder_and_the_failing_rank_its_oom_snapshot(
    job: tuple[Path, Run, dict[str, Any]],
) -> None:
    out, _, _ = job
    ranks = {r.rank: r for r in rank_folders(out)}
    assert sorted(ranks) == [0, 1]
    assert [p.name for p in ranks[1].ooms] == ["oom-1.pickle"] and ranks[0].ooms == ()
    oom_facts = json.loads((ranks[1].path / "oom-1.device.json").read_text())
    assert oom_facts["reason"] == "oom" and oom_facts["rank"] == 1 and oom_facts["world_size"] == 2
    assert oom_facts["oom"]["requested_bytes"] == 1 * GiB
    assert oom_facts["devices"][1]["total_memory_bytes"] == DEVICE
    assert "memory_stats" in oom_facts["devices"][1] and "memory_stats" not in oom_facts["devices"][0]
    # Rank 0 was ended by the launcher's SIGTERM: its handler took the final snapshot.
    assert json.loads((ranks[0].path / "final.device.json").read_text())["reason"] == "SIGTERM"
    assert json.loads((ranks[1].path / "final.device.json").read_text())["reason"] == "exit"
    timeline = jsonl(ranks[1].timeline)
    assert [e["snapshot"] for e in timeline if e.get("event") == "oom"] == ["oom-1.pickle"]
    samples = [e for e in timeline if "event" not in e]
    assert samples and {e["device"] for e in samples} == {1}  # only the device it uses


def test_alert_lines_name_rank_metric_value_and_pinning_site(
    job: tuple[Path, Run, dict[str, Any]],
) -> None:
    out, run, _ = job
    alerts = [ln for ln in run.err.splitlines() if "ALERT" in ln]
    assert alerts and all(ln.startswith("nsysfrag: ALERT rank 1 cuda:1 at ") for ln in alerts)
    critical = [ln for ln in alerts if "global_frag" in ln and "(critical, ≥ 40%)" in ln]
    assert len(critical) == 1, alerts
    assert f"top pinning site record_workloads/train.py:{PINNING_LINE} <listcomp>" in critical[0]
    stored = jsonl(out / "rank1" / "alerts.jsonl")
    assert [a["message"] for a in stored] == [ln.removeprefix("nsysfrag: ") for ln in alerts]
    assert not (out / "rank0" / "alerts.jsonl").exists()
    # Live: rank 1's fragmented state was rated, and alerted, before its OOM.
    timeline = jsonl(out / "rank1" / "timeline.jsonl")
    oom_at = next(e["time_unix_ns"] for e in timeline if e.get("event") == "oom")
    (frag,) = [a for a in stored if a["metric"] == "global_frag" and a["level"] == "critical"]
    assert frag["time_unix_ns"] < oom_at


def test_the_report_rates_against_the_recorded_device_size(
    job: tuple[Path, Run, dict[str, Any]],
) -> None:
    _, _, doc = job
    for rank in (0, 1):
        analysis = rank_doc(doc, rank)
        (space,) = analysis["spaces"]
        assert not any("capacity" in w for w in analysis["trace"]["warnings"])
        if rank == 0:
            assert space["capacity_bytes"] == DEVICE and space["capacity_source"] == "device"
        else:  # its OOM shows what it could reach: all but the CUDA context (the fake's 512 MiB)
            assert space["capacity_bytes"] == DEVICE - 512 * (1 << 20)
            assert space["capacity_source"] == "oom"
            assert "what this process could reach then" in space["capacity_basis"]
    (oom,) = rank_doc(doc, 1)["spaces"][0]["ooms"]
    assert oom["verdict"] == "fragmentation" and oom["requested_bytes"] == 1 * GiB
    assert rank_doc(doc, 1)["spaces"][0]["health"] == "critical"
    assert rank_doc(doc, 0)["spaces"][0]["health"] == "ok"


def test_the_live_rating_is_the_analysis_of_the_same_state(
    job: tuple[Path, Run, dict[str, Any]],
) -> None:
    out, _, _ = job
    folder = next(r for r in rank_folders(out) if r.rank == 1)
    assert folder.state is not None
    rated = [r for r in jsonl(folder.path / "ratings.jsonl") if r["state"] == folder.state.name]
    done = subprocess.run(
        [sys.executable, "-m", "nsysfrag", "analyze", str(folder.state), "--json", "-"],
        capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    final = json.loads(done.stdout)["spaces"][0]["final"]
    (rating,) = rated
    for key in ("global_frag", "local_frag", "free_blocks", "stranded_bytes", "reserved_bytes"):
        assert rating[key] == final[key], key
    assert rating["global_frag"] >= 0.40
    # The same function, in this process, on the file: the same figures again.
    (again,) = rate_state(load_plain_pickle(folder.state), "s", {1: DEVICE}, 0)
    assert again.global_frag == rating["global_frag"]


def test_the_report_holds_the_sampled_timeline(job: tuple[Path, Run, dict[str, Any]]) -> None:
    _, run, doc = job
    recorded = rank_doc(doc, 1)["recorded"]
    assert recorded["folder"] == "rank1" and recorded["snapshot"] == "final.pickle"
    assert recorded["samples"] >= 2 and recorded["host"] and recorded["pid"]
    t = recorded["timeline"]
    assert len(t["time_ns"]) == recorded["samples"] and t["device"] == [1] * len(t["time_ns"])
    assert max(t["reserved_bytes"]) > 0.7 * DEVICE  # the fill: all but the context and 400 MiB
    assert max(recorded["ratings"]["global_frag"]) >= 0.40
    assert [o["snapshot"] for o in recorded["ooms"]] == ["oom-1.pickle"]
    assert {a["metric"] for a in recorded["alerts"]} >= {"global_frag"}
    assert "Recorded live (nsysfrag record):" in run.out
    said = " ".join(run.out.split())
    assert "rank 1 · " in said and "snapshots oom-1.pickle" in said
    assert re.search(r"longest pause \d+\.\d ms \(mean \d+\.\d\d ms\)", said)
    assert all(len(line) <= 80 for line in run.out.splitlines())


def test_the_heatmap_rows_take_the_live_ratings(job: tuple[Path, Run, dict[str, Any]]) -> None:
    out, _, doc = job
    rows, span = heatmap.heat_rows(doc["ranks"])
    row = next(r for r in rows if r.rank == 1)
    ratings = rank_doc(doc, 1)["recorded"]["ratings"]
    assert row.peak == max(rank_doc(doc, 1)["spaces"][0]["peak"]["global_frag"], *ratings["global_frag"])
    assert span >= ratings["time_ns"][-1] - ratings["time_ns"][0]
    page = (out.parent / "job.html").read_text()
    assert "global fragmentation by rank over time" in page and "rank 1" in page


def test_analyze_reads_the_record_folder_later(job: tuple[Path, Run, dict[str, Any]]) -> None:
    out, _, doc = job
    done = subprocess.run(
        [sys.executable, "-m", "nsysfrag", "analyze", str(out), "--json", "-"],
        capture_output=True, text=True, check=False, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    again = json.loads(done.stdout)
    assert [e["rank"] for e in again["ranks"]] == [0, 1]
    for rank in (0, 1):
        assert rank_doc(again, rank)["spaces"] == rank_doc(doc, rank)["spaces"]
        assert rank_doc(again, rank)["recorded"] == rank_doc(doc, rank)["recorded"]


@pytest.mark.parametrize("which", ["rank0/final", "rank1/final", "rank1/oom-1", "rank1/state"])
def test_the_record_snapshots_pass_the_checks_of_genuine_ones(
    job: tuple[Path, Run, dict[str, Any]], which: str
) -> None:
    out, _, _ = job
    folder, name = which.split("/")
    path = (
        next(r.state for r in rank_folders(out) if r.path.name == folder)
        if name == "state"
        else out / folder / f"{name}.pickle"
    )
    assert path is not None and path.is_file()
    check_like_a_real_snapshot(path)
    check_columns(path)


# What varies from run to run in the lines docs/record.md shows: clock times, durations, and
# the number of samples and alerts that fit in them.
_TIMING = re.compile(r"\d\d:\d\d:\d\d|\+?\d+(\.\d+)? m?s\b|\d+ (samples|alerts)\b")


@pytest.mark.parametrize("page", ["docs/record.md", "README.md"])
def test_docs_record_page_shows_this_job_as_it_prints(
    job: tuple[Path, Run, dict[str, Any]], page: str
) -> None:
    """The record's report as docs/record.md and README show it (README's ```text blocks are
    the record's only) is what this job prints, but for its timings."""
    _, run, _ = job
    text = (REPO / page).read_text(encoding="utf-8")
    shown = [ln for block in re.findall(r"```text\n(.*?)```", text, re.DOTALL) for ln in block.splitlines()]
    assert len(shown) >= 5
    printed = {_TIMING.sub("#", ln.rstrip()) for ln in (run.out + run.err).splitlines()}
    missing = [ln for ln in shown if ln != "…" and _TIMING.sub("#", ln.rstrip()) not in printed]
    assert not missing, f"{page} shows lines this job does not print:\n" + "\n".join(missing) + (
        "\n--- it prints:\n" + run.out + run.err
    )

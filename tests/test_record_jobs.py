"""``nsysfrag record`` on jobs as people start them, each a real run on the fake torch: an
``mp.spawn`` job without ``RANK``, processes sharing a device, torchrun's restarts, two hosts
writing into one folder, launcher variables that are no rank, links planted in a record
folder, a command that cannot start, and a second run over a folder where nothing was recorded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nsysfrag.record.layout import job_inputs, rank_folders
from tests.record_helpers import REPO, WORKLOADS, fake_env, jsonl, record

PY = sys.executable
SPAWN = WORKLOADS / "spawn.py"
RESTARTS = WORKLOADS / "restarts.py"
ALLOC = "import torch; x = torch.empty(1 << 20, dtype=torch.uint8, device='cuda')"


def named_by(folder: Path) -> tuple[Any, Any]:
    about = json.loads((folder / "process.json").read_text())
    return about["rank"], about["named_by"]


def test_an_mp_spawn_job_without_rank_gives_each_process_its_device(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    run = record(out, "--json", str(tmp_path / "job.json"), "--", PY, str(SPAWN), "4",
                 env=fake_env(FAKE_TORCH_GPUS="4"))  # fmt: skip
    assert run.code == 0, run.err
    folders = rank_folders(out)
    assert [r.path.name for r in folders] == ["rank0", "rank1", "rank2", "rank3"]
    assert [named_by(r.path) for r in folders] == [(d, "device") for d in range(4)]
    doc = json.loads((tmp_path / "job.json").read_text())
    ranks = {e["rank"]: e["analysis"] for e in doc["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, analysis in ranks.items():
        assert analysis["recorded"]["named_by"] == "device"
        # Each process allocated (rank + 1) x 8 MiB on its own device: the job did not mix them up.
        (space,) = analysis["spaces"]
        assert space["device"] == rank
        assert space["allocated_bytes_peak"] == (rank + 1) * 8 << 20
    assert "rank 2 (by its device)" in " ".join(run.out.split())


def test_processes_sharing_a_device_without_rank_are_named_by_pid(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    run = record(out, "--", PY, str(SPAWN), "2", "1", env=fake_env(FAKE_TORCH_GPUS="1"))
    assert run.code == 0, run.err
    first, second = rank_folders(out)
    assert first.path.name == "rank0" and named_by(first.path) == (0, "device")
    assert second.path.name.startswith("pid") and named_by(second.path) == (None, "pid")
    inputs, notes = job_inputs(out)
    assert [rank for _, rank in inputs] == [0, 1]  # both analyzed: the pid one after rank 0
    assert any(second.path.name in n and "rank 1 of this job" in n for n in notes)


def test_a_torchrun_restart_is_an_attempt_of_its_rank_not_a_stray(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    run = record(out, "--json", str(tmp_path / "job.json"), "--", PY, str(RESTARTS))
    assert run.code == 0, run.err
    assert [(r.rank, r.attempt, r.pid_suffix) for r in rank_folders(out)] == [(0, 0, None), (0, 1, None)]
    assert [r.path.name for r in rank_folders(out)] == ["rank0", "rank0-attempt1"]
    inputs, notes = job_inputs(out)
    assert inputs == [(out / "rank0-attempt1" / "final.pickle", 0)]
    assert any("rank 0 was restarted: attempt 0 (rank0)" in n for n in notes)
    doc = json.loads((tmp_path / "job.json").read_text())
    (entry,) = doc["ranks"]
    assert entry["analysis"]["recorded"]["attempt"] == 1
    assert entry["analysis"]["spaces"][0]["allocated_bytes_peak"] == 16 << 20


def _on_host(host: str, out: Path, *args: str, rank: str) -> subprocess.CompletedProcess[str]:
    """``nsysfrag record`` as host ``host`` (a UTS namespace of its own, renamed)."""
    env = fake_env(RANK=rank, WORLD_SIZE="2")
    inner = [PY, "-m", "nsysfrag", "record", "-o", str(out), *args, "--", PY, "-c", ALLOC]
    script = f'hostname {host} && exec "$@"'
    return subprocess.run(["unshare", "--uts", "sh", "-c", script, "sh", *inner], env=env,
                          capture_output=True, text=True, timeout=120, check=False, cwd=REPO)  # fmt: skip


@pytest.fixture
def two_hosts() -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here to play a second host")
    probe = subprocess.run(["unshare", "--uts", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"unshare --uts is refused here ({probe.stderr.decode().strip()[:80]})")


@pytest.mark.usefixtures("two_hosts")
def test_two_hosts_share_one_folder_and_overwrite_only_their_own(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    a = _on_host("node-a", out, rank="0")
    b = _on_host("node-b", out, rank="1")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert [r.path.name for r in rank_folders(out)] == ["rank0", "rank1"]
    hosts = [json.loads((r.process).read_text())["host"] for r in rank_folders(out)]
    assert hosts == ["node-a", "node-b"]
    assert json.loads((out / "record.json").read_text())["host"] == "node-a"
    assert json.loads((out / "record-node-b.json").read_text())["status"] == "ended"
    # Again on node-a: its own rank is a record to protect; node-b's is not its to clear.
    again = _on_host("node-a", out, rank="0")
    assert again.returncode == 2 and "already holds a record of this host" in again.stderr
    b_final = (out / "rank1" / "final.pickle").stat().st_mtime_ns
    again = _on_host("node-a", out, "--overwrite", rank="0")
    assert again.returncode == 0, again.stderr
    assert [r.path.name for r in rank_folders(out)] == ["rank0", "rank1"]
    assert (out / "rank1" / "final.pickle").stat().st_mtime_ns == b_final
    assert "2 ranks" in " ".join(again.stdout.split())  # the job report reads both hosts


@pytest.mark.parametrize(("value", "folder"), [("0000000001", "rank1"), ("\u00b2", "rank0"),
                                               (" 7 ", "rank7"), ("-1", "rank0")])  # fmt: skip
def test_a_launcher_rank_is_a_number_or_no_rank(tmp_path: Path, value: str, folder: str) -> None:
    out = tmp_path / "rec"
    run = record(out, "--", PY, "-c", ALLOC, env=fake_env(RANK=value))
    assert run.code == 0, run.err
    assert "none initialized CUDA" not in run.err and "warning" not in run.err
    (rank,) = rank_folders(out)
    assert rank.path.name == folder and rank.final is not None
    by = "RANK" if folder != "rank0" else "device"
    assert named_by(rank.path)[1] == by


def test_links_planted_in_a_record_are_never_followed(tmp_path: Path) -> None:
    out, outside = tmp_path / "rec", tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("mine")
    assert record(out, "--", PY, "-c", ALLOC, env=fake_env(RANK="0")).code == 0
    # Links at every name a run writes: the marker, its old temporary name, the processes log,
    # a rank folder the next run would take, and another that a reader would list.
    for name in ("record.json", ".record.json.part", "processes.jsonl"):
        (out / name).unlink(missing_ok=True)
        os.symlink(victim, out / name)
    shutil.rmtree(out / "rank0")
    os.symlink(outside, out / "rank0")
    os.symlink(outside, out / "rank9")
    listed = record(tmp_path / "elsewhere", "--", "true")  # a control: a fresh folder works
    assert listed.code == 0
    run = record(out, "--overwrite", "--", PY, "-c", ALLOC, env=fake_env(RANK="0"))
    assert run.code == 0, run.err
    assert victim.read_text() == "mine" and sorted(os.listdir(outside)) == ["victim.txt"]
    # Every link at a name a record uses is gone; the old temporary name is no longer one.
    assert [p.name for p in out.iterdir() if p.is_symlink()] == [".record.json.part"]
    assert json.loads((out / "record.json").read_text())["status"] == "ended"
    # A rank folder that is a link is refused when the record is read.
    os.symlink(outside, out / "rank3")
    analyzed = subprocess.run([PY, "-m", "nsysfrag", "analyze", str(out)], capture_output=True,
                              text=True, check=False, cwd=REPO)  # fmt: skip
    assert analyzed.returncode == 2 and "rank3: is a symbolic link" in analyzed.stderr
    assert "Traceback" not in analyzed.stderr


def test_a_command_that_cannot_start_leaves_the_record_saying_so(tmp_path: Path) -> None:
    # Executable, but no program the kernel can start (no #! line, no ELF): exec fails.
    script = tmp_path / "not-a-program"
    script.write_bytes(b"\x00\x01garbage")
    script.chmod(0o755)
    out = tmp_path / "rec"
    run = record(out, "--", str(script))
    assert run.code == 2 and len(run.err.splitlines()) == 1, run.err
    marker = json.loads((out / "record.json").read_text())
    assert marker["status"] == "not started" and "cannot run it" in marker["error"]


def test_a_folder_where_nothing_was_recorded_takes_the_next_run(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    for _ in range(2):
        run = record(out, "--", PY, "-c", "print(1)")
        assert run.code == 0 and run.out == "1\n", run.err
        assert "nothing was recorded" in run.err and "--overwrite" not in run.err
    assert jsonl(out / "processes.jsonl")[0]["event"] == "python"
    assert len(jsonl(out / "processes.jsonl")) == 1  # the first run's line was cleared with it

"""``from nsysfrag.torch import monitor``: a program recording itself writes the folder that
``nsysfrag record`` writes, and each rated step is ``analyze``'s figures for that state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from nsysfrag.record.layout import rank_folders
from tests.record_helpers import REPO, WORKLOADS, fake_env, jsonl, record

PROGRAM = WORKLOADS / "monitored.py"


def run_monitored(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = fake_env()
    env["PYTHONPATH"] += os.pathsep + str(REPO)
    return subprocess.run(
        [sys.executable, str(PROGRAM), str(out), *extra], env=env, capture_output=True,
        text=True, check=False, timeout=120,
    )  # fmt: skip


def test_monitor_rates_every_nth_step_and_writes_a_record(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    done = run_monitored(out)
    assert done.returncode == 0, done.stderr
    steps = [json.loads(line) for line in done.stdout.splitlines()]
    assert [s["step"] for s in steps] == [1, 3, 5]
    frag = [s["ratings"][0]["global_frag"] for s in steps]
    assert frag == sorted(frag) and frag[-1] > frag[0]  # it only grows: a third stays each step
    assert all(s["ratings"][0]["capacity_source"] == "device" for s in steps)
    (rank,) = rank_folders(out)
    assert rank.final is not None and rank.state is not None
    rated = jsonl(rank.path / "ratings.jsonl")
    assert [r["global_frag"] for r in rated] == frag
    # The newest state, analyzed later from its file, has the figures step() returned.
    later = subprocess.run(
        [sys.executable, "-m", "nsysfrag", "analyze", str(rank.state), "--json", "-"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    final = json.loads(later.stdout)["spaces"][0]["final"]
    assert final["global_frag"] == frag[-1] and final["free_blocks"] == steps[-1]["ratings"][0]["free_blocks"]
    assert "ALERT rank 0 cuda:0" in done.stderr  # free_blocks rises past 100
    job = subprocess.run(
        [sys.executable, "-m", "nsysfrag", "analyze", str(out), "--json", "-"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert job.returncode == 0, job.stderr
    assert json.loads(job.stdout)["ranks"][0]["analysis"]["recorded"]["ratings"]["global_frag"] == frag


def test_monitor_step_obeys_the_budget_unless_forced(tmp_path: Path) -> None:
    # Six quick steps: the first state is taken; the next ones come far sooner than 1 % of the
    # time allows for what a state costs, so step() declines them (None) instead of stalling.
    done = run_monitored(tmp_path / "rec", "--budget")
    assert done.returncode == 0, done.stderr
    steps = [json.loads(line) for line in done.stdout.splitlines()]
    assert [s["step"] for s in steps] == [1]
    (rank,) = rank_folders(tmp_path / "rec")
    samples = jsonl(rank.timeline)
    assert sum(1 for s in samples if "state" in s) == 1 and len(samples) >= 3


def test_monitor_refuses_a_rank_already_recorded_unless_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    assert run_monitored(out).returncode == 0
    again = run_monitored(out)
    assert again.returncode != 0 and "already holds a record of this rank" in again.stderr
    assert run_monitored(out, "--overwrite").returncode == 0


def test_monitor_under_nsysfrag_record_leaves_the_recording_to_it(tmp_path: Path) -> None:
    env = fake_env()
    env["PYTHONPATH"] += os.pathsep + str(REPO)
    run = record(tmp_path / "rec", "--", sys.executable, str(PROGRAM), str(tmp_path / "own"), env=env)
    assert run.code == 0, run.err
    assert not (tmp_path / "own").exists()  # one recorder per process: the command's
    (rank,) = rank_folders(tmp_path / "rec")
    states = [e for e in jsonl(rank.timeline) if "state" in e]
    assert len(states) >= 3  # each 2nd step() sampled with a state snapshot


def test_monitor_defaults_are_the_recorders_own() -> None:
    # monitor spells out the recorder's options in its own signature (the bootstrap package is
    # copied alone into a recorded interpreter and cannot import nsysfrag to share them): the
    # two lists must not drift apart.
    import inspect

    from nsysfrag.record.bootstrap.nsysfrag_recorder.options import Options
    from nsysfrag.torch import monitor

    ours = inspect.signature(monitor).parameters
    recorder = inspect.signature(Options).parameters
    renamed = {"interval_s": "interval", "max_pause_s": "max_pause"}
    for name, option in recorder.items():
        assert ours[renamed.get(name, name)].default == option.default, name

"""``nsysfrag record`` held to what the GPU check (benchmarks/gpu/record_check.sh) observed.

Every truth file committed under ``sample_traces/record_truth/`` (the check's
``record_truth.json`` from a device) must keep the rules of benchmarks/gpu/record_truth_rules.py;
none is committed until the script has run on a GPU. Until then the script itself is proven
here, end to end, against the fake torch (a launcher of our own stands in for torchrun): every
check independent, each writing its file as it ends, a check past its limit written as such
while the next still run, and the rules failing on what they must refuse.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, SAMPLES
from tests.record_helpers import FAKE_TORCH, LAUNCH

SCRIPT = REPO / "benchmarks" / "gpu" / "record_check.sh"
CHECKS = REPO / "benchmarks" / "gpu" / "record_check.py"
TRUTHS = sorted((SAMPLES / "record_truth").glob("*.json"))
NAMES = ["torchrun_2", "spawn_2", "sigterm", "fraction", "entries_100k", "monitor_step"]


def _rules() -> Any:
    spec = importlib.util.spec_from_file_location("record_truth_rules", CHECKS.with_name("record_truth_rules.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(findings: Path, tmp: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("NSYSFRAG_RECORD", "FAKE_TORCH"))}
    env.update(PYTHONPATH=str(FAKE_TORCH), PYTHON=sys.executable, RECORD_CHECK_WORK=str(tmp / "work"),
               RECORD_CHECK_LAUNCHER=f"{sys.executable} {LAUNCH} --nproc 2",
               FAKE_TORCH_DEVICE_MEMORY=str(4 << 30), COLUMNS="100",
               RECORD_CHECK_MAX_PAUSE_S="0.5", **extra)  # fmt: skip
    return subprocess.run(["bash", str(SCRIPT), str(findings)], env=env, capture_output=True,
                          text=True, timeout=600, check=False, cwd=REPO)  # fmt: skip


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("record_check")
    return tmp / "findings", run_script(tmp / "findings", tmp)


def test_the_script_runs_every_check_on_the_fake_torch(fake_run: tuple[Path, Any]) -> None:
    findings, done = fake_run
    assert done.returncode == 0, done.stdout + done.stderr
    truth = json.loads((findings / "record_truth.json").read_text())
    assert list(truth["checks"]) == NAMES
    for name in NAMES:
        result = json.loads((findings / f"{name}.json").read_text())
        assert result["passed"] and result["problems"] == [], (name, result)
        assert result == truth["checks"][name]  # each file written as its check ended
    assert f"{NAMES[-1]}: passed" in (findings / "record_check.log").read_text()


def test_the_limits_fit_six_minutes() -> None:
    text = CHECKS.read_text()
    limits = [float(x) for x in re.findall(r'Check\("\w+", (\d+),', text)]
    assert len(limits) == len(NAMES) and sum(limits) <= 300
    (outer,) = re.findall(r"timeout -k 5 (\d+) ", SCRIPT.read_text())
    assert int(outer) + 5 <= 360


def test_a_check_past_its_limit_is_written_and_the_next_still_runs(tmp_path: Path) -> None:
    findings = tmp_path / "findings"
    done = run_script(findings, tmp_path, RECORD_CHECK_ONLY="entries_100k,fraction",
                      RECORD_CHECK_LIMITS="entries_100k=2")  # fmt: skip
    assert done.returncode == 1
    late = json.loads((findings / "entries_100k.json").read_text())
    assert late["timed_out"] is True and late["passed"] is False
    assert json.loads((findings / "fraction.json").read_text())["passed"] is True


def test_the_rules_refuse_what_record_must_not_do(fake_run: tuple[Path, Any]) -> None:
    findings, _ = fake_run
    rules = _rules()
    spawn = json.loads((findings / "spawn_2.json").read_text())["observed"]
    for r in spawn["ranks"][1:]:
        r["named_by"] = "device"  # both processes as one device's
    assert any("named by" in p for p in rules.problems("spawn_2", spawn))
    fraction = json.loads((findings / "fraction.json").read_text())["observed"]
    fraction["ranks"][1]["capacity_bytes"] = fraction["device_total_bytes"]  # the total won
    assert any("not the allowed" in p for p in rules.problems("fraction", fraction))
    step = json.loads((findings / "monitor_step.json").read_text())["observed"]
    step["longest_pause_s"] = 0.7
    assert rules.problems("monitor_step", step) == ["longest pause 0.7 s"]


@pytest.mark.skipif(not TRUTHS, reason="no GPU truth committed yet (run benchmarks/gpu/record_check.sh on a device)")
@pytest.mark.parametrize("truth", TRUTHS, ids=[p.name for p in TRUTHS])
def test_record_agrees_with_what_a_gpu_recorded(truth: Path) -> None:
    rules = _rules()
    data = json.loads(truth.read_text())
    for name, result in data["checks"].items():
        assert "observed" in result, f"{name} did not finish on the device"
        assert rules.problems(name, result["observed"]) == [], name

"""nsys that never answers (issue 25, item 6): every child runs under a limit, killed with its own.

The fake nsys's ``FAKE_NSYS_STALL`` makes one call never return: it ignores SIGINT and SIGTERM
and starts a helper that holds its output open, as a hung nsys with its daemons would. The run
must end in one line within the limit, with nsys and its helper gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.hostile.contract import run_nsysfrag
from tests.hostile.fake_nsys_runs import USING, fake_env, fake_report, nsys_calls


def _stalled(tmp_path: Path, call: str) -> dict[str, str]:
    return fake_env(tmp_path, FAKE_NSYS_STALL=call, FAKE_NSYS_STALL_PIDS=str(tmp_path / "pids"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead but not yet reaped by its parent (init, once we are gone).
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _stalled_pids(tmp_path: Path) -> list[int]:
    path = tmp_path / "pids"
    return [int(p) for line in path.read_text().splitlines() for p in line.split()] if path.exists() else []


def _all_gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_nsys_version_that_never_answers_is_killed_within_its_limit(tmp_path: Path) -> None:
    # main: `nsys --version` was waited on for 120 s (and its helper kept the pipe open)
    report = fake_report(tmp_path / "run.nsys-rep")
    started = time.monotonic()
    out = run_nsysfrag(["analyze", report, "-q"], inputs=[report], allowed_codes=(3,),
                       env={**_stalled(tmp_path, "version"), "NSYSFRAG_NSYS_QUERY_TIMEOUT": "2"})  # fmt: skip
    took = time.monotonic() - started
    assert "did not finish within 2 s and was killed" in out.stderr
    assert took < 12, took
    pids = _stalled_pids(tmp_path)
    assert len(pids) == 2 and _all_gone(pids)


def test_the_default_query_limit_fits_a_ci_step(tmp_path: Path) -> None:
    started = time.monotonic()
    out = run_nsysfrag(["profile", "-o", tmp_path / "p", "-q", "--", sys.executable, "-c", "0"],
                       allowed_codes=(3,), env=_stalled(tmp_path, "help"), notes=USING)  # fmt: skip
    assert "profile --help` did not finish within 10 s and was killed" in out.stderr
    assert time.monotonic() - started < 20
    assert _all_gone(_stalled_pids(tmp_path))


def test_an_export_that_never_returns_is_killed_at_nsys_timeout(tmp_path: Path) -> None:
    # main: nsysfrag waited for `nsys export` forever
    report = fake_report(tmp_path / "run.nsys-rep")
    started = time.monotonic()
    out = run_nsysfrag(["analyze", report, "-q", "--nsys-timeout", "2"], inputs=[report],
                       allowed_codes=(3,), env=_stalled(tmp_path, "export"), notes=USING)  # fmt: skip
    assert "`nsys export` did not finish within 2 s and was killed" in out.stderr
    assert "--nsys-timeout" in out.stderr
    assert time.monotonic() - started < 12
    assert _all_gone(_stalled_pids(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nsys.log", "pids", "run.nsys-rep"]


def test_nsys_timeout_comes_from_the_environment_too(tmp_path: Path) -> None:
    report = fake_report(tmp_path / "run.nsys-rep")
    out = run_nsysfrag(["analyze", report, "-q"], inputs=[report], allowed_codes=(3,),
                       env={**_stalled(tmp_path, "export"), "NSYSFRAG_NSYS_TIMEOUT": "1.5"},
                       notes=USING)  # fmt: skip
    assert "within 1.5 s" in out.stderr


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf", "soon"])
def test_a_bad_nsys_timeout_is_one_line(tmp_path: Path, value: str) -> None:
    report = fake_report(tmp_path / "run.nsys-rep")
    out = run_nsysfrag(["analyze", report, "--nsys-timeout", value], inputs=[report])
    assert out.returncode == 2 and "--nsys-timeout" in out.stderr
    assert nsys_calls(tmp_path) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_export_takes_nsys_and_its_helpers_with_it(
    tmp_path: Path, signum: int
) -> None:
    report = fake_report(tmp_path / "run.nsys-rep")
    env = {**os.environ, **_stalled(tmp_path, "export"), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "nsysfrag", "analyze", str(report), "-q"],
                            env=env, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 20
    while len(_stalled_pids(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = _stalled_pids(tmp_path)
    assert len(pids) == 2, "the export never started"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and err.rstrip().endswith("nsysfrag: interrupted"), err
    assert "Traceback" not in err
    assert _all_gone(pids)
    assert not any(p.name.startswith(".nsysfrag-") for p in tmp_path.iterdir())


def test_nsys_timeout_ends_a_recording_as_ctrl_c_would(tmp_path: Path) -> None:
    # FAKE_NSYS_HANG: `profile` waits for a signal, then writes its report (what nsys does).
    out = run_nsysfrag(
        ["profile", "-o", tmp_path / "run", "-q", "--nsys-timeout", "1", "--json",
         tmp_path / "run.json", "--", sys.executable, "-c", "0"],
        env=fake_env(tmp_path, FAKE_NSYS_HANG="1"), notes=(*USING, "nsysfrag: --nsys-timeout"),
    )  # fmt: skip
    assert out.returncode == 0 and '"schema": "nsysfrag/1"' in (tmp_path / "run.json").read_text()
    assert "--nsys-timeout (1 s) stopped the recording" in out.stderr
    assert (tmp_path / "run.nsys-rep").exists()

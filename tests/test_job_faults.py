"""A job's workers fail for real: one killed (as the out-of-memory killer does), Ctrl-C.

A worker is held by a named pipe (FIFO): opening one for reading blocks until a writer comes.
nsysfrag refuses a FIFO as an input (it would hang the job), so the job runs under a wrapper
of the pool's ``analyze_rank`` that first opens ``GATES/<input name>`` when that FIFO exists.
The test then finds the worker blocked in open and kills it, interrupts the whole job while
it waits, or lets it go on by writing to the gate.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import SAMPLES

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc to find the workers"
)


GATED_CLI = """
import os
from pathlib import Path

from nsysfrag.job import pool

analyze_rank = pool.analyze_rank


def gated(task):
    gate = Path(os.environ["NSYSFRAG_TEST_GATES"], Path(task.path).name)
    if gate.exists():
        with open(gate, "rb"):  # blocks until the test opens the gate for writing
            pass
    return analyze_rank(task)


pool.analyze_rank = gated  # the workers are forked from here: they run it too
from nsysfrag.cli import run

run()
"""


def _gate(folder: Path, name: str) -> Path:
    gates = folder.parent / "gates"
    gates.mkdir(exist_ok=True)
    os.mkfifo(gates / name)
    return gates / name


def _job(tmp_path: Path) -> Path:
    folder = tmp_path / "job"
    folder.mkdir()
    for rank, name in enumerate(("training_loop.sqlite", "inference_snapshot.pickle", "training_loop.sqlite")):
        shutil.copyfile(SAMPLES / name, folder / f"rank{rank}{Path(name).suffix}")
    _gate(folder, "rank2.sqlite")
    return folder


@contextmanager
def _running(folder: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``analyze FOLDER --jobs 2 ARGS`` started (its ranks gated, see above), and whatever is
    left of it killed after."""
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    env["NSYSFRAG_TEST_GATES"] = str(folder.parent / "gates")
    # A session of its own: every process the job starts carries its id, so none can hide.
    proc = subprocess.Popen(
        [sys.executable, "-c", GATED_CLI, "analyze", str(folder), "--jobs", "2", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=env,
    )  # fmt: skip
    try:
        yield proc
    finally:
        # Every process of the session, whatever its group (the pool's workers have groups of
        # their own): one left blocked on a gate would hold the pipes, and communicate() with
        # them, forever.
        for pid in [proc.pid, *_session(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.communicate(timeout=60)


def _opening(session: int) -> list[int]:
    """Processes of ``session`` blocked opening a FIFO: the kernel waits in ``wait_for_partner``
    (``fifo_open`` on older kernels); where ``wchan`` is hidden, a pending ``openat`` (x86-64:
    257, arm64: 56) tells the same, as nothing else in a worker blocks in open."""
    found = []
    for pid in _session(session):
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text()
            syscall = Path(f"/proc/{pid}/syscall").read_text().split()
        except OSError:
            continue
        if wchan in ("wait_for_partner", "fifo_open") or (
            wchan in ("", "0") and syscall[:1] in (["257"], ["56"])
        ):
            found.append(pid)
    return found


def _session(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == session and fields[0] != "Z":  # session id; zombies are gone
            members.append(int(entry.name))
    return members


def _wait_for(find: object, timeout: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = find()  # type: ignore[operator]
        if found:
            return list(found)
        time.sleep(0.1)
    raise AssertionError("timed out waiting for a worker")


def test_a_worker_killed_twice_fails_its_rank_and_the_job_goes_on(tmp_path: Path) -> None:
    folder = _job(tmp_path)
    out = tmp_path / "job.json"
    with _running(folder, "--json", str(out), "-q") as proc:
        killed = []
        for _ in range(2):  # the first attempt and the one retry
            victims = _wait_for(lambda: [p for p in _opening(proc.pid) if p not in killed])
            assert len(victims) == 1 and victims[0] != proc.pid
            os.kill(victims[0], signal.SIGKILL)
            killed.append(victims[0])
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr
    doc = json.loads(out.read_text())
    assert doc["failed_ranks"] == [2]
    assert [("analysis" in r) for r in doc["ranks"]] == [True, True, False]
    error = doc["ranks"][2]["error"]
    assert "killed by SIGKILL" in error and "again when retried" in error
    assert "nsysfrag: error: rank 2:" in stderr and "Traceback" not in stderr
    assert _session(proc.pid) == []


def test_a_worker_killed_once_is_retried_and_its_rank_analyzed(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copyfile(SAMPLES / "training_loop.sqlite", folder / "rank0.sqlite")
    snapshot = SAMPLES / "training_snapshot.pickle"
    shutil.copyfile(snapshot, folder / "rank1.pickle")
    gate = _gate(folder, "rank1.pickle")
    out = tmp_path / "job.json"
    with _running(folder, "--json", str(out), "-q") as proc:
        (first,) = _wait_for(lambda: _opening(proc.pid))
        os.kill(first, signal.SIGKILL)
        _wait_for(lambda: [p for p in _opening(proc.pid) if p != first])  # the retry, waiting
        with open(gate, "wb"):  # lets the retry go on
            pass
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    doc = json.loads(out.read_text())
    assert doc["failed_ranks"] == []
    alone = subprocess.run(
        [sys.executable, "-m", "nsysfrag", "analyze", str(snapshot), "--json", "-"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    expected = json.loads(alone.stdout)
    expected["trace"]["path"] = str(folder / "rank1.pickle")
    assert doc["ranks"][1]["analysis"] == expected


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_a_job_stops_every_worker(tmp_path: Path, sig: signal.Signals) -> None:
    folder = _job(tmp_path)
    with _running(folder, "-q") as proc:
        _wait_for(lambda: _opening(proc.pid))
        workers = [p for p in _session(proc.pid) if p != proc.pid]
        assert workers, "the pool has workers"
        os.kill(proc.pid, sig)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr
    if sig == signal.SIGINT:
        assert stderr.strip().endswith("nsysfrag: interrupted")
    time.sleep(0.2)
    assert _session(proc.pid) == [], "no process of the job is left"


def test_a_fifo_among_the_inputs_fails_its_rank_and_hangs_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copyfile(SAMPLES / "training_loop.sqlite", folder / "rank0.sqlite")
    os.mkfifo(folder / "rank1.sqlite")  # opening it would block until a writer comes
    out = tmp_path / "job.json"
    proc = subprocess.run(
        [sys.executable, "-m", "nsysfrag", "analyze", str(folder), "--json", str(out), "-q"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["failed_ranks"] == [1] and "analysis" in doc["ranks"][0]
    assert "FIFO" in doc["ranks"][1]["error"] and "rank 1:" in proc.stderr

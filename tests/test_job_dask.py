"""A job on a real dask.distributed cluster: a `dask scheduler` and a `dask worker`, separate
processes on loopback (random free ports, torn down after), as on a cluster with a shared
filesystem. The job's document must be the local pool's, byte for byte, and each rank the
document of its input alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.job_helpers import job_folder, run, single

pytest.importorskip("distributed", reason="the Dask path needs nsysfrag[dask]")

STARTUP_S = 120


def _dask(*args: str, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as sink:
        # A session of its own, so teardown reaches the worker's nanny and its child at once.
        return subprocess.Popen(
            [sys.executable, "-m", "dask", *args], cwd=cwd, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(scheduler address, scheduler file) of a scheduler with two single-threaded workers."""
    home = tmp_path_factory.mktemp("dask")
    scheduler_file = home / "scheduler.json"
    scheduler = _dask(
        "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
        "--scheduler-file", str(scheduler_file), cwd=home, log=home / "scheduler.log",
    )  # fmt: skip
    worker = None
    try:
        deadline = time.monotonic() + STARTUP_S
        while not scheduler_file.exists() or not scheduler_file.read_text().strip():
            assert scheduler.poll() is None, (home / "scheduler.log").read_text()
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.2)
        address = json.loads(scheduler_file.read_text())["address"]
        # The worker runs elsewhere (its own folder): it must read the inputs by the paths sent.
        worker = _dask(
            "worker", address, "--nworkers", "2", "--nthreads", "1", "--no-dashboard",
            "--host", "127.0.0.1", "--local-directory", str(home / "worker-space"),
            cwd=home, log=home / "worker.log",
        )  # fmt: skip
        yield address, scheduler_file
    finally:
        if worker is not None:
            _stop(worker)
        _stop(scheduler)


def test_a_job_on_a_dask_cluster_is_the_local_pools_job(
    cluster: tuple[str, Path], tmp_path: Path
) -> None:
    address, scheduler_file = cluster
    folder = job_folder(tmp_path)
    (folder / "rank4.sqlite").write_text("not a trace")  # a bad rank is reported, not fatal
    env = {"DASK_SCHEDULER_ADDRESS": ""}
    local = run("analyze", "job", "--json", "local.json", "-q", cwd=tmp_path, env=env)
    assert local.returncode == 2, local.stderr
    by_address = run("analyze", "job", "--scheduler", address, "--json", "dask.json", "-q",
                     cwd=tmp_path, env=env)  # fmt: skip
    assert by_address.returncode == 2, by_address.stderr
    assert f"on the Dask cluster at {address}" in by_address.stderr
    assert (tmp_path / "dask.json").read_bytes() == (tmp_path / "local.json").read_bytes()

    doc = json.loads((tmp_path / "dask.json").read_text())
    assert doc["failed_ranks"] == [4]
    assert "rank4.sqlite: not an SQLite database" in doc["ranks"][-1]["error"]
    for entry in doc["ranks"][:-1]:
        assert entry["analysis"] == single(entry["path"], cwd=tmp_path)

    # The scheduler named by a file, or by the environment, is the same cluster.
    by_file = run("analyze", "job/rank0.sqlite", "job/rank3.pickle", "--scheduler-file",
                  str(scheduler_file), "--json", "-", cwd=tmp_path, env=env)  # fmt: skip
    assert by_file.returncode == 0, by_file.stderr
    assert json.loads(by_file.stdout)["ranks"] == [doc["ranks"][0], doc["ranks"][3]]
    by_env = run("analyze", str(folder / "rank1.pickle"), str(folder / "rank2.sqlite"), "--json",
                 "-", env={"DASK_SCHEDULER_ADDRESS": address})  # fmt: skip
    assert by_env.returncode == 0, by_env.stderr
    assert "Dask cluster" in by_env.stderr
    absolute = json.loads(by_env.stdout)["ranks"]
    assert [r["analysis"] for r in absolute] == [
        single(str(folder / "rank1.pickle")), single(str(folder / "rank2.sqlite"))
    ]  # fmt: skip


def test_an_unreachable_scheduler_is_one_line(tmp_path: Path) -> None:
    folder = job_folder(tmp_path)
    result = run("analyze", str(folder), "--scheduler", "tcp://127.0.0.1:9",
                 env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"})  # fmt: skip
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("nsysfrag: error:")]
    assert len(lines) == 1 and "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in lines[0]
    assert "Traceback" not in result.stderr

"""What the job tests share: running the CLI, a job of sample inputs, the expected worst rank."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import SAMPLES

# One input of each kind and shape: nsys exports (one and two spaces) and snapshots.
JOB_SAMPLES = ("training_loop.sqlite", "inference_snapshot.pickle", "multi_gpu.sqlite",
               "training_snapshot.pickle")  # fmt: skip


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """The real entry point in a fresh interpreter, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "nsysfrag", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "120", **(env or {})},
        timeout=timeout,
    )


def job_folder(tmp_path: Path) -> Path:
    """The samples as rank0..rank3 of a job, in one folder."""
    folder = tmp_path / "job"
    folder.mkdir()
    for rank, name in enumerate(JOB_SAMPLES):
        shutil.copyfile(SAMPLES / name, folder / f"rank{rank}{Path(name).suffix}")
    return folder


def single(path: str, cwd: Path | None = None) -> dict[str, Any]:
    """``nsysfrag analyze PATH --json -``: the document of that input alone."""
    result = run("analyze", path, "--json", "-", cwd=cwd)
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def expected_worst(ranks: list[dict[str, Any]]) -> tuple[int, float]:
    """The rank whose highest peak global frag over its spaces is highest; ties: lower rank."""
    best: tuple[int, float] | None = None
    for entry in sorted(ranks, key=lambda e: e["rank"]):
        if "analysis" not in entry or not entry["analysis"]["spaces"]:
            continue
        value = max(s["peak"]["global_frag"] for s in entry["analysis"]["spaces"])
        if best is None or value > best[1]:
            best = (entry["rank"], value)
    assert best is not None
    return best

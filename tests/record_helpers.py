"""Running ``nsysfrag record`` end to end on the fake torch (tests/fake_torch): real processes,
a real record folder, no mocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FAKE_TORCH = REPO / "tests" / "fake_torch"
WORKLOADS = REPO / "tests" / "record_workloads"
TRAIN = WORKLOADS / "train.py"
LAUNCH = WORKLOADS / "launch.py"
GiB = 1 << 30


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


def fake_env(**extra: str) -> dict[str, str]:
    """Our environment with the fake torch importable as ``torch``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NSYSFRAG_RECORD", "FAKE_TORCH"))}
    env["PYTHONPATH"] = str(FAKE_TORCH)
    env["COLUMNS"] = "80"
    env.update(extra)
    return env


def record(out: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120,
           cwd: Path | None = None) -> Run:
    """``nsysfrag record -o OUT ARGS...`` (ARGS end with ``-- COMMAND``) in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-m", "nsysfrag", "record", "-o", str(out), *args],
        env=env or fake_env(), capture_output=True, text=True, timeout=timeout, cwd=cwd,
        check=False,
    )  # fmt: skip
    return Run(done.returncode, done.stdout, done.stderr)


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def warnings_of(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("nsysfrag record: warning:")]

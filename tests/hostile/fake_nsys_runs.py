"""The fake nsys (tests/fake_nsys) for hostile cases that run the real command line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.conftest import REPO

FAKE_DIR = REPO / "tests" / "fake_nsys"
MAGIC = b"FAKE-NSYS-REP\n"
USING = ("nsysfrag: using NVIDIA Nsight Systems",)  # the note of every run that starts nsys


def fake_env(tmp_path: Path, **knobs: str) -> dict[str, str]:
    """The environment that puts the fake nsys first on PATH (then this Python, which its
    shebang finds) and logs its calls in ``tmp_path``."""
    path = os.pathsep.join([str(FAKE_DIR), str(Path(sys.executable).parent), os.environ["PATH"]])
    return {"PATH": path, "FAKE_NSYS_LOG": str(tmp_path / "nsys.log"), **knobs}


def nsys_calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "nsys.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [json.loads(line)["argv"] for line in lines if "argv" in line]


def fake_report(path: Path) -> Path:
    """A report the fake nsys exports."""
    path.write_bytes(MAGIC + b'{"command": []}\n')
    return path

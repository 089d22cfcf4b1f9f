"""A differential fuzzer run as a process of its own (``tests/hostile/page_fuzz.py``,
``pickle_scan_fuzz.py``): a crash by signal fails the test that started it, with the case it
died on, instead of ending the test run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent


def fuzz_in_child(module: str, sources: list[Path], cases: int, seed: int) -> dict[str, int]:
    """Run ``python -m module`` on ``sources`` with compiled kernels; its closing counts."""
    proc = subprocess.run(
        [sys.executable, "-m", module, "--cases", str(cases), "--seed", str(seed), *map(str, sources)],
        cwd=REPO, env=dict(os.environ, NSYSFRAG_KERNELS="compiled"), capture_output=True,
        text=True, timeout=600 + cases, check=False,
    )  # fmt: skip
    lines = proc.stdout.splitlines() or ["(nothing)"]
    if proc.returncode < 0:
        pytest.fail(f"{module} died of signal {-proc.returncode} at case {lines[-1]} (seed {seed})")
    assert proc.returncode == 0, f"{lines[-1]}\n{proc.stderr[-2000:]}"
    return {k: int(v) for k, v in (kv.split("=") for kv in lines[-1].split())}

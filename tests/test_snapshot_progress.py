"""`analyze` on a PyTorch snapshot shows a progress bar for reading, parsing and replaying, on a
terminal only: a pipe or a CI log gets no bar, no carriage returns and no escape codes."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from nsysfrag.pipeline.feedback import Feedback
from tests.conftest import SAMPLES

SNAPSHOT = SAMPLES / "training_snapshot.pickle"
PHASES = (b"reading the snapshot", b"parsing trace entries", b"replaying events")
NSYSFRAG = [sys.executable, "-m", "nsysfrag"]


def analyze_args(tmp_path: Path) -> list[str]:
    return [*NSYSFRAG, "analyze", str(SNAPSHOT), "--json", str(tmp_path / "r.json"), "-q"]


def test_feedback_gives_a_progress_callback_only_to_a_terminal() -> None:
    assert Feedback(Console(file=io.StringIO(), force_terminal=False)).progress is None
    assert Feedback(Console(file=io.StringIO(), force_terminal=True)).progress is not None


def test_no_bar_when_stderr_is_a_pipe(tmp_path: Path) -> None:
    done = subprocess.run(analyze_args(tmp_path), capture_output=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    for phase in PHASES:
        assert phase not in done.stderr
    assert b"\r" not in done.stderr and b"\x1b" not in done.stderr


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal (POSIX)")
def test_bar_for_each_phase_on_a_terminal(tmp_path: Path) -> None:
    import pty  # POSIX only

    master, slave = pty.openpty()
    proc = subprocess.Popen(analyze_args(tmp_path), stderr=slave, stdout=subprocess.DEVNULL)
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    assert proc.wait(timeout=300) == 0
    for phase in PHASES:
        assert phase in shown, shown[-2000:]
    entries = b"8000/8000"  # the sample's trace entries, parsed and replayed in full
    assert shown.count(entries) >= 2

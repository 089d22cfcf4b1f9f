"""``nsysfrag record`` and a program that ignores the signal nsysfrag passes on: SIGKILL a grace
later (NSYSFRAG_RECORD_GRACE), one line that says so, the killed command's exit code (137), and
the record folder kept — never a wait without end."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.record_helpers import fake_env

STUBBORN = textwrap.dedent("""
    import signal, sys, time
    import torch
    kept = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # after the recorder armed its own handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("ready", flush=True)
    while True:
        time.sleep(0.1)
""")


def test_a_program_that_ignores_sigterm_is_killed_a_grace_later(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsysfrag", "record", "-o", str(out), "-q", "--", sys.executable,
         "-c", STUBBORN],
        env=fake_env(NSYSFRAG_RECORD_GRACE="1", NSYSFRAG_KERNELS="interpreted"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.stdout.readline().strip() != "ready":
        pass
    proc.send_signal(signal.SIGTERM)  # to nsysfrag alone, as `kill` sends it
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("nsysfrag record still waits for a program that ignores SIGTERM")
    assert proc.returncode == 128 + signal.SIGKILL, err  # the command's own end, as a shell says it
    assert "SIGTERM received; the command ignored it for 1 s and was killed (SIGKILL)" in err, err
    assert "Traceback" not in err
    marker = json.loads((out / "record.json").read_text())
    assert marker["status"] == "ended"

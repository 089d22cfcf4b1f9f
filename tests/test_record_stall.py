"""No state snapshot may stop the program for long: before PyTorch 2.11 ``memory_snapshot()``
converts the whole history, so the recorder predicts that cost and declines a state that would
pause longer than ``max_pause_s``; from 2.11 it asks without the history. Decisions, not
timings, are tested here (benchmarks/bench_stall.py measures the pauses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.record_helpers import REPO, fake_env

PROGRAM = """
import json, sys
import torch
from nsysfrag.torch import _runtime
from nsysfrag.record.bootstrap.nsysfrag_recorder.options import Options
torch.cuda.init()
recorder = _runtime().start(torch, Options(entries=30000, max_pause_s=float(sys.argv[2])),
                            sys.argv[1], sample_in_background=False)
keep = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
for _ in range(7000):  # 21,000 history entries: an alloc and a free are three
    x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    del x
recorder.sampler.sample(want_state=True)
print(json.dumps({"entries": recorder.sampler.history_entries([0]), "light": recorder.sampler.light,
                  "line": [json.loads(l) for l in open(recorder.folder.path + "/timeline.jsonl")][-1]}))
"""


def state_decision(tmp_path: Path, version: str, max_pause: float) -> dict[str, object]:
    env = fake_env(FAKE_TORCH_VERSION=version)
    env["PYTHONPATH"] += os.pathsep + str(REPO)
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path), str(max_pause)], env=env,
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_before_2_11_a_state_that_would_pause_too_long_is_declined(tmp_path: Path) -> None:
    got = state_decision(tmp_path, "2.10.0", 0.05)
    # The allocator's own counts say how full the history is: 7,000 x 3 entries and the 64 MiB.
    assert 21000 <= got["entries"] <= 21010  # type: ignore[operator]
    line = got["line"]
    assert "state" not in line and got["light"] is False  # declined: no full snapshot asked
    # No snapshot measured yet: the cautious 5 µs an entry, 105 ms > 50 ms.
    assert line["state_refused_s"] == pytest.approx(5e-6 * got["entries"], rel=1e-6)  # type: ignore[index]


def test_before_2_11_a_state_within_the_longest_pause_is_taken(tmp_path: Path) -> None:
    got = state_decision(tmp_path, "2.10.0", 1.0)
    line = got["line"]
    assert line["state"] == "state-1.pickle" and "state_refused_s" not in line  # type: ignore[operator]
    assert got["light"] is False  # torch 2.10 has no include_traces


def test_from_2_11_the_state_leaves_the_history_out_and_is_never_declined(tmp_path: Path) -> None:
    got = state_decision(tmp_path, "2.11.0", 0.05)
    line = got["line"]
    assert line["state"] == "state-1.pickle" and "state_refused_s" not in line  # type: ignore[operator]
    assert got["light"] is True

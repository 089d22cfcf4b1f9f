"""How long a state snapshot stops the program, at ``--entries 100000`` of history, on the
simulated allocator (tests/fake_torch): PyTorch up to 2.10, whose ``memory_snapshot()`` converts
the whole history for it, and 2.11, which can leave the history out.

    python benchmarks/bench_stall.py [--entries 100000] [--samples 5]

For each torch, in a fresh process: the recorder starts with CUDA, one state snapshot is taken
early (a few thousand entries: the recorder learns what an entry costs), the program then
allocates and frees 1 MiB until the history is full, and the sampler is asked for a state
``--samples`` times (as the every-K-th sample and ``monitor().step()`` ask). Printed per torch:
what the old recorder's call cost (``memory_snapshot()`` as it was called, timed directly), the
longest pause the recorder caused (a sample with its state snapshot, from the timeline), and how
many state snapshots it declined because they would have paused longer than 50 ms. A last row
is 2.10 without the early snapshot: the recorder's cautious guess alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROGRAM = r"""
import json, sys, time
sys.path.insert(0, {repo!r})
import torch
from nsysfrag.torch import _runtime
from nsysfrag.record.bootstrap.nsysfrag_recorder.options import Options

entries, samples, early, out = {entries}, {samples}, {early}, {out!r}
torch.cuda.init()
recorder = _runtime().start(torch, Options(entries=entries), out, sample_in_background=False)
keep = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
def churn(n):
    for _ in range(n):
        del_me = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        del del_me
if early:
    churn(1000)
    recorder.sampler.sample(want_state=True)  # the early one: the cost of an entry is learned
churn(entries // 3 + 1000)  # an alloc and a free are three entries: the history is full
started = time.perf_counter()
segments = torch.cuda.memory_snapshot()  # what the recorder called before: the whole history
old = time.perf_counter() - started
recorder.sampler.last_state_at = 0.0  # the average budget allows it: only the pause decides
for _ in range(samples):
    recorder.sampler.sample(want_state=True)
    recorder.sampler.last_state_at = 0.0
lines = [json.loads(l) for l in open(recorder.folder.path + "/timeline.jsonl")]
pauses = [l["cost_s"] + l.get("state_cost_s", 0.0) for l in lines]
print(json.dumps({{
    "history_entries": recorder.sampler.history_entries([0]),
    "old_call_s": old,
    "longest_pause_s": max(pauses),
    "states_taken": sum(1 for l in lines if "state" in l) - (1 if early else 0),
    "states_declined": sum(1 for l in lines if "state_refused_s" in l),
    "predicted_s": max((l.get("state_refused_s", 0.0) for l in lines), default=0.0),
    "s_per_entry": recorder.sampler.s_per_entry,
}}))
"""


def measure(version: str, entries: int, samples: int, early: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "PYTHONPATH": str(REPO / "tests" / "fake_torch"),
               "FAKE_TORCH_VERSION": version, "FAKE_TORCH_DEVICE_MEMORY": str(8 << 30)}  # fmt: skip
        program = PROGRAM.format(repo=str(REPO), entries=entries, samples=samples, early=early,
                                 out=folder)  # fmt: skip
        done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                              text=True, check=True)  # fmt: skip
        return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    rows = [("2.10.0", True), ("2.11.0", True), ("2.10.0", False)]
    print(f"{'torch':>8} {'early':>5} {'entries':>8} {'old call':>9} {'longest pause':>14}"
          f" {'taken':>5} {'declined':>8} {'predicted':>9}")  # fmt: skip
    for version, early in rows:
        r = measure(version, args.entries, args.samples, early)
        print(f"{version:>8} {str(early):>5} {r['history_entries']:>8} {r['old_call_s'] * 1e3:>7.1f}ms"
              f" {r['longest_pause_s'] * 1e3:>12.1f}ms {r['states_taken']:>5} {r['states_declined']:>8}"
              f" {r['predicted_s'] * 1e3:>7.1f}ms")  # fmt: skip


if __name__ == "__main__":
    main()

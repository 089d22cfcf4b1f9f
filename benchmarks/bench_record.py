"""What ``nsysfrag record`` costs a training loop: step times with and without the recorder.

    python benchmarks/bench_record.py                       # PyTorch on a CUDA device
    PYTHONPATH=tests/fake_torch python benchmarks/bench_record.py --fake   # no GPU: the fake

Each variant runs ``benchmarks/record_workload.py`` in a fresh process, interleaved, ``--runs``
times; a run's figure is the median step time after the first ``--warmup`` steps, a variant's
the median of its runs. Variants:

- ``off``: the program alone;
- ``history``: under ``nsysfrag record --interval 3600`` (history and the OOM observer, no
  sampling within the run): the cost of PyTorch's history (its own figure: about 2 µs per
  allocation with Python stacks);
- ``record``: under ``nsysfrag record`` with its defaults (a sample every 5 s, a state
  snapshot every 12th sample or when memory moved, within 1 % of the time): the target is
  at most 1 % over ``history``... and over ``off`` without history's own cost;
- ``busy``: ``--interval 1 --state-every 1``, sampling as often as it may.

Each sample's own cost (``memory_stats()`` + ``mem_get_info()`` of the devices in use) and each
state snapshot's are read from the record's timeline. With ``--fake`` the figures are the fake
torch's (its allocator is Python, its history records Python frames by walking the stack):
they show the recorder's mechanics, not PyTorch's costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "record_workload.py"
VARIANTS = {
    "off": None,
    "history": ["--interval", "3600"],
    "record": [],
    "busy": ["--interval", "1", "--state-every", "1"],
}


def run(variant: str, folder: Path, seconds: float, n: int) -> tuple[list[float], list[dict[str, float]]]:
    times = folder / f"{variant}-{n}.json"
    program = [sys.executable, str(WORKLOAD), str(times), str(seconds)]
    extra = VARIANTS[variant]
    if extra is None:
        subprocess.run(program, check=True)
        return json.loads(times.read_text())["step_s"], []
    out = folder / f"{variant}-{n}"
    subprocess.run(
        [sys.executable, "-m", "nsysfrag", "record", "-o", str(out), "-q", *extra, "--", *program],
        check=True,
    )
    lines = []
    for path in out.glob("rank*/timeline.jsonl"):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(times.read_text())["step_s"], [x for x in lines if "event" not in x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20, help="each run's length")
    parser.add_argument("--warmup", type=int, default=20, help="steps not counted")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fake", action="store_true", help="the tests' fake torch (no GPU)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    variants = args.variants.split(",")
    medians: dict[str, list[float]] = {v: [] for v in variants}
    samples: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.runs):
            for variant in variants:
                step_s, lines = run(variant, Path(tmp), args.seconds, n)
                medians[variant].append(statistics.median(step_s[args.warmup :]))
                samples[variant] += lines
    base = statistics.median(medians["off"]) if "off" in medians else None
    print(f"load average {os.getloadavg()[0]:.2f}; {args.runs} runs of {args.seconds:g} s each")
    print(f"{'variant':10} {'median step':>12} {'vs off':>8}  per-run medians")
    for variant in variants:
        m = statistics.median(medians[variant])
        ratio = f"{(m / base - 1) * 100:+.2f}%" if base else ""
        runs = ", ".join(f"{x * 1e3:.3f}" for x in medians[variant])
        print(f"{variant:10} {m * 1e3:>9.3f} ms {ratio:>8}  [{runs}] ms")
    for variant in variants:
        lines = samples[variant]
        if not lines:
            continue
        cost = [x["cost_s"] for x in lines]
        state = [x["state_cost_s"] for x in lines if "state_cost_s" in x]
        text = f"{variant}: {len(cost)} samples, each {statistics.median(cost) * 1e3:.3f} ms (max {max(cost) * 1e3:.3f})"
        if state:
            text += f"; {len(state)} state snapshots, each {statistics.median(state) * 1e3:.2f} ms (max {max(state) * 1e3:.2f})"
        print(text)


if __name__ == "__main__":
    main()

"""Cold and warm start of the command line: the first run after installing compiles the kernels.

    python benchmarks/bench_startup.py              # 3 rounds
    python benchmarks/bench_startup.py --rounds 5

Each round empties a fresh kernel cache (``XDG_CACHE_HOME`` pointed at a temporary folder), then
times, process start to exit, the first and the second ``nsysfrag analyze`` of a sample trace
(``-q --json``: the same work as the terminal report, less the printing), then the first and
second ``nsysfrag whatif`` of a sample snapshot. It prints the medians, the machine's load
average before and after (other work on the machine slows everything down: compare figures
taken at a similar load), and one line per target: ``target name: measured vs limit: PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "sample_traces" / "inference_serving.sqlite"
SNAPSHOT = REPO / "sample_traces" / "training_snapshot.pickle"
# Issue 14's aims for a sample trace on the 2-core development machine.
COLD_ANALYZE_LIMIT_S = 10.0
WARM_ANALYZE_LIMIT_S = 1.5


def timed(argv: list[str], cache: Path) -> tuple[float, str]:
    """Seconds from process start to exit, and what the command said on stderr."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(REPO)}
    env.pop("NUMBA_CACHE_DIR", None)
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "nsysfrag", *argv], env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"nsysfrag {' '.join(argv)} failed: {proc.stderr}")
    return elapsed, proc.stderr.strip()


def one_round() -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="nsysfrag-bench-cache-") as folder:
        cache = Path(folder)
        analyze = ["analyze", str(TRACE), "-q", "--json", os.devnull]
        whatif = ["whatif", str(SNAPSHOT), "-q", "--json", os.devnull]
        figures = {}
        for name, argv in (("analyze", analyze), ("whatif", whatif)):
            cold, said = timed(argv, cache)
            if "compiling" not in said:
                raise SystemExit(f"the first {name} did not compile (stderr: {said!r})")
            warm, said = timed(argv, cache)
            if said:
                raise SystemExit(f"the second {name} said {said!r}; it should load from cache")
            figures[f"{name} cold"], figures[f"{name} warm"] = cold, warm
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()
    rounds = [one_round() for _ in range(args.rounds)]
    load_after = os.getloadavg()
    print(f"{os.cpu_count()} CPUs; load average (1, 5, 15 min) before"
          f" {', '.join(f'{x:.2f}' for x in load_before)}, after"
          f" {', '.join(f'{x:.2f}' for x in load_after)}")  # fmt: skip
    print(f"{'':18}{'median':>9}{'min':>9}{'max':>9}   ({args.rounds} rounds)")
    medians = {}
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        medians[key] = statistics.median(values)
        print(f"{key:18}{medians[key]:8.2f}s{min(values):8.2f}s{max(values):8.2f}s")
    for name, key, limit in (("cold first analyze of a sample", "analyze cold", COLD_ANALYZE_LIMIT_S),
                             ("warm analyze of a sample", "analyze warm", WARM_ANALYZE_LIMIT_S)):  # fmt: skip
        verdict = "PASS" if medians[key] <= limit else "FAIL"
        print(f"target {name}: {medians[key]:.2f} s vs {limit:.1f} s: {verdict}")


if __name__ == "__main__":
    main()

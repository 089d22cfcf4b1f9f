"""Benchmark `nsysfrag compare` of two large snapshots against `nsysfrag analyze` of one (issue 23).

    python benchmarks/bench_compare.py                  # two snapshots of ~1 M entries
    python benchmarks/bench_compare.py --entries 200000 --runs 3

The two snapshots come from ``big_snapshot.py`` (a training loop's cycle of entries laid end to
end): one of ``--entries`` entries and one of 99 % as many, so they differ. Each command runs in
a fresh process, numba's cache warm, the runs of the two commands interleaved so that a busy
machine slows both alike: ``nsysfrag analyze A --json`` (one snapshot), then ``nsysfrag compare
A B --json`` (both analyzed, every site listed, and compared). Prints the medians and the ratio
of compare to analyze, wall and CPU, and the target: compare within 2.5x of one analysis.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from big_snapshot import big_snapshot

TARGET = 2.5
# Wall and CPU seconds of a child, measured by a wrapper process (as bench_snapshot_scale.py).
_WRAPPER = (
    "import resource, subprocess, sys, time;"
    "t = time.perf_counter();"
    "rc = subprocess.run(sys.argv[1:]).returncode;"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN);"
    "print(time.perf_counter() - t, u.ru_utime + u.ru_stime);"
    "sys.exit(rc)"
)


def timed(args: list[str]) -> tuple[float, float]:
    proc = subprocess.run(
        [sys.executable, "-c", _WRAPPER, sys.executable, "-m", "nsysfrag", *args],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    wall, cpu = proc.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3, help="runs of each command (median)")
    args = parser.parse_args()
    a, b = big_snapshot(args.entries), big_snapshot(args.entries * 99 // 100)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        timed(["analyze", str(a), "-q"])  # numba's cache and the page cache: a second run
        analyze: list[tuple[float, float]] = []
        compare: list[tuple[float, float]] = []
        for _ in range(args.runs):
            analyze.append(timed(["analyze", str(a), "-q", "--json", str(out / "a.json")]))
            compare.append(timed(["compare", str(a), str(b), "-q", "--json", str(out / "c.json")]))
        verdict = __import__("json").loads((out / "c.json").read_text())["spaces"][0]["verdict"]
    med = {
        name: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        for name, runs in (("analyze", analyze), ("compare", compare))
    }
    print(f"snapshots: {a.name} and {b.name}; {args.runs} runs each")
    print(f"{'command':<10}{'wall s':>10}{'cpu s':>10}")
    for name, (wall, cpu) in med.items():
        print(f"{name:<10}{wall:>10.2f}{cpu:>10.2f}")
    wall_ratio = med["compare"][0] / med["analyze"][0]
    cpu_ratio = med["compare"][1] / med["analyze"][1]
    print(f"ratio compare / analyze: wall {wall_ratio:.2f}x, cpu {cpu_ratio:.2f}x")
    print(f"verdict: {verdict}")
    status = "PASS" if wall_ratio <= TARGET else "FAIL"
    print(f"target: compare of two within {TARGET}x of analyzing one: {wall_ratio:.2f}x: {status}")


if __name__ == "__main__":
    main()

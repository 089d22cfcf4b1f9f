"""Benchmark PyTorch snapshots at scale (issue 13): `nsysfrag analyze` against `pickle.load`.

    python benchmarks/bench_snapshot_scale.py                 # 200 k, 1 M and 5 M entries
    python benchmarks/bench_snapshot_scale.py --sizes 200000  # just one size
    python benchmarks/bench_snapshot_scale.py --runs 3        # medians of 3 runs

For each size (snapshots from ``big_snapshot.py``: realistic 26-39-frame stacks, each entry its
own frames list) it measures, each in its own subprocess: the wall time and peak RSS of plain
``pickle.load`` of the file (what any reader of the file pays at least), and of
``nsysfrag analyze FILE --json --html`` (process start to exit); then, in this process, the
replay alone (the columns already read): entries per second. The 5 M case needs about 8 GiB
and runs only when ``/proc/meminfo`` says 16 GiB are available (the machine is shared).

Prints a table, then one line per target: `target: measured vs limit: PASS|FAIL`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from big_snapshot import big_snapshot

SIZES = (200_000, 1_000_000, 5_000_000)
NEEDS_AVAILABLE_GIB = {5_000_000: 16}
# Peak RSS of a child, measured by a wrapper process so other children do not count.
_RSS_WRAPPER = (
    "import resource, subprocess, sys, time;"
    "t = time.perf_counter();"
    "rc = subprocess.run(sys.argv[1:]).returncode;"
    "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
    "sys.exit(rc)"
)


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def measured(cmd: list[str], runs: int) -> tuple[float, int]:
    """Median wall seconds and largest peak RSS (bytes) of ``cmd``, each run a fresh process."""
    seconds, rss = [], []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", _RSS_WRAPPER, *cmd], check=True,
                              capture_output=True, text=True)  # fmt: skip
        s, kib = proc.stdout.strip().splitlines()[-1].split()
        seconds.append(float(s))
        rss.append(int(kib) * 1024)
    return statistics.median(seconds), max(rss)


def pickle_load(path: Path, runs: int) -> tuple[float, int]:
    code = "import pickle, sys\nwith open(sys.argv[1], 'rb') as f: pickle.load(f)"
    return measured([sys.executable, "-c", code, str(path)], runs)


def analyze(path: Path, runs: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cmd = [sys.executable, "-m", "nsysfrag", "analyze", str(path), "--json", str(out / "r.json"),
               "--html", str(out / "r.html"), "-q"]  # fmt: skip
        return measured(cmd, runs)


def replay_rate(path: Path, runs: int) -> tuple[float, int]:
    """Entries per second of the compiled replay of device 0 (the columns already in memory):
    the window's start, the replay, and the outputs as the Python reference returns them."""
    from nsysfrag import segments_compiled
    from nsysfrag.snapshot_columns import read_snapshot_columns

    columns = read_snapshot_columns(path)
    entries = len(columns.traces[0])
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        segments_compiled.replay_device(columns, 0)
        times.append(time.perf_counter() - t)
    return entries / statistics.median(times), entries


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--runs", type=int, default=1, help="runs per measurement (median)")
    args = parser.parse_args()

    # Warm numba's cache (a user's second run) on a small file first.
    analyze(big_snapshot(200_000), 1)
    rows = []
    targets = []
    for n in args.sizes:
        need = NEEDS_AVAILABLE_GIB.get(n, 0)
        if available_gib() < need:
            rows.append(
                (f"{n:,} entries", f"not run: {available_gib():.1f} GiB available, needs {need}")
            )
            continue
        path = big_snapshot(n)
        load_s, load_rss = pickle_load(path, args.runs)
        run_s, run_rss = analyze(path, args.runs)
        rate, entries = replay_rate(path, max(args.runs, 3)) if n <= 1_000_000 else (0.0, n)
        rows.append((f"{n:,} entries, {path.stat().st_size / 1e6:,.0f} MB pickle", ""))
        rows.append(
            ("  pickle.load (process)", f"{load_s:.2f} s, {load_rss / 2**20:,.0f} MiB peak RSS")
        )
        rows.append(
            (
                "  nsysfrag analyze --json --html",
                f"{run_s:.2f} s, {run_rss / 2**20:,.0f} MiB peak RSS",
            )
        )
        rows.append(("  ratio", f"{run_s / load_s:.2f}x time, {run_rss / load_rss:.2f}x RSS"))
        if rate:
            rows.append(("  replay alone", f"{rate / 1e6:.2f} M entries/s"))
        if n == 1_000_000:
            targets += [
                ("1M end to end / pickle.load", run_s / load_s, 2.0, "<="),
                ("1M peak RSS / pickle.load's", run_rss / load_rss, 1.5, "<="),
                ("replay M entries/s", rate / 1e6, 2.0, ">="),
            ]
        if n == 5_000_000:
            targets.append(("5M completes (s)", run_s, float("inf"), "<="))
        del entries
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print()
    for name, value, limit, op in targets:
        ok = value <= limit if op == "<=" else value >= limit
        print(f"{name}: {value:.2f} vs {op} {limit:.2f}: {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()

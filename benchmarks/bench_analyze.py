"""Benchmark `nsysfrag analyze` against the scan floor and the naive pandas load (issue 5).

    python benchmarks/bench_analyze.py            # 200 k and 2 M events, 3 runs each
    python benchmarks/bench_analyze.py --stretch   # also 20 M events (slow to generate)

Prints a table, then one machine-readable line per target:
`target name: measured vs limit: PASS|FAIL`. Ratios are taken within one run on one machine, so
they hold on a noisy shared box where absolute seconds do not.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from churn_trace import churn_trace

RUNS = 3
# Peak RSS of a child, measured by a wrapper process so other children do not count.
_RSS_WRAPPER = (
    "import resource, subprocess, sys;"
    "rc = subprocess.run(sys.argv[1:]).returncode;"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
    "sys.exit(rc)"
)


def median_seconds(fn: Callable[[], object], runs: int = RUNS) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def scan_floor(path: Path) -> float:
    def scan() -> None:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        # total(), not sum(): summing real device addresses overflows SQLite's 64-bit sum.
        con.execute(
            "SELECT count(*), total(address), sum(bytes), max(start) FROM CUDA_GPU_MEMORY_USAGE_EVENTS"
        ).fetchone()
        con.close()

    return median_seconds(scan)


def pandas_load(path: Path) -> float:
    import pandas as pd
    import sqlalchemy as sa

    def load() -> None:
        engine = sa.create_engine(f"sqlite:///{path}")
        with engine.connect() as con:
            pd.read_sql(sa.text("SELECT * FROM CUDA_GPU_MEMORY_USAGE_EVENTS"), con)
        engine.dispose()

    return median_seconds(load)


def end_to_end(path: Path) -> tuple[float, float]:
    """Median wall time of the whole command, process start to exit, and the largest peak RSS."""
    rss = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, "-c", _RSS_WRAPPER, sys.executable, "-m", "nsysfrag", "analyze",
               str(path), "--json", str(out), "-q"]
        # One untimed run so numba's compiled-code cache is warm, as on a user's second run.
        subprocess.run(cmd, check=True, capture_output=True)

        def run() -> None:
            proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
            rss.append(int(proc.stdout.strip().splitlines()[-1]) * 1024)

        seconds = median_seconds(run)
        json.loads(out.read_text())
    return seconds, max(rss)


def replay_rate(path: Path) -> tuple[float, int]:
    """Events per second of analyze() on a trace already in memory (replay, every metric after
    every event, hotspots, histograms)."""
    from nsysfrag.analysis import analyze
    from nsysfrag.inputs.nsys.reader import read_trace

    trace = read_trace(path)
    analyze(trace)  # compile / warm up
    seconds = median_seconds(lambda: analyze(trace))
    return len(trace.memory) / seconds, len(trace.memory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stretch", action="store_true", help="also run 20 M events")
    parser.add_argument("--small", type=int, default=200_000)
    parser.add_argument("--large", type=int, default=2_000_000)
    args = parser.parse_args()

    small, large = churn_trace(args.small), churn_trace(args.large)
    floor = scan_floor(large)
    naive = pandas_load(large)
    e2e_large, rss_large = end_to_end(large)
    e2e_small, _ = end_to_end(small)
    rate, events = replay_rate(large)

    rows = [
        ("events", f"{events:,}"),
        ("scan floor (sqlite3 aggregate)", f"{floor:.3f} s"),
        ("pandas.read_sql via SQLAlchemy", f"{naive:.3f} s"),
        (f"nsysfrag analyze, {args.large:,} events", f"{e2e_large:.3f} s"),
        (f"nsysfrag analyze, {args.small:,} events", f"{e2e_small:.3f} s"),
        ("replay + metrics, in memory", f"{rate / 1e6:.2f} M events/s"),
        ("peak RSS", f"{rss_large / 2**20:.0f} MiB"),
    ]
    if args.stretch:
        huge = churn_trace(20_000_000)
        t, rss = end_to_end(huge)
        rows.append(("nsysfrag analyze, 20,000,000 events (stretch)", f"{t:.1f} s, {rss / 2**30:.2f} GiB RSS"))
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print()
    rss_limit = 250 * 2**20 + 300 * events
    targets = [
        ("end-to-end / scan floor", e2e_large / floor, 10.0, "<="),
        ("end-to-end / pandas load", e2e_large / naive, 0.5, "<="),
        ("replay M events/s", rate / 1e6, 2.0, ">="),
        ("peak RSS MiB", rss_large / 2**20, rss_limit / 2**20, "<="),
        ("2M run / 200k run", e2e_large / e2e_small, 12.0, "<="),
    ]
    for name, measured, limit, op in targets:
        ok = measured <= limit if op == "<=" else measured >= limit
        print(f"{name}: {measured:.2f} vs {op} {limit:.2f}: {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()

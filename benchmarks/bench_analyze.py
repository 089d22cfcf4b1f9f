"""Benchmark `nsysfrag analyze` against the scan floor and the naive pandas load (issues 5, 26, 37).

    python benchmarks/bench_analyze.py            # 200 k and 2 M events, 3 runs each
    python benchmarks/bench_analyze.py --stretch   # also 20 M events (slow to generate)
    python benchmarks/bench_analyze.py --phases    # also where the 2 M run's time and memory go

The scan floor is SQLite's own scan of the memory table (count, totals of address and bytes,
latest start) in a process of its own; issue 37's targets for 2 M events end to end are at most
5x its time and at most 400 MiB peak RSS, printed beside the figures. ``--phases`` runs the
steps of the command, in order, in a process of its own (start-up, reading, the spaces, the
replay's inputs, the compiled replay, the site codes, the summary), each with its wall and CPU
time and the peak RSS so far: the profile that says what stops a target.

Prints a table, then one machine-readable line per target:
`target name: measured vs limit: PASS|FAIL`. Ratios are taken within one run on one machine, so
they hold on a noisy shared box where absolute seconds do not.
"""

from __future__ import annotations

import argparse
import json
import os
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
# Issue 37's targets for the large trace, end to end (page model included).
SCAN_RATIO_TARGET = 5.0
RSS_TARGET_MIB = 400
# Wall time, CPU time and peak RSS of a child, measured by a wrapper process so other children
# do not count.
_RSS_WRAPPER = (
    "import resource, subprocess, sys, time;"
    "t = time.perf_counter();"
    "rc = subprocess.run(sys.argv[1:]).returncode;"
    "wall = time.perf_counter() - t;"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN);"
    "print(wall, u.ru_utime + u.ru_stime, u.ru_maxrss);"
    "sys.exit(rc)"
)
# The floor: SQLite's own scan of the memory table, in a process of its own like the command.
_SCAN = (
    "import sqlite3, sys;"
    "con = sqlite3.connect(f'file:{sys.argv[1]}?mode=ro', uri=True);"
    # total(), not sum(): summing real device addresses overflows SQLite's 64-bit sum.
    "con.execute('SELECT count(*), total(address), total(bytes), max(start)"
    " FROM CUDA_GPU_MEMORY_USAGE_EVENTS').fetchone()"
)


def median_seconds(fn: Callable[[], object], runs: int = RUNS) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _measured(cmd: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS bytes) of ``cmd`` run to its end."""
    proc = subprocess.run([sys.executable, "-c", _RSS_WRAPPER, *cmd], check=True, capture_output=True, text=True)
    wall, cpu, rss = proc.stdout.split()[-3:]
    return float(wall), float(cpu), int(rss) * 1024


def scan_and_analyze(path: Path, runs: int = RUNS) -> dict[str, float]:
    """The bare scan and ``nsysfrag analyze --json`` of ``path``, each a process of its own,
    alternating so both meet the same load; medians of wall and CPU time, the largest RSS."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        analyze = [sys.executable, "-m", "nsysfrag", "analyze", str(path), "--json", str(out), "-q"]
        scan = [sys.executable, "-c", _SCAN, str(path)]
        # One untimed run each: numba's compiled-code cache and the file's pages warm, as on
        # a user's second run.
        _measured(analyze)
        _measured(scan)
        scans, runs_ = [], []
        for _ in range(runs):
            scans.append(_measured(scan))
            runs_.append(_measured(analyze))
        json.loads(out.read_text())
    return {
        "scan_s": statistics.median(s[0] for s in scans),
        "scan_cpu_s": statistics.median(s[1] for s in scans),
        "wall_s": statistics.median(r[0] for r in runs_),
        "cpu_s": statistics.median(r[1] for r in runs_),
        "rss": max(r[2] for r in runs_),
    }


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
    measured = scan_and_analyze(path)
    return measured["wall_s"], measured["rss"]


def replay_rate(path: Path) -> tuple[float, int]:
    """Events per second of analyze() on a trace already in memory (replay, every metric after
    every event, hotspots, histograms)."""
    from nsysfrag.analysis import analyze
    from nsysfrag.inputs import InputOptions
    from nsysfrag.inputs.nsys.reader import read_trace
    from nsysfrag.inputs.nsys.spaces import recording_of

    trace = read_trace(path)

    def run() -> None:
        analyze(recording_of(trace, InputOptions()))

    run()  # compile / warm up
    seconds = median_seconds(run)
    return len(trace.memory) / seconds, len(trace.memory)


# The steps of `analyze --json` on one trace, each timed (wall, CPU of every thread) with the
# peak RSS so far; run in a process of its own so that nothing earlier is loaded or counted.
_PHASES = """
import sys, time
from pathlib import Path
rows = []
def step(name, start, cpu):
    # VmHWM, not ru_maxrss: a child's ru_maxrss starts from its parent's at fork.
    status = open("/proc/self/status").read().split("VmHWM:")[1]
    rss = int(status.split()[0]) * 1024
    rows.append((name, time.perf_counter() - start, time.process_time() - cpu, rss))
    return time.perf_counter(), time.process_time()
t, c = time.perf_counter(), time.process_time()
import numpy as np
from nsysfrag.analysis.summary import summarize
from nsysfrag.inputs import InputOptions
from nsysfrag.inputs.nsys.reader import read_trace
from nsysfrag.inputs.nsys.spaces import recording_of
from nsysfrag.models.observed import _placeable, kernel_events_of
from nsysfrag.models.observed.kernel import replay, warm_up
from nsysfrag.reporters import json_report
t, c = step("start-up (imports)", t, c)
warm_up()
t, c = step("compiled replay loaded", t, c)
trace = read_trace(Path(sys.argv[1]))
t, c = step("read_trace (memory and runtime tables)", t, c)
recording = recording_of(trace, InputOptions())
del trace
t, c = step("spaces and their events", t, c)
for space in recording.spaces:
    events, kept = _placeable(space.events)
    kernel_events, _, _ = kernel_events_of(events, 512, 2 << 20, space.capacity_bytes)
    t, c = step("  the replay's inputs", t, c)
    replay(kernel_events)
    t, c = step("  compiled replay alone", t, c)
    placed = np.flatnonzero(~kernel_events.is_free & (events.bytes > 0))
    space.events.sites.codes(kept[placed])
    t, c = step("  site codes alone", t, c)
    del kernel_events
    run = space.model.run(space)
    t, c = step("  model run (replay + site codes on a thread)", t, c)
    summarize(space, run, recording.source, recording.model)
    t, c = step("  summary", t, c)
for name, wall, cpu, rss in rows:
    print(f"{name}|{wall}|{cpu}|{rss}")
"""


def phases(path: Path) -> list[tuple[str, float, float, int]]:
    """(step, wall s, CPU s, peak RSS bytes so far) of analyze's steps on ``path`` (_PHASES)."""
    proc = subprocess.run(
        [sys.executable, "-c", _PHASES, str(path)], check=True, capture_output=True, text=True
    )
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.count("|") == 3]
    return [(name, float(wall), float(cpu), int(rss)) for name, wall, cpu, rss in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stretch", action="store_true", help="also run 20 M events")
    parser.add_argument("--phases", action="store_true", help="also profile the large run's steps")
    parser.add_argument("--small", type=int, default=200_000)
    parser.add_argument("--large", type=int, default=2_000_000)
    args = parser.parse_args()

    small, large = churn_trace(args.small), churn_trace(args.large)
    load = os.getloadavg()[0]
    measured = scan_and_analyze(large)
    floor, e2e_large, rss_large = measured["scan_s"], measured["wall_s"], measured["rss"]
    naive = pandas_load(large)
    e2e_small, _ = end_to_end(small)
    rate, events = replay_rate(large)

    ratio = e2e_large / floor
    rss_mib = rss_large / 2**20
    rows = [
        ("events", f"{events:,}"),
        ("machine load (1 min, at start)", f"{load:.2f} on {os.cpu_count()} cores"),
        ("scan floor (bare sqlite3 scan, own process)", f"{floor:.3f} s"),
        ("pandas.read_sql via SQLAlchemy", f"{naive:.3f} s"),
        (f"nsysfrag analyze --json, {args.large:,} events", f"{e2e_large:.3f} s wall, {measured['cpu_s']:.3f} s CPU"),
        ("  / scan floor", f"{ratio:.2f}x ({SCAN_RATIO_TARGET:.1f}x target)"),
        ("  CPU / scan floor's CPU", f"{measured['cpu_s'] / measured['scan_cpu_s']:.2f}x"),
        ("  peak RSS", f"{rss_mib:.0f} MiB ({RSS_TARGET_MIB} MiB target)"),
        (f"nsysfrag analyze, {args.small:,} events", f"{e2e_small:.3f} s"),
        ("replay + metrics, in memory", f"{rate / 1e6:.2f} M events/s"),
    ]
    if args.stretch:
        huge = churn_trace(20_000_000)
        t, rss = end_to_end(huge)
        rows.append(("nsysfrag analyze, 20,000,000 events (stretch)", f"{t:.1f} s, {rss / 2**30:.2f} GiB RSS"))
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print()
    if args.phases:
        print(f"steps of analyze, {args.large:,} events (load {os.getloadavg()[0]:.2f};"
              f" scan floor {measured['scan_cpu_s']:.3f} s CPU):")
        for name, wall, cpu, rss in phases(large):
            share = cpu / measured["scan_cpu_s"]
            print(f"  {name:<46} {wall:7.3f} s wall {cpu:7.3f} s CPU ({share:4.1f}x scan)"
                  f"  peak RSS {rss / 2**20:5.0f} MiB")
        print()
    targets = [
        ("end-to-end / scan floor", ratio, SCAN_RATIO_TARGET, "<="),
        ("peak RSS MiB", rss_mib, float(RSS_TARGET_MIB), "<="),
        ("end-to-end / pandas load", e2e_large / naive, 0.5, "<="),
        ("replay M events/s", rate / 1e6, 2.0, ">="),
        ("2M run / 200k run", e2e_large / e2e_small, 12.0, "<="),
    ]
    for name, value, limit, op in targets:
        ok = value <= limit if op == "<=" else value >= limit
        print(f"{name}: {value:.2f} vs {op} {limit:.2f}: {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()

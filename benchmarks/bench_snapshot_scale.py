"""Benchmark PyTorch snapshots at scale (issue 13): `nsysfrag analyze` against `pickle.load`.

    python benchmarks/bench_snapshot_scale.py                 # 200 k, 1 M and 5 M entries
    python benchmarks/bench_snapshot_scale.py --sizes 200000  # just one size
    python benchmarks/bench_snapshot_scale.py --runs 3        # medians of 3 runs

For each size (snapshots from ``big_snapshot.py``: realistic 26-39-frame stacks, each entry its
own frames list) it measures, each in its own subprocess: the wall time and peak RSS of plain
``pickle.load`` of the file (what any reader of the file pays at least), and of
``nsysfrag analyze FILE --json --html`` (process start to exit); the HTML page's size and the
time it takes to open in headless Chromium (``html_open_time.py``); then, in this process, the
replay alone (the columns already read): entries per second. The 5 M case needs about 8 GiB
and runs only when ``/proc/meminfo`` says 16 GiB are available (the machine is shared).

Prints a table, then one line per target: `target: measured vs limit: PASS|FAIL`.

What stops the 1 M targets (issue 37 item 3), measured in child processes (CPU seconds, 2 cores):
the object graph alone is pickle.load's whole peak (715 MiB), and the read adds the imports
(98 MiB) and LLVM for the opcode pass's kernel (45 MiB) beside it: 0.9x needs a reader that
never builds the graph. Of analyze's 6.3 s CPU, reading takes 3.6 (unpickling 0.95 with the
collector off, the opcode pass 0.45, columns 0.94, freeing 0.21, imports 0.6) and the HTML
report's figures 2.2 whatever the size: pickle.load with the collector on takes 3.1-3.6.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from big_snapshot import big_snapshot
from html_open_time import open_seconds

from nsysfrag.testing.browser import find_chromium

SIZES = (200_000, 1_000_000, 5_000_000)
NEEDS_AVAILABLE_GIB = {5_000_000: 16}
# Wall time, CPU time and peak RSS of a child, measured by a wrapper process so that other
# children do not count. CPU seconds are the figure to trust on a shared machine: wall time
# there depends on what else runs.
_RSS_WRAPPER = (
    "import resource, subprocess, sys, time;"
    "t = time.perf_counter();"
    "rc = subprocess.run(sys.argv[1:]).returncode;"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN);"
    "print(time.perf_counter() - t, u.ru_utime + u.ru_stime, u.ru_maxrss);"
    "sys.exit(rc)"
)


@dataclass(frozen=True)
class Measured:
    wall_s: float  # median
    cpu_s: float  # median
    rss: int  # the largest peak RSS, bytes


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def measured(cmd: list[str], runs: int) -> Measured:
    """``cmd`` run ``runs`` times, each a fresh process."""
    wall, cpu, rss = [], [], []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", _RSS_WRAPPER, *cmd], check=True,
                              capture_output=True, text=True)  # fmt: skip
        w, c, kib = proc.stdout.strip().splitlines()[-1].split()
        wall.append(float(w))
        cpu.append(float(c))
        rss.append(int(kib) * 1024)
    return Measured(statistics.median(wall), statistics.median(cpu), max(rss))


def pickle_load(path: Path, runs: int) -> Measured:
    code = "import pickle, sys\nwith open(sys.argv[1], 'rb') as f: pickle.load(f)"
    return measured([sys.executable, "-c", code, str(path)], runs)


def analyze(path: Path, runs: int, keep_html: Path | None = None) -> Measured:
    """``nsysfrag analyze --json --html`` of ``path``; the page is kept as ``keep_html``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        html = keep_html or out / "r.html"
        cmd = [sys.executable, "-m", "nsysfrag", "analyze", str(path), "--json", str(out / "r.json"),
               "--html", str(html), "-q"]  # fmt: skip
        return measured(cmd, runs)


def html_open_s(page: Path, runs: int) -> float:
    """Seconds ``page`` takes to open in headless Chromium (NaN without a Chromium)."""
    return open_seconds(page, max(runs, 3)) if find_chromium() else float("nan")


def replay_rate(path: Path, runs: int) -> tuple[float, float, int]:
    """Entries per second (wall, CPU) of the compiled replay of device 0, the columns already
    in memory: the window's start, the replay, and the outputs as the Python reference returns
    them; medians of ``runs``."""
    from nsysfrag.inputs.torch_snapshot.columns import read_snapshot_columns
    from nsysfrag.inputs.torch_snapshot.spaces import columns_events
    from nsysfrag.models.segments.compiled import replay_device
    from nsysfrag.models.segments.rules import AllocatorSettings

    columns = read_snapshot_columns(path)
    events, timestamps = columns_events(columns, 0)
    final = [s for s in columns.segments if s.device == 0]
    settings = AllocatorSettings(
        columns.roundup_power2_divisions, columns.max_split_size, columns.expandable_segments
    )
    entries = len(events)
    wall, cpu = [], []
    for _ in range(runs):
        w, c = time.perf_counter(), time.process_time()
        replay_device(events, final, settings, timestamps)
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return entries / statistics.median(wall), entries / statistics.median(cpu), entries


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
    targets: list[tuple[str, float, float, str]] = []
    for n in args.sizes:
        need = NEEDS_AVAILABLE_GIB.get(n, 0)
        if available_gib() < need:
            rows.append(
                (f"{n:,} entries", f"not run: {available_gib():.1f} GiB available, needs {need}")
            )
            continue
        path = big_snapshot(n)
        load = pickle_load(path, args.runs)
        page = path.with_suffix(".html")
        run = analyze(path, args.runs, keep_html=page)
        rows.append((f"{n:,} entries, {path.stat().st_size / 1e6:,.0f} MB pickle", ""))
        for name, m in (("pickle.load (process)", load), ("nsysfrag analyze --json --html", run)):
            figures = f"{m.wall_s:.2f} s wall, {m.cpu_s:.2f} s CPU, {m.rss / 2**20:,.0f} MiB RSS"
            rows.append((f"  {name}", figures))
        ratios = (run.wall_s / load.wall_s, run.cpu_s / load.cpu_s, run.rss / load.rss)
        rows.append(("  ratio", "{:.2f}x wall, {:.2f}x CPU, {:.2f}x RSS".format(*ratios)))
        page_mb, opens = page.stat().st_size / 1e6, html_open_s(page, args.runs)
        rows.append(("  the HTML report", f"{page_mb:.2f} MB, opens in {opens:.2f} s (Chromium)"))
        if n <= 1_000_000:
            wall_rate, cpu_rate, _ = replay_rate(path, max(args.runs, 3))
            rates = f"{wall_rate / 1e6:.2f} M entries/s wall, {cpu_rate / 1e6:.2f} M/s CPU"
            rows.append(("  replay alone", rates))
        if n == 1_000_000:
            targets += [
                # Issue 37 item 3: no slower than pickle.load, and less memory than its tree.
                ("1M end to end / pickle.load (wall)", run.wall_s / load.wall_s, 1.0, "<="),
                ("1M end to end / pickle.load (CPU)", run.cpu_s / load.cpu_s, 1.0, "<="),
                ("1M peak RSS / pickle.load's", run.rss / load.rss, 0.9, "<="),
                ("replay M entries/s (wall)", wall_rate / 1e6, 2.0, ">="),
                ("replay M entries/s (CPU)", cpu_rate / 1e6, 2.0, ">="),
                ("1M HTML size (MB)", page_mb, 5.0, "<="),
                ("1M HTML opens in Chromium (s)", opens, 3.0, "<="),
            ]
        if n == 5_000_000:
            targets.append(("5M completes (wall s)", run.wall_s, float("inf"), "<="))
    width = max(len(r[0]) for r in rows)
    for name, text in rows:
        print(f"{name:<{width}}  {text}")
    print()
    for name, value, limit, op in targets:
        ok = value <= limit if op == "<=" else value >= limit
        print(f"{name}: {value:.2f} vs {op} {limit:.2f}: {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()

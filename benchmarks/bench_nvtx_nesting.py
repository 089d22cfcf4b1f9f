"""Benchmark site resolution on deeply nested NVTX ranges (issue 16).

    python benchmarks/bench_nvtx_nesting.py

Each trace nests N push/pop ranges with 1,000-character names on one thread, with an allocation
at the innermost depth only, or at every depth (N distinct sites). Before the trie of sites,
resolution built a site string per range boundary: 1,000 ranges took 5.4 s and 1.1 GB, 2,000
took 23.5 s and 4.0 GB, and 5,000 ended in MemoryError past 3.7 GB on a 7 MB file. Prints a
table, then one machine-readable line per target: `target name: measured vs limit: PASS|FAIL`.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_analyze import end_to_end, median_seconds

from nsysfrag.analysis import analyze
from nsysfrag.inputs.nsys import read_export
from nsysfrag.testing.nsys_export import nested_nvtx_export

NAME_CHARS = 1000
SECONDS_LIMIT = 10.0
RSS_LIMIT = 1 << 30


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranges in (1000, 2000, 5000):
            for every in (False, True):
                path = nested_nvtx_export(Path(tmp) / f"n{ranges}{every}.sqlite", ranges, NAME_CHARS, every)
                seconds, rss = end_to_end(path)
                inside = median_seconds(lambda p=path: analyze(read_export(p)))
                rows.append((ranges, every, path.stat().st_size, seconds, rss, inside))
    print(f"{'ranges':>7} {'allocations at':>15} {'file':>9} {'read+analyze':>13}"
          f" {'whole command':>14} {'peak RSS':>10}")
    for ranges, every, size, seconds, rss, inside in rows:
        where = "every depth" if every else "innermost"
        print(f"{ranges:>7,} {where:>15} {size / 2**20:>7.1f} MB {inside:>11.2f} s"
              f" {seconds:>12.2f} s {rss / 2**20:>6.0f} MiB")
    print()
    for ranges, every, _, seconds, rss, _inside in rows:
        if ranges != 5000:
            continue
        name = f"5,000 nested ranges, {NAME_CHARS:,}-char names, allocations at " + (
            "every depth" if every else "the innermost"
        )
        print(f"{name}, time: {seconds:.2f} s vs {SECONDS_LIMIT:.0f} s: "
              f"{'PASS' if seconds <= SECONDS_LIMIT else 'FAIL'}")
        print(f"{name}, peak RSS: {rss / 2**20:.0f} MiB vs {RSS_LIMIT / 2**20:.0f} MiB: "
              f"{'PASS' if rss <= RSS_LIMIT else 'FAIL'}")


if __name__ == "__main__":
    main()

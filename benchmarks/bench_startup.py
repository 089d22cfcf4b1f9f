"""Cold and warm start of the command line: the first run after installing, and a later one.

    python benchmarks/bench_startup.py                  # 3 rounds
    python benchmarks/bench_startup.py --rounds 5
    python benchmarks/bench_startup.py --compiled       # also what compiling costs (slow)

Each round gives each command a fresh, empty kernel cache (``XDG_CACHE_HOME`` pointed at a
temporary folder), then times, process start to exit, its first and its second run:
``nsysfrag analyze`` of the sample trace and of the sample snapshot, and ``nsysfrag whatif`` of
the sample snapshot (``-q --json``: the same work as the terminal report, less the printing).
Samples this small run the kernels interpreted (nsysfrag.interpreted), so nothing compiles
while the user waits: the first run starts a compiler in the background
(nsysfrag.background_compile), which the round waits for (its seconds are the ``background``
figure) before the later run, which then loads the compiled kernels; ``--compiled`` adds
the same runs with ``NSYSFRAG_KERNELS=compiled``: what the first run of an
input too large to interpret pays, compiling (the figure the docs quote). It prints the
medians, whether a first run compiled, the machine's load average before and after (other work
on the machine slows everything down: compare figures taken at a similar load), and one line
per target: ``target NAME: measured vs limit: PASS|FAIL``.
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
sys.path.insert(0, str(REPO))
from nsysfrag import background_compile  # noqa: E402  (this checkout's, whatever is installed)

TRACE = REPO / "sample_traces" / "inference_serving.sqlite"
SNAPSHOT = REPO / "sample_traces" / "training_snapshot.pickle"
# Issue 26's aims on a quiet 2-core machine: a first run in seconds, a later one within one.
COLD_ANALYZE_LIMIT_S = 3.0
COLD_WHATIF_LIMIT_S = 8.0
WARM_LIMIT_S = 1.0


def timed(argv: list[str], cache: Path, kernels: str | None) -> tuple[float, str]:
    """Seconds from process start to exit, and what the command said on stderr."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(REPO)}
    for name in ("NUMBA_CACHE_DIR", "NSYSFRAG_KERNELS", "CI", background_compile.ENVIRONMENT):
        env.pop(name, None)  # as a user runs it: the background compiler on
    if kernels is not None:
        env["NSYSFRAG_KERNELS"] = kernels
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "nsysfrag", *argv], env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"nsysfrag {' '.join(argv)} failed: {proc.stderr}")
    return elapsed, proc.stderr.strip()


RUNS = {
    "analyze trace": ["analyze", str(TRACE), "-q", "--json", os.devnull],
    "analyze snapshot": ["analyze", str(SNAPSHOT), "-q", "--json", os.devnull],
    "whatif snapshot": ["whatif", str(SNAPSHOT), "-q", "--json", os.devnull],
}


def wait_for_compiler(cache: Path, limit_s: float = 900) -> float:
    """Seconds until the compiler a first run left behind is done (about 0 when it left none)."""
    root = cache / "nsysfrag"
    started = time.perf_counter()
    while list(root.glob("pending-compile-*")) or (
        root.is_dir() and background_compile.running(root)
    ):
        if time.perf_counter() - started > limit_s:
            raise SystemExit(f"the background compiler in {root} ran for over {limit_s:.0f} s")
        time.sleep(0.1)
    return time.perf_counter() - started


def one_round(kernels: str | None, compiled: dict[str, bool]) -> dict[str, float]:
    """Each run's first and second time, each with a cache of its own; ``compiled`` records
    whether a first run compiled (it says so on stderr)."""
    suffix = "" if kernels is None else f" ({kernels})"
    figures = {}
    for name, argv in RUNS.items():
        with tempfile.TemporaryDirectory(prefix="nsysfrag-bench-cache-") as folder:
            cold, said = timed(argv, Path(folder), kernels)
            compiled[name + suffix] = "compiling" in said
            figures[f"{name}{suffix} background"] = wait_for_compiler(Path(folder))
            warm, said = timed(argv, Path(folder), kernels)
            if said:
                raise SystemExit(f"the second {name} said {said!r}; it should load from cache")
        figures[f"{name}{suffix} first"], figures[f"{name}{suffix} later"] = cold, warm
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compiled", action="store_true",
                        help="also time the runs with NSYSFRAG_KERNELS=compiled")  # fmt: skip
    args = parser.parse_args()
    load_before = os.getloadavg()
    compiled: dict[str, bool] = {}
    ways: list[str | None] = [None, "compiled"] if args.compiled else [None]
    rounds = [{k: v for way in ways for k, v in one_round(way, compiled).items()}
              for _ in range(args.rounds)]  # fmt: skip
    load_after = os.getloadavg()
    print(f"{os.cpu_count()} CPUs; load average (1, 5, 15 min) before"
          f" {', '.join(f'{x:.2f}' for x in load_before)}, after"
          f" {', '.join(f'{x:.2f}' for x in load_after)}")  # fmt: skip
    print(f"{'':36}{'median':>9}{'min':>9}{'max':>9}   ({args.rounds} rounds)")
    medians = {}
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        medians[key] = statistics.median(values)
        print(f"{key:36}{medians[key]:8.2f}s{min(values):8.2f}s{max(values):8.2f}s")
    for name, did in compiled.items():
        print(f"first {name}: {'compiled kernels' if did else 'compiled nothing'}")
    for name in RUNS:
        first_limit = COLD_WHATIF_LIMIT_S if name.startswith("whatif") else COLD_ANALYZE_LIMIT_S
        for when, limit in (("first", first_limit), ("later", WARM_LIMIT_S)):
            value = medians[f"{name} {when}"]
            verdict = "PASS" if value <= limit else "FAIL"
            print(f"target {when} {name}: {value:.2f} s vs {limit:.1f} s: {verdict}")


if __name__ == "__main__":
    main()

"""Cold and warm start of the command line: the first run after installing, and a later one.

    python benchmarks/bench_startup.py                  # 3 rounds
    python benchmarks/bench_startup.py --rounds 5
    python benchmarks/bench_startup.py --compiled       # also what compiling costs (slow)
    python benchmarks/bench_startup.py --commands       # each small command's start-up only

``--commands`` times, with the kernels cached and then as a first run (an empty cache), each
small command a user types most: ``--help``, ``analyze`` and ``whatif`` of a sample,
``compare`` of two documents, ``history`` of a database of two runs; per command its median
wall time and peak RSS, and, from one more run of it inside a probe that reports what the
process imported, whether numba was loaded, how many modules and which of the heavy packages
(numba, pandas, matplotlib, sqlalchemy, scipy).

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
import json
import os
import shutil
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


HEAVY = ("numba", "llvmlite", "pandas", "matplotlib", "sqlalchemy", "scipy", "rich")
# The command line run in the probe's own process; at its end, what the process imported.
_PROBE = r"""
import json, sys
from nsysfrag import cli
try:
    cli.main(sys.argv[2:])
except SystemExit:
    pass
heavy = [name for name in sys.argv[1].split(",") if name in sys.modules]
sys.stderr.write("PROBE " + json.dumps({"modules": len(sys.modules), "heavy": heavy}) + "\n")
"""


def measured(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Seconds from start to exit and the peak RSS (MiB) of one run of ``argv``."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    stderr = proc.stderr.read().decode() if proc.stderr is not None else ""
    if os.waitstatus_to_exitcode(status) not in (0, 1):  # 1: a gate or a regression tripped
        raise SystemExit(f"{' '.join(argv)} failed: {stderr}")
    return elapsed, usage.ru_maxrss / 1024  # KiB on Linux


def command_startup(rounds: int) -> None:
    """The ``--commands`` table (see the module's docstring)."""
    with tempfile.TemporaryDirectory(prefix="nsysfrag-bench-commands-") as folder:
        work = Path(folder)
        env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(work / "cache"),
               background_compile.ENVIRONMENT: "off"}  # fmt: skip
        for name in ("NUMBA_CACHE_DIR", "NSYSFRAG_KERNELS", "NSYSFRAG_DB"):
            env.pop(name, None)
        db = work / "history.sqlite"
        nsysfrag = [sys.executable, "-m", "nsysfrag"]
        for doc in ("a.json", "b.json"):  # two documents for compare, two runs for history
            subprocess.run([*nsysfrag, "analyze", str(TRACE), "-q", "--json", str(work / doc),
                            "--record", "--db", str(db)], env=env, check=True)  # fmt: skip
        commands = {
            "--help": ["--help"],
            "analyze trace": ["analyze", str(TRACE), "-q", "--json", os.devnull],
            "analyze snapshot": ["analyze", str(SNAPSHOT), "-q", "--json", os.devnull],
            "whatif snapshot": ["whatif", str(SNAPSHOT), "-q", "--json", os.devnull],
            "compare": ["compare", str(work / "a.json"), str(work / "b.json")],
            "history": ["history", "--db", str(db)],
        }
        print(f"{'':26}{'cached':>19}{'first run':>19}   (median of {rounds}; heavy imports)")
        for name, argv in commands.items():
            row = []
            for cached in (True, False):
                cache = work / ("cache" if cached else "empty")
                way = {**env, "XDG_CACHE_HOME": str(cache)}
                if cached:  # fill it: the kernels this command runs, compiled once
                    measured([*nsysfrag, *argv], {**way, "NSYSFRAG_KERNELS": "compiled"})
                runs = []
                for _ in range(rounds):
                    shutil.rmtree(work / "empty", ignore_errors=True)
                    runs.append(measured([*nsysfrag, *argv], way))
                seconds = statistics.median(r[0] for r in runs)
                rss = statistics.median(r[1] for r in runs)
                probe = subprocess.run([sys.executable, "-c", _PROBE, ",".join(HEAVY), *argv],
                                       env=way, capture_output=True, text=True, check=False)  # fmt: skip
                said = [line for line in probe.stderr.splitlines() if line.startswith("PROBE ")]
                found = json.loads(said[-1][6:]) if said else {"modules": 0, "heavy": ["?"]}
                row.append(f"{seconds:6.2f} s {rss:5.0f} MiB  {found['modules']:4d} modules"
                           f" {'+'.join(found['heavy']) or '-'}")  # fmt: skip
            print(f"{name:26}" + "   |   ".join(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compiled", action="store_true",
                        help="also time the runs with NSYSFRAG_KERNELS=compiled")  # fmt: skip
    parser.add_argument("--commands", action="store_true",
                        help="only each small command's start-up and imports")  # fmt: skip
    args = parser.parse_args()
    if args.commands:
        print(f"load average before {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        command_startup(args.rounds)
        print(f"load average after {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return
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

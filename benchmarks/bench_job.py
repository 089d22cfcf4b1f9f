"""Benchmark a job of 4 ranks (issue 12): the local pool against --jobs 1, and a Dask cluster.

    python benchmarks/bench_job.py                 # 4 ranks of 200 k events, 3 runs each
    python benchmarks/bench_job.py --events 2000000
    python benchmarks/bench_job.py --baseline ../other-checkout   # its nsysfrag timed alongside

Each rank is a random-churn trace of its own seed (benchmarks/churn_trace.py). Timed, process
start to exit, medians of interleaved runs:

- ``nsysfrag analyze rank*.sqlite`` (the default pool) against ``--jobs 1`` (one after the
  other, in-process): target >= 1.7x faster, limit 1.5x;
- the same job with ``--scheduler`` on a dask.distributed LocalCluster (2 worker processes of
  one thread, started before and warmed by one untimed job, as an existing cluster is) against
  the pool: target overhead <= 15 %.

Also, inside one process with the analysis already loaded, the pool against running the ranks
one by one: the part a pool can speed up, without the interpreter's start and imports that
both pay once; the difference in CPU is what each forked worker costs beyond its analyses (its
start-up). Each end-to-end figure comes with the CPU seconds of all its processes, and the
start alone (interpreter, imports, compiled code: what the coordinator loads before it forks)
is timed too: from those, Amdahl's law gives the speed-up the cores give on an idle machine —
all that --jobs 1 spends beside its analyses is serial, the rest of the pool's CPU spreads over
the workers. That bound takes --jobs 1 to keep one core busy; it keeps more (a rank reads its
tables on several threads), so the ceiling line divides --jobs 1's own wall time by the least
the pool can take with no overhead at all: the start, then the analyses' CPU spread over the
cores. The machine's load average is printed with the figures: on a shared machine the wall
times move with it, CPU times much less.

``--baseline DIR`` times another checkout's nsysfrag (by PYTHONPATH, the same interpreter and
packages) in the same interleaved end-to-end runs: before and after a change, under one load.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from churn_trace import churn_trace

RANKS = 4
RUNS = 3
# What the coordinator loads before it forks its workers, for a job of traces.
STARTUP = (
    "import sys, nsysfrag.cli, nsysfrag.commands.analyze, nsysfrag.job.command;"
    " from nsysfrag.job.pool import _load_analysis; from nsysfrag.job.worker import RankTask;"
    " _load_analysis([RankTask(0, sys.argv[1], None, 512)]);"
    " import os; os._exit(0)"  # as nsysfrag leaves (cli.run): no teardown, a fifth of a second
)


def load() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def job_folder(events: int, where: Path) -> Path:
    folder = where / "job"
    folder.mkdir()
    for rank in range(RANKS):
        (folder / f"rank{rank}.sqlite").symlink_to(churn_trace(events, seed=rank + 1))
    return folder


Timing = tuple[float, float, float, float]  # wall s, CPU s, of which system s, page faults


def timed(cmd: list[str]) -> Timing:
    """Wall seconds of ``cmd``, and the CPU seconds of it and every process it started, the
    system part of those, and their page faults: a count the machine's load does not move,
    where a loaded machine's CPU seconds drift by a tenth."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "DASK_SCHEDULER_ADDRESS": ""})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    system = after.ru_stime - before.ru_stime
    return wall, (after.ru_utime - before.ru_utime) + system, system, after.ru_minflt - before.ru_minflt


def interleaved(commands: dict[str, list[str]], runs: int = RUNS) -> dict[str, Timing]:
    """Medians of each command's :func:`timed` figures, run in turns so that load drifts hit
    them alike."""
    for cmd in commands.values():  # untimed: compiled-code caches warm, files in page cache
        timed(cmd)
    times: dict[str, list[Timing]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, cmd in commands.items():
            times[name].append(timed(cmd))
    return {
        name: tuple(statistics.median(run[i] for run in t) for i in range(4))  # type: ignore[misc]
        for name, t in times.items()
    }


@dataclass(frozen=True, slots=True)
class InProcess:
    """Medians of the ranks analyzed with the analysis already loaded (as the pool forks)."""

    size: int  # the pool's workers
    pooled_wall: float
    pooled_cpu: float  # every worker's CPU seconds, and the coordinator's
    serial_wall: float
    serial_cpu: float  # one by one, here (threads included)

    @property
    def worker_startup_cpu(self) -> float:
        """CPU seconds a forked worker spends beyond the analyses it runs (its start, its
        copies of shared pages, sending its documents back)."""
        return (self.pooled_cpu - self.serial_cpu) / self.size


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds of this process (threads included) and of its children that ended."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def in_process(folder: Path, runs: int = RUNS) -> InProcess:
    """The pool against one by one, inside this process, the analysis loaded once."""
    from nsysfrag.job.pool import _load_analysis, plan_pool, run_pool
    from nsysfrag.job.worker import RankTask

    tasks = [RankTask(r, str(folder / f"rank{r}.sqlite"), None, 512) for r in range(RANKS)]
    _load_analysis(tasks)  # imported and compiled code loaded, as the pool does before forking
    size = plan_pool(folder / "rank0.sqlite", RANKS).size

    def measured(fn: Callable[[], object]) -> tuple[float, float]:
        own, children = cpu_seconds()
        started = time.perf_counter()
        fn()
        wall = time.perf_counter() - started
        own_after, children_after = cpu_seconds()
        return wall, (own_after - own) + (children_after - children)

    samples: dict[str, list[tuple[float, float]]] = {"pool": [], "serial": []}
    run_pool(tasks, size)  # untimed, as the end-to-end runs
    for _ in range(runs):  # interleaved, as the end-to-end runs
        samples["pool"].append(measured(lambda: run_pool(tasks, size)))
        samples["serial"].append(measured(lambda: run_pool(tasks, 1)))
    pool, serial = (
        (statistics.median(w for w, _ in samples[k]), statistics.median(c for _, c in samples[k]))
        for k in ("pool", "serial")
    )
    return InProcess(size, pool[0], pool[1], serial[0], serial[1])


def dask_overhead(base: list[str]) -> tuple[float, float] | None:
    try:
        from distributed import LocalCluster
    except ImportError:
        print("dask.distributed is not installed: no Dask figure (pip install 'nsysfrag[dask]')")
        return None
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        got = interleaved({"pool": base, "dask": [*base, "--scheduler", cluster.scheduler_address]})
    return got["pool"][0], got["dask"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="events per rank")
    parser.add_argument("--no-dask", action="store_true", help="skip the Dask LocalCluster figure")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="another checkout whose nsysfrag runs end to end alongside")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folder = job_folder(args.events, Path(tmp))
        base = [sys.executable, "-m", "nsysfrag", "analyze", str(folder), "--json", str(Path(tmp, "out.json")), "-q"]
        print(f"{RANKS} ranks of {args.events:,} events, {os.cpu_count()} cores; load average before: {load()}")
        commands = {"pool": base, "serial": [*base, "--jobs", "1"]}
        if args.baseline is not None:
            # env(1) sets the path and execs: the timed process is still the interpreter. It runs
            # in DIR: ``python -m`` puts the working folder first, ahead of PYTHONPATH.
            other = ["env", "-C", str(args.baseline.resolve()), f"PYTHONPATH={args.baseline.resolve()}"]
            commands |= {"baseline pool": [*other, *base], "baseline serial": [*other, *base, "--jobs", "1"]}
        got = interleaved(commands)
        startup = interleaved({"startup": [sys.executable, "-c", STARTUP, str(folder / "rank0.sqlite")]})["startup"]
        inside = in_process(folder)
        overhead = None if args.no_dask else dask_overhead(base)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        # Amdahl on idle cores: what --jobs 1 spends beside its analyses (the start, the job's
        # report) is serial; the rest of the pool's CPU (the workers: their start-up and their
        # analyses) spreads over the cores. A shared machine moves wall times a lot, CPU little.
        spread = min(cores, inside.size)
        serial_part = got["serial"][1] - inside.serial_cpu
        bound = got["serial"][1] / (serial_part + (got["pool"][1] - serial_part) / spread)
        ceiling = got["serial"][0] / (startup[0] + inside.serial_cpu / spread)
        def figures(t: Timing) -> str:
            return f"{t[0]:.2f} s ({t[1]:.2f} s CPU, {t[2]:.2f} system; {t[3] / 1000:,.0f} k page faults)"

        rows = [
            ("nsysfrag analyze (default pool), end to end", figures(got["pool"])),
            ("nsysfrag analyze --jobs 1, end to end", figures(got["serial"])),
            ("start alone: interpreter, imports, compiled code", f"{startup[0]:.2f} s ({startup[1]:.2f} s CPU)"),
            (f"in-process, analysis loaded: pool of {inside.size}", f"{inside.pooled_wall:.2f} s ({inside.pooled_cpu:.2f} s CPU)"),
            ("in-process, analysis loaded: one by one", f"{inside.serial_wall:.2f} s ({inside.serial_cpu:.2f} s CPU)"),
            ("a forked worker's start-up (CPU beyond its analyses)", f"{inside.worker_startup_cpu:.3f} s CPU"),
            ("a worker started afresh instead (spawn: the start alone)", f"{startup[1]:.2f} s CPU"),
        ]
        if args.baseline is not None:
            rows.insert(2, ("baseline: default pool, end to end", figures(got["baseline pool"])))
            rows.insert(3, ("baseline: --jobs 1, end to end", figures(got["baseline serial"])))
        if overhead is not None:
            rows.append(("pool, end to end (alongside the Dask runs)", f"{overhead[0]:.2f} s"))
            rows.append(("--scheduler on a LocalCluster (2 workers), end to end", f"{overhead[1]:.2f} s"))
        width = max(len(r[0]) for r in rows)
        for name, value in rows:
            print(f"{name:<{width}}  {value}")
        print(f"load average after: {load()}")
        print(
            f"serial part of --jobs 1's CPU (all but the analyses): {serial_part:.2f} s,"
            f" {serial_part / got['serial'][1]:.0%}; the start alone is {startup[1] / got['serial'][1]:.0%}"
        )
        print(f"speed-up on {spread} idle cores, from the CPU times above (Amdahl): {bound:.2f}x")
        print(
            f"--jobs 1 keeps {got['serial'][1] / got['serial'][0]:.2f} cores busy; ceiling with no pool"
            f" overhead at all, --jobs 1's wall / (start + analyses' CPU / {spread}): {ceiling:.2f}x"
            " (wall times: read it on a quiet machine)"
        )
        if args.baseline is not None:
            print(
                f"baseline: pool speed-up over --jobs 1, end to end"
                f" {got['baseline serial'][0] / got['baseline pool'][0]:.2f}x; its pool's CPU"
                f" {got['baseline pool'][1]:.2f} s ({got['baseline pool'][2]:.2f} system,"
                f" {got['baseline pool'][3] / 1000:,.0f} k page faults) against {got['pool'][1]:.2f} s"
                f" ({got['pool'][2]:.2f}, {got['pool'][3] / 1000:,.0f} k) here"
            )
        print()
        targets = [
            ("pool speed-up over --jobs 1, end to end", got["serial"][0] / got["pool"][0], 1.7, 1.5, ">="),
            ("pool speed-up over --jobs 1, on idle cores from CPU times", bound, 1.7, 1.5, ">="),
            ("pool speed-up, analysis loaded", inside.serial_wall / inside.pooled_wall, 1.7, 1.5, ">="),
        ]
        if overhead is not None:
            targets.append(("Dask LocalCluster overhead over the pool", overhead[1] / overhead[0] - 1, 0.15, 0.15, "<="))
        for name, measured, target, limit, op in targets:
            if op == ">=":
                verdict = "PASS" if measured >= target else ("within limit" if measured >= limit else "FAIL")
            else:
                verdict = "PASS" if measured <= target else "FAIL"
            print(f"{name}: {measured:.2f} vs target {op} {target:.2f}: {verdict}")


if __name__ == "__main__":
    main()

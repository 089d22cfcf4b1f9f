"""The local process pool: ranks analyzed side by side, sized by cores and by memory.

Our own few processes rather than ``multiprocessing.Pool`` or ``ProcessPoolExecutor``: those
cannot tell which task a dead worker was running (a pool breaks, or hangs), and a rank whose
worker dies — the out-of-memory killer is the usual cause — must be retried once and then
reported, while the other ranks go on. Each worker runs one rank at a time, so the coordinator
always knows whose rank died.

Workers are forked after the analysis code is imported and its compiled code loaded, so each
starts at once and shares those pages; they sit in their own process group, so that stopping the job (Ctrl-C,
SIGTERM) also stops an ``nsys export`` a worker started, and nothing is left behind.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from pathlib import Path

from nsysfrag.inputs.nsys import REPORT_SUFFIXES
from nsysfrag.inputs.torch_snapshot.reader import SNAPSHOT_SUFFIXES
from nsysfrag.job.worker import RankOutcome, RankTask, analyze_rank, failed

# Memory a worker needs, the way HolisticTraceAnalysis sizes its parsing pool: a fixed part and
# a multiple of the input's size. Measured (peak RSS, `ru_maxrss`) on the benchmark's churn
# traces and the genuine snapshots: a process with the analysis imported and compiled holds
# 156 MiB; an nsys export then adds 3.3 B per file byte (2 M events, 166 MiB file) to 4.0 B
# (200 k events, 16 MiB); a snapshot pickle 4.2–6.8 B per byte (2.3–3.7 MiB genuine
# snapshots; the dicts of a pickle take more room than SQLite pages). Rounded up.
WORKER_BASE_BYTES = 160 << 20
BYTES_PER_INPUT_BYTE = {"sqlite": 4.0, "snapshot": 8.0}
# A .nsys-rep is analyzed through its SQLite export; before the first export its size is
# unknown, so the report's own size stands in, times this (an assumption, not a measurement:
# exports we have seen were a few times larger than their compressed reports).
REPORT_EXPORT_RATIO = 3.0
# Leave this share of the available memory to everything else.
MEMORY_HEADROOM = 0.8
# glibc's malloc (mallopt's parameters, malloc.h): a worker keeps the memory its analyses free
# for the next allocations instead of handing it back to the kernel, which hands back fresh
# pages that fault (and are zeroed) one by one when written. glibc raises its own thresholds
# to these only after a process's first large frees, so every fresh worker paid for its first
# rank's pages anew: measured on 4 ranks of 1 M events (benchmarks/bench_job.py's in-process
# pool of 2, load 11), 200 k page faults and ~1.2 s of system CPU per job; 115 k and ~0.7 s
# with these, the workers' peak RSS 400 -> 416-443 MiB. A worker lives for one job, and the
# pool already counts its peak (worker_bytes): what it keeps between ranks, the plan had counted.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
KEEP_FREED_BYTES = 1 << 30  # at the top of the heap, before any is given back
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's own ceiling for the threshold it adjusts
RETRIES = 1  # a rank whose worker died is run once more, then reported as failed
POLL_SECONDS = 0.25  # how often the coordinator looks up (progress, dead workers)


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """How many workers, and why that many."""

    size: int
    cores: int
    worker_bytes: int
    available_bytes: int | None
    requested: int | None = None  # --jobs

    def reason(self) -> str:
        if self.requested is not None:
            return f"--jobs {self.requested}"
        memory = (
            f"{self.available_bytes / 2**30:.1f} GiB available at ~{self.worker_bytes / 2**20:,.0f}"
            " MiB per worker"
            if self.available_bytes is not None
            else "available memory unknown"
        )
        return f"{self.cores} cores, {memory}"


def plan_pool(first_input: Path, ranks: int, jobs: int | None = None) -> PoolPlan:
    """``--jobs`` when given, else as many workers as cores and memory allow (and ranks need)."""
    cores = usable_cores()
    need = worker_bytes(first_input)
    available = available_memory()
    if jobs is not None:
        return PoolPlan(max(1, min(jobs, ranks)), cores, need, available, requested=jobs)
    by_memory = cores if available is None else max(1, int(available * MEMORY_HEADROOM // need))
    return PoolPlan(max(1, min(cores, by_memory, ranks)), cores, need, available)


def worker_bytes(path: Path) -> int:
    """The memory one worker needs for an input like ``path`` (see BYTES_PER_INPUT_BYTE)."""
    try:
        size = path.stat().st_size
    except OSError:
        return WORKER_BASE_BYTES
    name = path.name.lower()
    if name.endswith(SNAPSHOT_SUFFIXES):
        return WORKER_BASE_BYTES + int(size * BYTES_PER_INPUT_BYTE["snapshot"])
    if name.endswith(REPORT_SUFFIXES):
        export = path.with_name(name[: name.rindex(".")] + ".sqlite")
        if export.is_file():
            size = export.stat().st_size
        else:
            size = int(size * REPORT_EXPORT_RATIO)
    return WORKER_BASE_BYTES + int(size * BYTES_PER_INPUT_BYTE["sqlite"])


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """MemAvailable, or less where a cgroup (a container, a batch job) caps this process."""
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            room = int(limit) - used
            available = room if available is None else min(available, room)
    except (OSError, ValueError):
        pass
    return available


Progress = Callable[[int, int], None]  # (ranks done, ranks in all)


def run_pool(
    tasks: Sequence[RankTask], size: int, progress: Progress | None = None
) -> list[RankOutcome]:
    """Every task's outcome, in any order; ``size`` 1 runs them here, one after the other."""
    if size <= 1:
        outcomes: list[RankOutcome] = []
        for task in tasks:
            if progress is not None:
                progress(len(outcomes), len(tasks))
            outcomes.append(analyze_rank(task))
        return outcomes
    with _stop_on_sigterm():
        return _Pool(size).run(tasks, progress)


def largest_first(tasks: Sequence[RankTask]) -> list[RankTask]:
    """The tasks, the largest input first (ties in rank order): a long rank started last would
    leave the other workers idle while it ends the job alone. The outcomes are sorted by rank
    afterwards, so the order changes no report."""
    return sorted(tasks, key=lambda task: -worker_bytes(Path(task.path)))


class _Worker:
    def __init__(self, context: BaseContext) -> None:
        ours, theirs = context.Pipe(duplex=True)
        self.process: BaseProcess = context.Process(  # type: ignore[attr-defined]
            target=_serve, args=(theirs, os.getpid()), daemon=True, name="nsysfrag-rank"
        )
        self.process.start()
        theirs.close()
        self.conn: Connection = ours
        self.task: RankTask | None = None
        pid = self.process.pid
        assert pid is not None
        try:  # the child does it too; whichever runs first wins the race, both agree
            os.setpgid(pid, pid)
        except OSError:
            pass

    def give(self, task: RankTask) -> None:
        self.task = task
        self.conn.send(task)

    def stop(self) -> None:
        """Ask an idle worker to leave."""
        try:
            self.conn.send(None)
        except OSError:
            pass

    def kill(self, sig: int) -> None:
        """Signal the worker's whole group (an nsys export it started included)."""
        pid = self.process.pid
        if pid is None:
            return
        try:
            os.killpg(pid, sig)
        except OSError:
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def death(self) -> str:
        """Reap a worker that died and say how it died."""
        self.kill(signal.SIGKILL)  # half-dead (its pipe broke, say): make sure it is gone
        self.process.join(5)
        self.conn.close()
        code = self.process.exitcode
        if code is None:
            return "its worker stopped answering"
        if code < 0:
            name = signal.Signals(-code).name
            why = " (the out-of-memory killer sends it)" if -code == signal.SIGKILL else ""
            return f"its worker was killed by {name}{why}"
        return f"its worker exited with code {code}"


class _Pool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.context = _context()
        self.workers: list[_Worker] = []

    def run(self, tasks: Sequence[RankTask], progress: Progress | None) -> list[RankOutcome]:
        if self.context.get_start_method() == "fork":
            _load_analysis(tasks)  # before forking, so every worker starts with it
        queue = deque(largest_first(tasks))
        deaths: dict[int, int] = {}
        outcomes: list[RankOutcome] = []
        try:
            while queue or any(w.task is not None for w in self.workers):
                while queue and (idle := self._idle_worker()) is not None:
                    idle.give(queue.popleft())
                if progress is not None:
                    progress(len(outcomes), len(tasks))
                busy = [w for w in self.workers if w.task is not None]
                ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy], POLL_SECONDS)
                for worker in busy:
                    if worker.conn not in ready and worker.process.sentinel not in ready:
                        continue
                    task = worker.task
                    assert task is not None
                    outcome = self._receive(worker)
                    if outcome is not None:
                        outcomes.append(outcome)
                        continue
                    self.workers.remove(worker)
                    how = worker.death()
                    deaths[task.rank] = deaths.get(task.rank, 0) + 1
                    if deaths[task.rank] <= RETRIES:
                        queue.appendleft(task)
                    else:
                        outcomes.append(failed(
                            task.rank, task.path,
                            f"{how}, and again when retried; it may need more memory than a"
                            " worker has: analyze it alone, or give the job fewer --jobs",
                        ))
            if progress is not None:
                progress(len(outcomes), len(tasks))
            return outcomes
        finally:
            self._shut_down()

    def _idle_worker(self) -> _Worker | None:
        for worker in self.workers:
            if worker.task is None:
                return worker
        if len(self.workers) < self.size:
            self.workers.append(_Worker(self.context))
            return self.workers[-1]
        return None

    @staticmethod
    def _receive(worker: _Worker) -> RankOutcome | None:
        """The worker's outcome, or None when it died instead of answering."""
        try:
            if worker.conn.poll():
                outcome: RankOutcome = worker.conn.recv()
                worker.task = None
                return outcome
        except (EOFError, OSError):
            pass
        return None

    def _shut_down(self) -> None:
        """Idle workers are asked to leave; busy ones (an interrupted job) are stopped."""
        for worker in self.workers:
            if worker.task is None:
                worker.stop()
            else:
                worker.kill(signal.SIGTERM)
        for worker in self.workers:
            worker.process.join(2)
            if worker.process.is_alive():
                worker.kill(signal.SIGKILL)
                worker.process.join()
            worker.conn.close()
        self.workers = []


def _serve(conn: Connection, coordinator: int) -> None:
    """A worker: analyze each task sent, until told to stop or the coordinator is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator decides when to stop
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    _keep_freed_memory()
    while True:
        while not conn.poll(1.0):
            if os.getppid() != coordinator:
                return
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            conn.send(analyze_rank(task))
        except OSError:  # the coordinator is gone (killed): nobody to answer
            return


def _keep_freed_memory() -> None:
    """Tell glibc's malloc to reuse what the analyses free (see KEEP_FREED_BYTES); elsewhere
    (another libc, no libc to load) nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES)


def _context() -> BaseContext:
    # fork starts a worker in milliseconds with the analysis already loaded; elsewhere spawn.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _load_analysis(tasks: Sequence[RankTask]) -> None:
    """Import the analysis and load its compiled code once, for every forked worker to share
    (loading it takes a process ~0.3 s of CPU; a fork inherits it for nothing). Only what the
    job's inputs need: this runs before any worker starts, so all of it is the job's serial
    part (a job of traces needs no snapshot model, and the other way round)."""
    from nsysfrag import analysis  # noqa: F401
    from nsysfrag.pipeline import single  # noqa: F401  (each rank's walk)
    from nsysfrag.inputs import InputFormat, format_of
    from nsysfrag.inputs.nsys import NSYS_EXPORT
    from nsysfrag.inputs.torch_snapshot import TORCH_SNAPSHOT

    used: dict[str, InputFormat] = {}
    largest: dict[str, Path] = {}  # each format's largest input decides what to warm up
    for task in tasks:
        # A format may read a file's first bytes to claim it: never here a FIFO's, which would
        # block the job (the rank's worker says what is wrong with such an input).
        if os.path.isfile(task.path):
            path = Path(task.path)
            fmt = format_of(path)
            used[fmt.name] = fmt
            if fmt.name not in largest or _size(path) > _size(largest[fmt.name]):
                largest[fmt.name] = path
    if NSYS_EXPORT.name in used:
        from nsysfrag.inputs.nsys import reader, spaces  # noqa: F401
    if TORCH_SNAPSHOT.name in used:
        from nsysfrag.inputs.torch_snapshot import spaces as snapshot_spaces  # noqa: F401
    for fmt in used.values():
        if fmt.warm_up is not None:
            fmt.warm_up(largest[fmt.name])


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """SIGTERM stops the job as Ctrl-C does: the workers are stopped before nsysfrag exits."""
    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

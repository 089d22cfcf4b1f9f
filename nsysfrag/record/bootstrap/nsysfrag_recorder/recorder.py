"""The recorder of one process that uses CUDA: history, out-of-memory snapshots, a final
snapshot, the device facts beside each, and the sampler.

It starts from inside torch's CUDA initialization (``hook``), so ``start()`` does only what
must come before the first allocation: claim the rank's folder, turn history on, attach the
out-of-memory observer. Everything that reads the allocator's figures waits for the sampler
(``memory_stats()`` is empty until initialization has finished).
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from typing import Any, Callable, Dict, List  # noqa: UP035  (the program may run Python 3.8)

from . import facts as device_facts
from .files import Folder
from .names import FINAL, PROCESS, RANK_PREFIX, TIMELINE, facts_name, oom_name
from .options import Options
from .sampler import Sampler
from .stderr import warn

# (the state snapshot's segments, its facts); typing's names: the program may run Python 3.8.
OnState = Callable[[List[Any], Dict[str, Any]], None]  # noqa: UP006


class Recorder:
    def __init__(
        self, torch: Any, options: Options, out_dir: str, on_state: OnState | None = None
    ) -> None:
        self.torch = torch
        self.options = options
        self.out_dir = out_dir
        self.on_state = on_state
        self.pid = os.getpid()
        self.rank = device_facts.rank()
        self.folder = Folder(out_dir, f"pid {self.pid}")
        self.who: dict[str, Any] = {}
        self.ooms = 0
        self.oom_snapshots = 0
        self.used: set[int] = set()
        self.sampler = Sampler(self)
        self.finished = False
        self.lock = threading.Lock()

    # -- start

    def start(self, sample_in_background: bool = True) -> str:
        """Turn history on, attach the observer, claim the rank's folder; the folder's path.
        History first: an allocator that cannot record (``backend:cudaMallocAsync``) leaves
        no empty rank folder behind."""
        record_history(self.torch, self.options)
        self.torch._C._cuda_attach_out_of_memory_observer(self.on_oom)
        self.folder = claim_rank_folder(self.out_dir, self.rank, self.pid)
        self.who = device_facts.identity(self.torch)
        self.who["folder"] = os.path.basename(self.folder.path)
        atexit.register(self.finish, "exit")
        self._finish_on_sigterm()
        if sample_in_background:
            self.sampler.start()
        return self.folder.path

    def _finish_on_sigterm(self) -> None:
        # torchrun ends the other ranks with SIGTERM when one fails; by default that skips
        # atexit, and with it the final snapshot. Only a handler of our own in the main
        # thread can take it; a program's own handler is left alone.
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return

            def on_sigterm(signum: int, frame: object) -> None:
                self.finish("SIGTERM")
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

            signal.signal(signal.SIGTERM, on_sigterm)
        except (ValueError, OSError, AttributeError):
            pass

    # -- what the sampler asks

    def devices_in_use(self) -> list[int]:
        """The devices this process has reserved memory on (mem_get_info on any other would
        create a CUDA context there)."""
        cuda = self.torch.cuda
        for d in range(int(cuda.device_count())):
            if d not in self.used and cuda.memory_stats(d).get("reserved_bytes.all.peak", 0) > 0:
                self.used.add(d)
        return sorted(self.used)

    def describe(self, in_use: list[int]) -> bool:
        """``process.json``: who this process is and its devices; True once written."""
        about = {
            **self.who,
            "options": self.options.as_dict(),
            "devices": device_facts.devices(self.torch, in_use, False),
        }
        return self.folder.write_json(PROCESS, about)

    # -- snapshots

    def on_oom(self, device: int, alloc: int, device_total: int, device_free: int) -> None:
        """The allocator's out-of-memory observer: the snapshot now, while the failed request
        is the newest entry of the history. Called without the allocator's lock held."""
        try:
            with self.lock:
                self.ooms += 1
                k = self.ooms
                take = self.oom_snapshots < self.options.max_oom_snapshots
                if take:
                    self.oom_snapshots += 1
            self.used.add(int(device))
            name = oom_name(k) if take else None
            if name is not None:
                self.snapshot(name, "oom", oom={
                    "device": int(device), "requested_bytes": int(alloc),
                    "device_total_bytes": int(device_total), "device_free_bytes": int(device_free),
                })
            self.folder.append_line(TIMELINE, {
                "event": "oom", "time_unix_ns": _now_ns(), "device": int(device),
                "requested_bytes": int(alloc), "device_free_bytes": int(device_free),
                "device_total_bytes": int(device_total), "oom": k, "snapshot": name,
            })
        except Exception as err:  # noqa: BLE001  (the program's OutOfMemoryError comes next)
            warn(f"{self.folder.who}: out-of-memory snapshot failed ({type(err).__name__}: {err})")

    def snapshot(self, name: str, reason: str, **extra: Any) -> bool:
        """The full snapshot (``torch.cuda.memory._dump_snapshot``) as ``name``, and its facts."""
        in_use = self.devices_in_use()
        if not self.sampler.described:
            self.sampler.described = self.describe(in_use)
        if not self.folder.write_with(name, self.torch.cuda.memory._dump_snapshot):
            return False
        about = device_facts.facts(self.torch, self.who, in_use, reason, snapshot=name, **extra)
        return self.folder.write_json(facts_name(name), about)

    def finish(self, reason: str = "exit") -> None:
        """The final snapshot, once, in the process that started recording (a forked child
        inherits this object but not CUDA)."""
        if os.getpid() != self.pid:
            return
        with self.lock:
            if self.finished:
                return
            self.finished = True
        try:
            self.sampler.stop()
            if self.sampler.samples == 0 and self.folder.failure is None:
                self.sampler.sample()  # a short run still has one line of figures
            self.snapshot(FINAL, reason, ooms=self.ooms)
        except Exception as err:  # noqa: BLE001
            warn(f"{self.folder.who}: final snapshot failed ({type(err).__name__}: {err})")


def claim_rank_folder(out_dir: str, rank: int | None, pid: int) -> Folder:
    """``OUT/rank{R}`` (rank 0 without a launcher's rank), or ``OUT/rank{R}-pid{P}`` when
    another process of that rank has it already."""
    r = 0 if rank is None else rank
    for name in (f"{RANK_PREFIX}{r}", f"{RANK_PREFIX}{r}-pid{pid}"):
        path = os.path.join(out_dir, name)
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return Folder(path, f"rank {r} (pid {pid})")
    raise FileExistsError(f"{out_dir}: rank {r} folders exist already")


def record_history(torch: Any, options: Options) -> None:
    """``_record_memory_history`` with --entries and --stacks, in the call's current form
    (``enabled="all"``, PyTorch 2.1 and later), else its first form (a bool, PyTorch 2.0)."""
    memory = torch.cuda.memory
    context = None if options.stacks == "none" else "all"
    stacks = "all" if options.stacks == "all" else "python"
    try:
        memory._record_memory_history(
            enabled="all", context=context, stacks=stacks, max_entries=options.entries
        )
    except TypeError:
        memory._record_memory_history(
            True,
            trace_alloc_max_entries=options.entries,
            trace_alloc_record_context=context is not None,
            record_context_cpp=options.stacks == "all",
        )


def _now_ns() -> int:
    import time

    return time.time_ns()

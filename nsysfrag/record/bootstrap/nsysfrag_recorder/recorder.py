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
from typing import Any

from .facts import devices as describe_devices
from .facts import facts, identity, launcher_rank, restart_count
from .files import Folder
from .names import (
    ATTEMPT_INFIX,
    BY_DEVICE,
    BY_PID,
    FINAL,
    PID_PREFIX,
    PROCESS,
    RANK_PREFIX,
    TIMELINE,
    facts_name,
    oom_name,
)
from .options import Options
from .process_log import log_process
from .sampler import OnState, Sampler
from .stderr import warn


class Unsupported(Exception):
    """This torch cannot be recorded at all (the message says so in one line)."""


class Recorder:
    def __init__(
        self, torch: Any, options: Options, out_dir: str, on_state: OnState | None = None
    ) -> None:
        self.torch = torch
        self.options = options
        self.out_dir = out_dir
        self.on_state = on_state
        self.pid = os.getpid()
        self.launcher = launcher_rank()
        self.rank = None if self.launcher is None else self.launcher[0]
        self.folder = Folder(out_dir, f"pid {self.pid}")  # the record folder until claim()
        self.claimed = False
        self.no_history: str | None = None  # why the allocator keeps no history, if it does not
        self.who: dict[str, Any] = {}
        self.ooms = 0
        self.oom_snapshots = 0
        self.used: set[int] = set()
        self.sampler = Sampler(self)
        self.finished = False
        self.lock = threading.Lock()
        self.claim_lock = threading.Lock()

    # -- start

    def start(self, sample_in_background: bool = True) -> str:
        """Turn history on, attach the observer; the rank's folder path once it is known ('' while
        the name waits for the device the process uses). History first: a torch or an
        allocator that cannot record leaves no rank folder behind."""
        check_torch(self.torch)
        self.no_history = record_history(self.torch, self.options)
        if self.no_history is None:
            self.torch._C._cuda_attach_out_of_memory_observer(self.on_oom)
            # Inside torch's initialization the counts are 0; the Python API may start later.
            devices = list(range(int(self.torch.cuda.device_count())))
            self.sampler.counted_at_start = self.sampler.count_history(devices)
        self.who = identity(self.torch)
        if self.launcher is not None:
            self.claim()  # the launcher named it: the folder exists before the first allocation
        atexit.register(self.finish, "exit")
        self._finish_on_sigterm()
        if sample_in_background:
            self.sampler.start()
        return self.folder.path if self.claimed else ""

    def claim(self, device: int | None = None) -> bool:
        """Make this process's folder, named by the first rule that names it (``names``): the
        launcher's rank, else the one device it uses, else its pid. Without a launcher's rank
        the name waits until the process has memory on a device (``device``: the one an
        out-of-memory names). False while it has no folder."""
        with self.claim_lock:
            if self.claimed:
                return True
            used = sorted({device} if device is not None else set(self.devices_in_use()))
            if self.launcher is None and not used:
                return False  # a process that never held memory has nothing to record
            names = folder_names(self.launcher, restart_count(), used, self.pid)
            name, rank, named_by = make_rank_folder(self.out_dir, names)
            label = f"pid {self.pid}" if rank is None else f"rank {rank} (pid {self.pid})"
            self.folder = Folder(os.path.join(self.out_dir, name), label)
            self.who.update(folder=name, rank=rank, named_by=named_by)
            self.claimed = True
        log_process(self.out_dir, "folder", folder=name, named_by=named_by)
        self.sampler.described = self.describe(self.devices_in_use())
        return True

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
            "devices": describe_devices(self.torch, in_use, False),
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
            if not self.claim(int(device)):
                return
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
        if self.no_history is not None or not self.claim():
            return False
        in_use = self.devices_in_use()
        if not self.sampler.described:
            self.sampler.described = self.describe(in_use)
        if not self.folder.write_with(name, self.torch.cuda.memory._dump_snapshot):
            return False
        about = facts(self.torch, self.who, in_use, reason, snapshot=name, **extra)
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
            if self.no_history is None:
                self.snapshot(FINAL, reason, ooms=self.ooms)
        except Exception as err:  # noqa: BLE001
            warn(f"{self.folder.who}: final snapshot failed ({type(err).__name__}: {err})")


def folder_names(
    launcher: tuple[int, str] | None, attempt: int, used: list[int], pid: int
) -> list[tuple[str, int | None, str]]:
    """The names to try in order, each with the rank it gives and the rule that names it: the
    launcher's rank (a second process of that rank, a helper, gets ``-pid``), else the one
    device the process used, else its pid."""
    by_pid = (f"{PID_PREFIX}{pid}", None, BY_PID)
    if launcher is not None:
        r, variable = launcher
        first = f"{RANK_PREFIX}{r}" + (f"{ATTEMPT_INFIX}{attempt}" if attempt else "")
        return [(first, r, variable), (f"{RANK_PREFIX}{r}-{PID_PREFIX}{pid}", r, variable)]
    if len(used) == 1:
        return [(f"{RANK_PREFIX}{used[0]}", used[0], BY_DEVICE), by_pid]
    return [by_pid]


def make_rank_folder(out_dir: str, names: list[tuple[str, int | None, str]]) -> tuple[str, int | None, str]:
    """The first of ``names`` that is free, made (``mkdir`` fails on a name taken by anything,
    a link planted there included: no folder of ours is ever a link)."""
    for name, rank, named_by in names:
        try:
            os.mkdir(os.path.join(out_dir, name))
        except FileExistsError:
            continue
        return name, rank, named_by
    raise FileExistsError(f"{out_dir}: {', '.join(n for n, _, _ in names)} exist already")


def check_torch(torch: Any) -> None:
    """Unsupported for a torch before 2.1: its ``_record_memory_history`` takes other
    arguments (2.0: ``trace_alloc_*``; 1.13: only ``enabled``) and it has no
    ``_dump_snapshot``, whose format every snapshot of a record is in."""
    if not callable(getattr(torch.cuda.memory, "_dump_snapshot", None)):
        found = str(getattr(torch, "__version__", "") or "unknown")
        raise Unsupported(
            f"nsysfrag record needs torch \u2265 2.1 (found {found}): the program ran unrecorded"
        )


def record_history(torch: Any, options: Options) -> str | None:
    """``_record_memory_history`` with --entries and --stacks (its form since PyTorch 2.1);
    None once history is on, else why the allocator keeps none (``backend:cudaMallocAsync``
    refuses it: the process is then sampled only)."""
    memory = torch.cuda.memory
    context = None if options.stacks == "none" else "all"
    stacks = "all" if options.stacks == "all" else "python"
    refused = (
        "backend:cudaMallocAsync keeps no allocation history (PyTorch refuses it): only"
        " memory_stats() samples are recorded"
    )
    try:
        if torch.cuda.get_allocator_backend() == "cudaMallocAsync":
            return refused
    except Exception:  # noqa: BLE001, S110  (a torch that cannot say: history will tell)
        pass
    try:
        memory._record_memory_history(
            enabled="all", context=context, stacks=stacks, max_entries=options.entries
        )
    except RuntimeError as err:
        if "cudaMallocAsync" in str(err):
            return refused
        raise
    return None


def _now_ns() -> int:
    import time

    return time.time_ns()

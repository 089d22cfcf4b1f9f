"""Live sampling: every interval, each device's ``memory_stats()`` and ``mem_get_info()`` as a
timeline line, and now and then a state-only ``torch.cuda.memory_snapshot()``.

A state snapshot is due every ``state_every`` samples, whenever reserved memory moved since the
last one, and whenever the memory free inside the segments (reserved − allocated: where
fragmentation lives, and it grows with frees that leave reserved alone) moved by
``MOVED_SHARE`` of the device; it is taken only if the last one's cost, spread over the time since, stays within
``state_budget`` of the wall time (while history is on, torch builds the whole trace for it,
so at 100,000 entries one costs far more than a sample). The newest state snapshot is kept
(``state-{n}.pickle``), the one before removed. A write that fails (a full disk) stops the
sampling; the program is never told.
"""

from __future__ import annotations

import pickle
import threading
import time
from typing import TYPE_CHECKING, Any

from .facts import facts, usage
from .names import TIMELINE, facts_name, state_name
from .stderr import warn

if TYPE_CHECKING:
    from .recorder import Recorder

MOVED_SHARE = 0.01


class Sampler:
    """The sampling of one process; ``start()`` runs it on a daemon thread, ``sample()`` takes
    one sample now (the Python API's ``step()``)."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.options = recorder.options
        self.samples = 0
        self.states = 0
        self.since_state = 0
        self.last: dict[int, tuple[int, int]] = {}  # device -> (reserved, free in segments)
        self.at_state: dict[int, tuple[int, int]] = {}
        self.last_state_at = 0.0
        self.last_state_cost = 0.0
        self.stopping = threading.Event()
        self.lock = threading.Lock()  # one sample at a time (the thread and step())
        self.thread: threading.Thread | None = None
        self.described = False

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="nsysfrag-record-sampler", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        while not self.stopping.wait(self.options.interval_s):
            if not self.sample():
                return

    def sample(self, force_state: bool = False) -> bool:
        """One sample; False once sampling has stopped for good (a write failed, torch
        failed)."""
        folder = self.recorder.folder
        if folder.failure is not None:
            return False
        with self.lock:
            try:
                return self._sample(force_state)
            except Exception as err:  # noqa: BLE001
                warn(f"{folder.who}: sampling stopped ({type(err).__name__}: {err}); the program runs on")
                return False

    def _sample(self, force_state: bool) -> bool:
        torch, folder = self.recorder.torch, self.recorder.folder
        started = time.perf_counter()
        now_ns = time.time_ns()
        in_use = self.recorder.devices_in_use()
        lines = []
        moved = False
        for device in in_use:
            line: dict[str, Any] = {"time_unix_ns": now_ns, "device": device}
            line.update(usage(torch, device, full_stats=False))
            reserved = int(line.get("reserved_bytes", 0))
            cached = reserved - int(line.get("allocated_bytes", 0))
            total = int(line.get("device_total_bytes", reserved))
            before = self.at_state.get(device)
            if before is None or before[0] != reserved or abs(cached - before[1]) >= MOVED_SHARE * total:
                moved = True
            self.last[device] = (reserved, cached)
            lines.append(line)
        self.samples += 1
        self.since_state += 1
        cost = time.perf_counter() - started
        state = None
        if in_use and (force_state or self._state_due(moved)):
            state = self._state_snapshot(in_use)
        if not self.described:
            self.described = self.recorder.describe(in_use)
        for line in lines:
            line["sample"] = self.samples
            line["cost_s"] = round(cost, 7)
            if state is not None:
                line["state"] = state[0]
                line["state_cost_s"] = round(state[1], 7)
            if not folder.append_line(TIMELINE, line):
                return False
        return folder.failure is None

    def _state_due(self, moved: bool) -> bool:
        if not (moved or self.since_state >= self.options.state_every):
            return False
        waited = time.monotonic() - self.last_state_at
        return self.states == 0 or waited * self.options.state_budget >= self.last_state_cost

    def _state_snapshot(self, in_use: list[int]) -> tuple[str, float] | None:
        recorder = self.recorder
        torch, folder = recorder.torch, recorder.folder
        started = time.perf_counter()
        segments = torch.cuda.memory_snapshot()
        figures = {d: self.last.get(d, (0, 0)) for d in in_use}
        n = self.states + 1
        name = state_name(n)
        if not folder.write_atomic(name, lambda f: pickle.dump(segments, f, protocol=4)):
            return None
        about = facts(torch, recorder.who, in_use, "state", snapshot=name)
        if not folder.write_json(facts_name(name), about):
            return None
        if self.states:
            old = state_name(self.states)
            folder.remove(old)
            folder.remove(facts_name(old))
        self.states, self.since_state = n, 0
        self.at_state = figures
        if recorder.on_state is not None:  # the Python API rates in this process: its cost too
            recorder.on_state(segments, about)
        cost = time.perf_counter() - started
        self.last_state_at, self.last_state_cost = time.monotonic(), cost
        return name, cost


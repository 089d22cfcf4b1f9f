"""Live sampling: every interval, each device's ``memory_stats()`` and ``mem_get_info()`` as a
timeline line, and now and then a state-only ``torch.cuda.memory_snapshot()``.

A state snapshot is due every ``state_every`` samples, whenever reserved memory moved since the
last one, and whenever the memory free inside the segments (reserved − allocated: where
fragmentation lives, and it grows with frees that leave reserved alone) moved by
``MOVED_SHARE`` of the device; it is taken only if the last one's cost, spread over the time since, stays within
``state_budget`` of the wall time. The newest state snapshot is kept (``state-{n}.pickle``), the
one before removed. A write that fails (a full disk) stops the sampling; the program is never
told.

A state snapshot stops the program's threads while torch builds it (it holds the GIL), so no
single one may pause it longer than ``max_pause_s``, whatever the average: where torch can leave
the history out (``memory_snapshot(include_traces=False)``, PyTorch 2.11 and later) it does;
before that, torch converts every history entry (up to ``--entries``, with stacks) and throws
them away, so the cost of the next one is predicted from the entries the history holds now and
the cost per entry the last one showed (a cautious guess before the first), and a snapshot that
would pause longer is not taken (its line says ``state_refused_s``, the predicted pause).
"""

from __future__ import annotations

import pickle
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List  # noqa: UP035  (Python 3.8)

from .facts import facts, usage
from .names import TIMELINE, facts_name, state_name
from .stderr import warn

if TYPE_CHECKING:
    from typing import Protocol

    from .files import Folder
    from .options import Options

    class Sampled(Protocol):
        """What the sampler reads of the process it samples (``recorder.Recorder``), named
        here so that the sampler need not import the recorder that starts it."""

        torch: Any
        options: Options
        folder: Folder
        no_history: str | None
        who: dict[str, Any]
        on_state: OnState | None

        def devices_in_use(self) -> list[int]: ...

        def claim(self, device: int | None = None) -> bool: ...

        def describe(self, in_use: list[int]) -> bool: ...


# What each state snapshot is handed to (the Python API rates it): its segments, its facts.
# typing's names: the program may run Python 3.8.
OnState = Callable[[List[Any], Dict[str, Any]], None]  # noqa: UP006

MOVED_SHARE = 0.01
# Before any state snapshot was measured: what one history entry with a Python stack may cost
# to convert (cautious: a record learns its own figure from its first snapshot).
PRIOR_S_PER_ENTRY = 5e-6
LEARN_FROM_ENTRIES = 1000  # fewer: the segments, not the history, make the cost
# The allocator's cumulative counts of what it writes into the history, and the entries each
# adds (a free is two: free_requested, free_completed).
HISTORY_COUNTS = (
    ("allocation.all.allocated", 1), ("allocation.all.freed", 2),
    ("segment.all.allocated", 1), ("segment.all.freed", 1),
)  # fmt: skip


class Sampler:
    """The sampling of one process; ``start()`` runs it on a daemon thread, ``sample()`` takes
    one sample now (the Python API's ``step()``)."""

    def __init__(self, recorder: Sampled) -> None:
        self.recorder = recorder
        self.options = recorder.options
        self.samples = 0
        self.states = 0
        self.since_state = 0
        self.last: dict[int, tuple[int, int]] = {}  # device -> (reserved, free in segments)
        self.at_state: dict[int, tuple[int, int]] = {}
        self.last_state_at = 0.0
        self.last_state_cost = 0.0
        self.light: bool | None = None  # memory_snapshot(include_traces=False) works; None: untried
        self.s_per_entry = PRIOR_S_PER_ENTRY
        self.counted_at_start: int | None = None  # the history counts when recording began
        self.refused = 0  # state snapshots not taken: they would have paused too long
        self.longest_pause = 0.0
        self.rating_s = 0.0  # the newest state's rating in this process (the Python API)
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

    def sample(self, want_state: bool = False, force_state: bool = False) -> bool:
        """One sample; False once sampling has stopped for good (a write failed, torch
        failed). ``want_state``: a state snapshot is due now (within the budget and the longest
        pause); ``force_state``: taken whatever it costs."""
        folder = self.recorder.folder
        if folder.failure is not None:
            return False
        with self.lock:
            try:
                return self._sample(want_state or force_state, force_state)
            except Exception as err:  # noqa: BLE001
                warn(f"{self.recorder.folder.who}: sampling stopped ({type(err).__name__}: {err});"
                     " the program runs on")
                return False

    def _sample(self, want_state: bool, force_state: bool) -> bool:
        torch = self.recorder.torch
        started = time.perf_counter()
        now_ns = time.time_ns()
        in_use = self.recorder.devices_in_use()
        if not self.recorder.claim():
            return True  # no memory held yet, and no launcher's rank to name the folder by
        folder = self.recorder.folder
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
        refused = None
        if in_use and self.recorder.no_history is None and (
            force_state or self._state_due(moved or want_state)
        ):
            taken = self._state_snapshot(in_use, force_state)
            if taken is not None and taken[0] is None:
                refused = taken[1]
                self.refused += 1
            elif taken is not None:
                state = (str(taken[0]), taken[1])
        if not self.described:
            self.described = self.recorder.describe(in_use)
        pause = cost + (state[1] if state is not None else 0.0)
        self.longest_pause = max(self.longest_pause, pause)
        for line in lines:
            line["sample"] = self.samples
            line["cost_s"] = round(cost, 7)
            if state is not None:
                line["state"] = state[0]
                line["state_cost_s"] = round(state[1], 7)
                if self.rating_s:
                    line["rating_s"] = round(self.rating_s, 7)
            if refused is not None:
                line["state_refused_s"] = round(refused, 7)
            if not folder.append_line(TIMELINE, line):
                return False
        return folder.failure is None

    def _state_due(self, moved: bool) -> bool:
        if not (moved or self.since_state >= self.options.state_every):
            return False
        waited = time.monotonic() - self.last_state_at
        return self.states == 0 or waited * self.options.state_budget >= self.last_state_cost

    def count_history(self, devices: list[int]) -> int:
        """What the allocator has written into the history so far, by its own counts."""
        stats = self.recorder.torch.cuda.memory_stats
        return sum(
            int(stats(d).get(key, 0)) * weight for d in devices for key, weight in HISTORY_COUNTS
        )

    def history_entries(self, in_use: list[int]) -> int:
        """About how many entries the history holds now (at most ``--entries``)."""
        counted = self.count_history(in_use) - (self.counted_at_start or 0)
        return max(0, min(self.options.entries, counted))

    def _refused(self, in_use: list[int]) -> float | None:
        """The pause a state snapshot with the whole history would cause, when it is above
        ``max_pause_s`` (None: take it)."""
        predicted = self.s_per_entry * self.history_entries(in_use)
        return predicted if predicted > self.options.max_pause_s else None

    def _light_segments(self) -> list[Any] | None:
        """``memory_snapshot(include_traces=False)`` where torch has it (2.11 and later; before,
        Python refuses the keyword before torch does any work); None where it does not."""
        if self.light is False:
            return None
        try:
            segments = self.recorder.torch.cuda.memory_snapshot(include_traces=False)
        except TypeError:
            self.light = False
            return None
        self.light = True
        return list(segments)

    def _state_snapshot(self, in_use: list[int], force: bool) -> tuple[str | None, float] | None:
        """(its name, its cost), or (None, the predicted pause) when declined, or None when it
        could not be written."""
        recorder = self.recorder
        torch, folder = recorder.torch, recorder.folder
        started = time.perf_counter()
        segments = self._light_segments()
        if segments is None:
            refused = None if force else self._refused(in_use)
            if refused is not None:
                return None, refused
            entries = self.history_entries(in_use)
            asked = time.perf_counter()
            segments = list(torch.cuda.memory_snapshot())
            converted = time.perf_counter() - asked
            if entries >= LEARN_FROM_ENTRIES:
                self.s_per_entry = converted / entries
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
        cost = time.perf_counter() - started
        self.rating_s = 0.0
        if recorder.on_state is not None:  # the Python API rates in this process, as asked
            rated = time.perf_counter()
            recorder.on_state(segments, about)
            self.rating_s = time.perf_counter() - rated
        # The budget spreads the rating too; the pause is the snapshot's (the rating is what
        # the program's step() asked for, and returns).
        self.last_state_at, self.last_state_cost = time.monotonic(), cost + self.rating_s
        return name, cost


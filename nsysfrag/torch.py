"""The Python API of ``nsysfrag record``, for a program that wants it in its own code::

    from nsysfrag.torch import monitor

    with monitor("runs/exp1") as m:       # the same record folder `nsysfrag record` writes
        for step, batch in enumerate(loader):
            train_step(batch)
            m.step()                       # every 100th call: a state rated, within the budget

The recorder starts when the program initializes CUDA (at once if it has already), records
the history, a snapshot at each out-of-memory error and at the end (the block's exit, or the
process's), samples every ``interval`` seconds and rates state snapshots in this process
(``nsysfrag record`` rates them in its own); a rated metric crossing a health level is an alert
line on stderr (or ``on_alert``). Under ``nsysfrag record`` the command's recorder is already
there: ``monitor`` then only makes ``step()`` take a sample, which the command rates.
``nsysfrag analyze OUT`` reads the folder afterwards.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from nsysfrag.record.bootstrap import BOOTSTRAP_DIR
from nsysfrag.record.bootstrap.nsysfrag_recorder.names import (
    ENV_DIR,
    MARKER,
    RANK_PREFIX,
    RECORD_SCHEMA,
    STEPS,
    state_name,
)
from nsysfrag.record.rating import Rating

RUNTIME = "nsysfrag_recorder"  # the recorder's name in a recorded process (the bootstrap's)


def _runtime() -> ModuleType:
    """The recorder package under the name the bootstrap gives it, so a process holds one."""
    module = sys.modules.get(RUNTIME)
    if module is not None:
        return module
    init = BOOTSTRAP_DIR / RUNTIME / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        RUNTIME, init, submodule_search_locations=[str(init.parent)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[RUNTIME] = module
    spec.loader.exec_module(module)
    return module


def _part(name: str) -> ModuleType:
    """A module of the recorder package (``options``, ``facts``, ``hook``), loaded on demand as
    the bootstrap loads them."""
    _runtime()
    return importlib.import_module(f"{RUNTIME}.{name}")


def _say(line: str) -> None:
    sys.stderr.write(f"nsysfrag: {line}\n")
    sys.stderr.flush()


class monitor:
    """Record this process into ``out`` while the block runs (or between ``start()`` and
    ``stop()``); ``step()`` rates a state every ``every`` calls."""

    def __init__(
        self,
        out: str | os.PathLike[str] = "nsysfrag-record",
        *,
        every: int = 100,
        interval: float = 5.0,
        entries: int = 100_000,
        stacks: str = "python",
        state_every: int = 12,
        state_budget: float = 0.01,
        max_pause: float = 0.05,
        max_oom_snapshots: int = 8,
        alert_command: str | None = None,
        on_alert: Callable[[str], None] | None = None,
        overwrite: bool = False,
    ) -> None:
        self.out = Path(out)
        self.every = max(1, int(every))
        self.options = _part("options").Options(
            entries=entries, stacks=stacks, interval_s=interval, state_every=state_every,
            state_budget=state_budget, max_pause_s=max_pause, max_oom_snapshots=max_oom_snapshots,
        )  # fmt: skip
        self.alert_command = alert_command
        self.say = on_alert or _say
        self.overwrite = overwrite
        self.steps = 0
        self.ratings: list[Rating] = []  # the newest state's, one per device
        self._rater: Any = None
        self._recorder: Any = None
        self._under_command = bool(os.environ.get(ENV_DIR))
        self._started = False

    # -- the context manager

    def __enter__(self) -> monitor:  # noqa: PYI034  (Self needs Python 3.11)
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the calls

    def start(self) -> None:
        """Arm the recorder (it starts with CUDA). Raises FileExistsError when this rank's
        folder is already in ``out`` and ``overwrite`` is not set."""
        if self._started:
            return
        self._started = True
        if self._under_command:  # nsysfrag record's own recorder records this process
            return
        from nsysfrag.record.watch import Rater

        rank = _part("facts").rank()
        folder = self.out / f"{RANK_PREFIX}{0 if rank is None else rank}"
        if folder.exists():
            if not self.overwrite:
                raise FileExistsError(
                    f"{folder}: already holds a record of this rank; pass overwrite=True or"
                    " another folder"
                )
            shutil.rmtree(folder)
        self.out.mkdir(parents=True, exist_ok=True)
        _mark(self.out)
        self._rater = Rater(time.time_ns(), self.say, self.alert_command)
        _part("hook").when_cuda_initialized(self._cuda_ready, on_import=lambda: None)

    def step(self, force: bool = False) -> list[Rating] | None:
        """Count a step; every ``every``-th, sample now and take a state snapshot if the budget
        allows it (``state_budget`` of the time on average, no pause over ``max_pause`` s; with
        ``force``, whatever it costs) and return its ratings (None on other steps, when the
        budget declined it, before CUDA, and under ``nsysfrag record``, which rates the state
        itself)."""
        self.steps += 1
        if self.steps % self.every and self.steps != 1:
            return None
        recorder = self._recorder or (_runtime().active() if self._under_command else None)
        if recorder is None:
            return None
        # The step count beside its time, from the first step on: how `record --try` tells
        # the time per step.
        recorder.folder.append_line(STEPS, {"step": self.steps, "time_unix_ns": time.time_ns()})
        if self.steps % self.every:
            return None
        self.ratings = []
        states = recorder.sampler.states
        recorder.sampler.sample(want_state=True, force_state=force)
        if self._under_command or recorder.sampler.states == states:
            return None
        return list(self.ratings)

    def stop(self) -> None:
        """The final snapshot (once); the process's exit would take it otherwise."""
        if self._recorder is not None:
            self._recorder.finish("exit")

    # -- internals

    def _cuda_ready(self, torch: Any) -> None:
        runtime = _runtime()
        self._recorder = runtime.start(torch, self.options, str(self.out), self._on_state)

    def _on_state(self, segments: list[Any], about: dict[str, Any]) -> None:
        from nsysfrag.record.watch import facts_from

        recorder = self._recorder
        if recorder is None or self._rater is None:
            return
        folder = Path(recorder.folder.path)
        facts = facts_from(about, folder)
        if facts is None:
            return
        name = str(about.get("snapshot") or state_name(recorder.sampler.states))
        self.ratings = self._rater.rate(folder, segments, facts, facts.time_unix_ns or 0, name)


def _mark(out: Path) -> None:
    """``record.json`` for a folder the API writes (once, whichever rank comes first)."""
    import json

    marker = out / MARKER
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({
            "schema": RECORD_SCHEMA,
            "command": [str(a) for a in sys.argv[:32]],
            "options": {"api": "nsysfrag.torch.monitor"},
            "started_unix_ns": time.time_ns(),
            "status": "running",
        }, f, indent=1)  # fmt: skip

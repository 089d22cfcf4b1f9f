"""While the command runs: every interval, each rank's newest state snapshot rated
(``rating``), its rating appended to the rank's ``ratings.jsonl``, and each crossing of a
health level said and sent (``alerts``).

The ranks write their state snapshots (``state-{n}.pickle``, replaced as they go); the watch
runs in nsysfrag's process, not the program's, so the program pays for taking the snapshot
only, never for rating it. A state the watch could not read in time (replaced meanwhile) is
skipped: the next one is newer.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsysfrag.inputs.torch_snapshot.facts import DeviceFacts, facts_beside, parse_facts
from nsysfrag.inputs.torch_snapshot.unpickle import load_plain_pickle
from nsysfrag.record.alerts import Alert, Levels, send
from nsysfrag.record.bootstrap.nsysfrag_recorder.files import append_bytes
from nsysfrag.record.bootstrap.nsysfrag_recorder.names import STATE_PREFIX
from nsysfrag.record.layout import rank_folders
from nsysfrag.record.rating import Rating, rate_state

RATINGS = "ratings.jsonl"
ALERTS = "alerts.jsonl"


class Rater:
    """Rates states of any rank and alerts on crossings; shared by the watch (files) and the
    Python API (a state in memory)."""

    def __init__(
        self,
        started_unix_ns: int,
        say: Callable[[str], None],
        alert_command: str | None = None,
    ) -> None:
        self.started_unix_ns = started_unix_ns
        self.say = say
        self.alert_command = alert_command
        self.levels = Levels()
        self.alerts = 0

    def rate(
        self, folder: Path, segments: Any, facts: DeviceFacts, time_unix_ns: int, state: str
    ) -> list[Rating]:
        ratings = rate_state(segments, str(folder / state), facts.total_memory, time_unix_ns)
        rank = facts.rank if facts.rank is not None else 0
        for rating in ratings:
            _append(folder / RATINGS, {**rating.document(), "state": state})
            for metric, level in self.levels.crossings(folder.name, rating):
                alert = Alert(
                    rank=rank,
                    host=facts.host,
                    pid=facts.pid,
                    since_start_s=max(0.0, (time_unix_ns - self.started_unix_ns) / 1e9),
                    metric=metric,
                    level=level,
                    rating=rating,
                )
                self.alerts += 1
                self.say(alert.line())
                _append(folder / ALERTS, alert.document())
                if self.alert_command:
                    send(alert, self.alert_command, self.say)
        return ratings


class Watch:
    """The rating loop over a record folder, on its own thread (``start``/``stop``)."""

    def __init__(self, out: Path, interval_s: float, rater: Rater) -> None:
        self.out = out
        self.interval_s = interval_s
        self.rater = rater
        self.seen: dict[str, int] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="nsysfrag-record-watch", daemon=True)
        self.problem: str | None = None

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stop, then rate what the ranks wrote last."""
        self.stopping.set()
        self.thread.join()
        self.poll()

    def _run(self) -> None:
        import signal

        if hasattr(signal, "pthread_sigmask"):  # signals are the main thread's to forward
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        while not self.stopping.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        try:
            for r in rank_folders(self.out):
                if r.state is None:
                    continue
                n = int(r.state.name[len(STATE_PREFIX) : -len(".pickle")])
                if n <= self.seen.get(r.path.name, 0):
                    continue
                self.seen[r.path.name] = n
                self._rate(r.path, r.state)
        except Exception as err:  # noqa: BLE001  (a bad state must not end the recording)
            if self.problem is None:
                self.problem = f"{type(err).__name__}: {err}"
                self.rater.say(f"warning: live rating stopped ({self.problem}); recording goes on")
            self.stopping.set()

    def _rate(self, folder: Path, state: Path) -> None:
        warnings: list[str] = []
        facts = facts_beside(state, warnings)
        try:
            segments = load_plain_pickle(state)
        except Exception:  # noqa: BLE001  (replaced or half-seen: the next one is newer)
            return
        if facts is None:
            return
        self.rater.rate(folder, segments, facts, facts.time_unix_ns or 0, state.name)


def facts_from(data: dict[str, Any], where: Path) -> DeviceFacts | None:
    """Facts handed over in memory (the Python API), checked as a file's would be."""
    return parse_facts(where, data)


def _append(path: Path, record: dict[str, Any]) -> None:
    line = json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n"
    try:
        append_bytes(str(path), line.encode("utf-8"))  # never through a link planted there
    except OSError:
        pass  # a full disk: the alert line was said anyway

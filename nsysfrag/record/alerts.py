"""Alerts: a rated metric of a rank's device rising to a worse health level (ok → warn →
critical, the levels of a space's health), said in one line and, with ``--alert-command``, sent
as JSON on the command's stdin (for Slack, DingTalk, a pager).

A level is alerted when a sample's level is above the previous sample's, so a metric that stays
critical alerts once, and one that recovers and worsens again alerts again.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nsysfrag.analysis.metrics import Health, format_bytes
from nsysfrag.record.rating import Rating

# Where each metric's levels start (docs/metrics.md), in the words of an alert line.
THRESHOLDS = {
    "global_frag": {Health.WARN: "≥ 20%", Health.CRITICAL: "≥ 40%"},
    "local_frag": {Health.WARN: "≥ 30%", Health.CRITICAL: "> 60%"},
    "free_blocks": {Health.WARN: "≥ 100", Health.CRITICAL: "> 500"},
}
ALERT_SCHEMA = "nsysfrag-record-alert/1"
COMMAND_TIMEOUT_S = 30


@dataclass(frozen=True, slots=True)
class Alert:
    rank: int
    host: str | None
    pid: int | None
    since_start_s: float  # since the record started
    metric: str
    level: Health
    rating: Rating

    @property
    def value(self) -> float | int:
        value = getattr(self.rating, self.metric)
        return int(value) if self.metric == "free_blocks" else float(value)

    def value_text(self) -> str:
        return f"{self.value:.0f}" if self.metric == "free_blocks" else f"{self.value:.1%}"

    def line(self) -> str:
        """``ALERT rank 1 cuda:0 at 14:03:07 (+42.0 s): global_frag 23.5% (warn, ≥ 20%); top
        pinning site train.py:58 step (1.20 GiB stranded)``: the sample's local time, and how
        long after the record started."""
        r = self.rating
        site = (
            f"top pinning site {r.pinning_site} ({format_bytes(r.pinning_bytes)} stranded)"
            if r.pinning_site
            else "no stranded memory pinned by a site"
        )
        return (
            f"ALERT rank {self.rank} cuda:{r.device} at {self.clock()} (+{self.since_start_s:.1f} s):"
            f" {self.metric} {self.value_text()} ({self.level.label},"
            f" {THRESHOLDS[self.metric][self.level]}); {site}"
        )

    def clock(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.rating.time_unix_ns / 1e9))

    def document(self) -> dict[str, Any]:
        return {
            "schema": ALERT_SCHEMA,
            "rank": self.rank,
            "host": self.host,
            "pid": self.pid,
            "device": self.rating.device,
            "time_unix_ns": self.rating.time_unix_ns,
            "since_start_s": round(self.since_start_s, 3),
            "metric": self.metric,
            "value": self.value,
            "level": self.level.label,
            "threshold": THRESHOLDS[self.metric][self.level],
            "pinning_site": self.rating.pinning_site,
            "pinning_bytes": self.rating.pinning_bytes,
            "rating": self.rating.document(),
            "message": self.line(),
        }


class Levels:
    """The last level of each (rank folder, device, metric), so a crossing alerts once."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, int, str], Health] = {}

    def crossings(self, key: str, rating: Rating) -> list[tuple[str, Health]]:
        out = []
        for metric, level in rating.levels().items():
            before = self.last.get((key, rating.device, metric), Health.OK)
            self.last[(key, rating.device, metric)] = level
            if level > before:
                out.append((metric, level))
        return out


def send(alert: Alert, command: str, say: Callable[[str], None]) -> None:
    """Run ``command`` in the shell with the alert as JSON on its stdin; a failure is said,
    never raised (an alert must not stop the watch)."""
    payload = json.dumps(alert.document(), ensure_ascii=False).encode()
    try:
        done = subprocess.run(
            command, shell=True, input=payload, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, timeout=COMMAND_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        say(f"--alert-command took over {COMMAND_TIMEOUT_S} s and was stopped")
        return
    except OSError as err:
        say(f"--alert-command could not run ({err.strerror})")
        return
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        say(f"--alert-command exited with code {done.returncode}" + (f": {tail[0][:200]}" if tail[0] else ""))

"""The recorder's options, as ``nsysfrag record`` passes them in ``$NSYSFRAG_RECORD_OPTIONS``."""

from __future__ import annotations

import json
import os
from typing import Any

from .names import ENV_OPTIONS

STACKS = ("python", "all", "none")
MIN_INTERVAL_S = 1.0  # sampling never runs faster: each sample takes the allocator's lock
MAX_PAUSE_S = 0.05  # no state snapshot may stop the program longer than this


class Options:
    """How much history to keep and how often to sample (defaults: ``nsysfrag record``'s)."""

    def __init__(
        self,
        entries: int = 100_000,
        stacks: str = "python",
        interval_s: float = 5.0,
        state_every: int = 12,
        state_budget: float = 0.01,
        max_oom_snapshots: int = 8,
        max_pause_s: float = MAX_PAUSE_S,
    ) -> None:
        self.entries = max(1, int(entries))
        self.stacks = stacks if stacks in STACKS else "python"
        self.interval_s = max(MIN_INTERVAL_S, float(interval_s))
        # A state snapshot every this many samples, and whenever reserved memory moved; never
        # more often than its own cost allows within state_budget of the wall time.
        self.state_every = max(1, int(state_every))
        self.state_budget = min(1.0, max(1e-4, float(state_budget)))
        self.max_oom_snapshots = max(0, int(max_oom_snapshots))
        self.max_pause_s = min(60.0, max(1e-4, float(max_pause_s)))

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    def as_dict(self) -> dict[str, Any]:
        return {
            "entries": self.entries,
            "stacks": self.stacks,
            "interval_s": self.interval_s,
            "state_every": self.state_every,
            "state_budget": self.state_budget,
            "max_oom_snapshots": self.max_oom_snapshots,
            "max_pause_s": self.max_pause_s,
        }

    @classmethod
    def from_environment(cls) -> Options:
        """The options in the environment; a value that is missing or malformed keeps its
        default (a recorder must start whatever it is handed)."""
        try:
            given = json.loads(os.environ.get(ENV_OPTIONS, "") or "{}")
        except ValueError:
            given = {}
        if not isinstance(given, dict):
            given = {}
        options = cls()
        for key, value in given.items():
            try:
                options = cls(**{**options.as_dict(), key: value})
            except (TypeError, ValueError):
                continue
        return options

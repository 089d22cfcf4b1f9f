"""What a ``whatif`` run produces: each policy's outcome on one request stream, the ranked
comparison of one space, and the whole report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nsysfrag.allocators import Policy
from nsysfrag.analysis import State
from nsysfrag.analysis.results import Counts
from nsysfrag.analysis.metrics import Health

if TYPE_CHECKING:
    from nsysfrag.whatif.recommend import Recommendation
    from nsysfrag.whatif.validate import Validation

SNAPSHOT = "pytorch-snapshot"
NSYS = "nsys-trace"


@dataclass(frozen=True)
class PolicyOutcome:
    """One policy's replay of one request stream, in analyze's terms plus the reserved figures."""

    policy: Policy
    baseline: bool
    peak: State
    final: State
    max_global_frag: float
    max_local_frag: float
    max_free_blocks: int
    max_live_bytes: int
    health: Health
    internal_frag: float
    growth_per_s: float
    peak_reserved_bytes: int
    final_reserved_bytes: int
    peak_requested_bytes: int
    reserved_over_requested_at_peak: float  # Johnstone & Wilson #3: R/U when R peaks
    max_reserved_over_max_requested: float  # Johnstone & Wilson #4
    simulated_ooms: int
    first_oom_time_ns: int | None
    largest_free_at_oom_bytes: list[int]
    timeline_time_ns: list[int]
    timeline_reserved_bytes: list[int]
    seconds: float

    @property
    def name(self) -> str:
        return self.policy.name


@dataclass(frozen=True)
class SpaceComparison:
    """Every policy on one request stream (a device of a snapshot, a space of a trace)."""

    label: str
    pid: int | None
    device: int
    capacity_bytes: int
    capacity_source: str  # nsysfrag.capacity.SOURCES
    capacity_basis: str  # the source in words
    requests: int  # replayed: the recorded allocations, failed ones and the window's live blocks
    frees: int  # replayed
    streams: int
    first_time_ns: int  # the input's first event, where every time a report shows counts from
    recorded_peak_reserved_bytes: int | None
    outcomes: list[PolicyOutcome]  # ranked, best first
    recommendation: Recommendation
    warnings: list[str] = field(default_factory=list)
    timestamps: bool = True  # False: every *_time_ns is a trace entry number
    counts: Counts = field(default_factory=Counts)  # analyze's counts of the same space
    peak_requested_bytes: int = 0  # the most the run requested at once, whatever the capacity

    @property
    def baseline(self) -> PolicyOutcome | None:
        return next((o for o in self.outcomes if o.baseline), None)


@dataclass(frozen=True)
class WhatifReport:
    input_path: str
    input_kind: str  # SNAPSHOT or NSYS
    request_level: str  # what one request is, in words
    spaces: list[SpaceComparison]
    notes: list[str]
    validation: Validation | None = None


def rank_key(o: PolicyOutcome) -> tuple[int, int, float, str]:
    """Fewer simulated OOMs, then less peak reserved, then less fragmentation."""
    return (o.simulated_ooms, o.peak_reserved_bytes, o.max_global_frag, o.name)

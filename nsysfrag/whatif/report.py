"""What a ``whatif`` run found: each space's policies ranked with the recommendation
(:class:`SpaceComparison`), and the whole run (:class:`WhatifReport`). Above the outcomes
(``results``), the recommendation (``recommend``) and the validation (``validate``) it holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nsysfrag.analysis.results import Counts
from nsysfrag.whatif.results import PolicyOutcome

if TYPE_CHECKING:
    from nsysfrag.whatif.recommend import Recommendation
    from nsysfrag.whatif.validate import Validation


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

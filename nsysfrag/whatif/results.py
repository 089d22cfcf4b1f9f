"""Each policy's outcome on one request stream, and the order they rank in; the ranked
comparison of a space and the whole run are ``report``'s."""

from __future__ import annotations

from dataclasses import dataclass

from nsysfrag.allocators import Policy
from nsysfrag.analysis import State
from nsysfrag.analysis.metrics import Health

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


def rank_key(o: PolicyOutcome) -> tuple[int, int, float, str]:
    """Fewer simulated OOMs, then less peak reserved, then less fragmentation."""
    return (o.simulated_ooms, o.peak_reserved_bytes, o.max_global_frag, o.name)

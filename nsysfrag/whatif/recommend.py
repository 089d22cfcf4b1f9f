"""The recommendation, as data: which policy a PyTorch user should switch to (or none) and the
numbers it follows from. The words are the reporters' (``reporters/whatif/words.py``).

The candidates are the policies a PyTorch user can switch to (a ``torch`` setting or
``cuda-async``); the reference models are quoted for scale only. Policies within 1 % of the
best peak (and with as few OOMs) count as equal; among those the baseline wins, then a setting
of the native allocator over a backend switch, then the shorter PYTORCH_CUDA_ALLOC_CONF. The
baseline is kept unless the best is at least 1 % lower or avoids simulated OOMs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nsysfrag.whatif.results import PolicyOutcome, rank_key

NEAR_EQUAL = 0.01  # peaks within 1 % of each other are a tie for the recommendation
SEGMENTS = "segments"  # the requests are a caching allocator's segments: nothing to say
KEEP = "keep"  # keep the baseline
SWITCH = "switch"  # switch to ``policy``


@dataclass(frozen=True)
class Scale:
    """The best reference model, for scale."""

    policy: str
    peak_reserved_bytes: int
    peak_requested_bytes: int


@dataclass(frozen=True)
class Recommendation:
    """What to change, and the numbers it follows from."""

    verdict: str  # SEGMENTS, KEEP or SWITCH
    policy: str | None  # the recommended policy, None to keep the baseline
    family: str | None  # its family
    alloc_conf: str | None  # the PYTORCH_CUDA_ALLOC_CONF to set
    baseline: str
    baseline_peak_reserved_bytes: int
    recommended_peak_reserved_bytes: int
    change: float  # relative change of peak reserved, negative = less
    baseline_ooms: int
    recommended_ooms: int
    capacity_bytes: int
    scale: Scale | None  # the reference models' best, for scale


def recommend(
    outcomes: Sequence[PolicyOutcome], capacity: int, segments_suspected: bool = False
) -> Recommendation:
    """The best policy a PyTorch user can switch to, against the baseline (the run's own
    settings, or PyTorch's defaults)."""
    base = next((o for o in outcomes if o.baseline), outcomes[0])
    keep = Recommendation(
        KEEP, None, None, None, base.name, base.peak_reserved_bytes, base.peak_reserved_bytes,
        0.0, base.simulated_ooms, base.simulated_ooms, capacity, _scale(outcomes),
    )  # fmt: skip
    if segments_suspected:
        return Recommendation(
            SEGMENTS, None, None, None, base.name, base.peak_reserved_bytes,
            base.peak_reserved_bytes, 0.0, base.simulated_ooms, base.simulated_ooms, capacity,
            None,
        )  # fmt: skip
    best = _best_actionable(outcomes, base)
    change = (
        (best.peak_reserved_bytes - base.peak_reserved_bytes) / base.peak_reserved_bytes
        if base.peak_reserved_bytes
        else 0.0
    )
    better = best is not base and (
        best.simulated_ooms < base.simulated_ooms
        or (best.simulated_ooms == base.simulated_ooms and change <= -NEAR_EQUAL)
    )
    if not better:
        return keep
    return Recommendation(
        SWITCH, best.name, best.policy.family, best.policy.alloc_conf(), base.name,
        base.peak_reserved_bytes, best.peak_reserved_bytes, change, base.simulated_ooms,
        best.simulated_ooms, capacity, keep.scale,
    )  # fmt: skip


def _best_actionable(outcomes: Sequence[PolicyOutcome], base: PolicyOutcome) -> PolicyOutcome:
    """The best policy a PyTorch user can switch to (see the module's rules for ties)."""
    actionable = [o for o in outcomes if o.policy.actionable]
    if not actionable:
        return base
    best = min(actionable, key=rank_key)
    near = [
        o for o in actionable
        if o.simulated_ooms == best.simulated_ooms
        and o.peak_reserved_bytes <= best.peak_reserved_bytes * (1 + NEAR_EQUAL)
    ]  # fmt: skip

    def preference(o: PolicyOutcome) -> tuple[bool, bool, int, tuple[int, int, float, str]]:
        conf = o.policy.alloc_conf() or ""
        return (not o.baseline, o.policy.family != "torch", len(conf), rank_key(o))

    return min(near, key=preference)


def _scale(outcomes: Sequence[PolicyOutcome]) -> Scale | None:
    refs = [o for o in outcomes if not o.policy.actionable]
    if not refs:
        return None
    floor = min(refs, key=rank_key)
    return Scale(floor.name, floor.peak_reserved_bytes, floor.peak_requested_bytes)

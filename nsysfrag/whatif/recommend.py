"""The recommendation, as data: which policy a PyTorch user should switch to (or none) and the
numbers it follows from. The words are the reporters' (``reporters/whatif/words.py``).

The truth rule: the baseline is the run's own settings, simulated, and the model's error ``e``
on this input is how far that simulation is from what the run recorded (see
:func:`model_error`): its peak reserved where a trace recorded the run (``TRACE``), or, for a
snapshot of the final state only (``STATE``), the reserved memory of its segments, which the
replay of its live blocks must reproduce too. A policy a PyTorch user can switch to (a ``torch`` setting or
``cuda-async``; the reference models are quoted for scale only) is recommended only when it
lowers peak reserved by more than ``max(e, 1 %)`` of the baseline's and has no more simulated
OOMs than the baseline. Among those, policies within 1 % of the best peak count as equal, and a
setting of the native allocator wins over a backend switch, then the shorter
PYTORCH_CUDA_ALLOC_CONF.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nsysfrag.whatif.results import PolicyOutcome, rank_key

MIN_SAVING = 0.01  # below this a saving is noise whatever the model's error
NEAR_EQUAL = 0.01  # peaks within 1 % of each other are a tie among recommendable policies
SEGMENTS = "segments"  # the requests are a caching allocator's segments: nothing to say
KEEP = "keep"  # keep the baseline
SWITCH = "switch"  # switch to ``policy``
TRACE = "trace"  # e: the simulated baseline's peak reserved against the traced run's
STATE = "state"  # e: the baseline's reserved after replaying a state-only snapshot's live
# blocks against its segments (the one moment such a snapshot records)


@dataclass(frozen=True)
class Scale:
    """The best reference model, for scale."""

    policy: str
    peak_reserved_bytes: int
    peak_requested_bytes: int


@dataclass(frozen=True)
class Candidate:
    """A policy a PyTorch user could switch to, against the baseline."""

    policy: str
    family: str
    alloc_conf: str | None  # the PYTORCH_CUDA_ALLOC_CONF to set
    peak_reserved_bytes: int
    saving_bytes: int  # baseline peak reserved - this policy's (negative: it needs more)
    saving_ratio: float  # saving_bytes / the baseline's peak reserved
    simulated_ooms: int


@dataclass(frozen=True)
class Recommendation:
    """What to change, and the numbers it follows from."""

    verdict: str  # SEGMENTS, KEEP or SWITCH
    baseline: str
    baseline_peak_reserved_bytes: int  # simulated
    recorded_peak_reserved_bytes: int | None  # what the run recorded, where it did
    baseline_ooms: int
    model_error: float | None  # None: the input records no reserved memory (nsys)
    error_basis: str | None  # TRACE or STATE: what ``model_error`` compares; None with it
    threshold: float  # max(model_error, 1 %): what a saving must exceed
    capacity_bytes: int
    chosen: Candidate | None  # the recommended policy (SWITCH)
    best_other: Candidate | None  # KEEP: the best policy that did not make it, if any
    scale: Scale | None  # the reference models' best, for scale
    # KEEP: the best-ranked policy with fewer simulated OOMs than the baseline, if any. The
    # truth rule recommends savings only; a policy that removes the run's failures at a cost in
    # peak reserved is still news to a user whose job died for memory, so the report says so.
    fewer_ooms: Candidate | None = None

    @property
    def policy(self) -> str | None:
        return self.chosen.policy if self.chosen else None


def model_error(simulated: int, recorded: int | None, replay_error: float | None) -> float | None:
    """The model's error on an input it can be checked against: the larger of the simulated
    baseline's distance from the recorded reserved bytes (``|simulated - recorded| /
    recorded``: the peak against the traced run's, or against a state-only snapshot's segments,
    its one recorded moment) and the validation replay's (the same, replayed from the recorded state at the
    window's start: ``replay_error``). None when nothing was recorded."""
    if recorded is None or recorded <= 0:
        return None
    e = abs(simulated - recorded) / recorded
    return max(e, abs(replay_error)) if replay_error is not None else e


def recommend(
    outcomes: Sequence[PolicyOutcome],
    capacity: int,
    segments_suspected: bool = False,
    recorded_peak: int | None = None,
    error: float | None = None,
    error_basis: str = TRACE,
) -> Recommendation:
    """The policy to switch to under the truth rule, against the baseline (the run's own
    settings, or PyTorch's defaults); ``error`` is the model's error on this input, measured
    as ``error_basis`` says."""
    base = next((o for o in outcomes if o.baseline), outcomes[0])
    threshold = max(error or 0.0, MIN_SAVING)
    others = [_candidate(o, base) for o in sorted(outcomes, key=rank_key)
              if o.policy.actionable and not o.baseline]  # fmt: skip
    passing = [c for c in others
               if c.simulated_ooms <= base.simulated_ooms and c.saving_ratio > threshold]  # fmt: skip
    chosen = _preferred(passing) if passing and not segments_suspected else None
    verdict = SEGMENTS if segments_suspected else (SWITCH if chosen else KEEP)
    return Recommendation(
        verdict=verdict,
        baseline=base.name,
        baseline_peak_reserved_bytes=base.peak_reserved_bytes,
        recorded_peak_reserved_bytes=recorded_peak,
        baseline_ooms=base.simulated_ooms,
        model_error=error,
        error_basis=error_basis if error is not None else None,
        threshold=threshold,
        capacity_bytes=capacity,
        chosen=chosen,
        best_other=max(others, key=lambda c: c.saving_bytes) if others and not chosen else None,
        fewer_ooms=next((c for c in others if c.simulated_ooms < base.simulated_ooms), None)
        if not chosen and not segments_suspected
        else None,
        scale=None if segments_suspected else _scale(outcomes),
    )


def _candidate(o: PolicyOutcome, base: PolicyOutcome) -> Candidate:
    saving = base.peak_reserved_bytes - o.peak_reserved_bytes
    ratio = saving / base.peak_reserved_bytes if base.peak_reserved_bytes else 0.0
    return Candidate(o.name, o.policy.family, o.policy.alloc_conf(), o.peak_reserved_bytes,
                     saving, ratio, o.simulated_ooms)  # fmt: skip


def _preferred(passing: list[Candidate]) -> Candidate:
    """The best of the recommendable policies (they come in rank order); those within 1 % of
    its peak tie, won by a native setting, then the shorter PYTORCH_CUDA_ALLOC_CONF."""
    best = passing[0]
    near = [c for c in passing
            if c.simulated_ooms == best.simulated_ooms
            and c.peak_reserved_bytes <= best.peak_reserved_bytes * (1 + NEAR_EQUAL)]  # fmt: skip
    return min(near, key=lambda c: (c.family != "torch", len(c.alloc_conf or ""),
                                    passing.index(c)))  # fmt: skip


def _scale(outcomes: Sequence[PolicyOutcome]) -> Scale | None:
    refs = [o for o in outcomes if not o.policy.actionable]
    if not refs:
        return None
    floor = min(refs, key=rank_key)
    return Scale(floor.name, floor.peak_reserved_bytes, floor.peak_requested_bytes)

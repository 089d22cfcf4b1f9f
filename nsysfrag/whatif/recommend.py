"""The recommendation, as data: which policy a PyTorch user should switch to (or none) and the
numbers it follows from. The words are the reporters' (``reporters/whatif/words.py``).

The truth rule, model by model: the baseline is the run's own settings, simulated, and a
model's error ``e`` on this input is how far that simulation is from what the run recorded
(see :func:`model_error`): its peak reserved where a trace recorded the run (``TRACE``), or,
for a snapshot of the final state only (``STATE``), the reserved memory of its segments, which
the replay of its live blocks must reproduce too. Only the ``torch`` model is checked so: it is
the model of the allocator that recorded the run, with the run's own settings, so a snapshot
validates it (every ``torch`` setting is that model); nothing checks ``cuda-async`` (nor any
model on an nsys export, which records no reserved memory). A policy a PyTorch user can switch
to (a ``torch`` setting or ``cuda-async``; the reference models are quoted for scale only) is
recommended only when its model was validated on this input, it lowers peak reserved by more
than ``max(e, 1 %)`` of the baseline's, with ``e`` that model's own error, and it has no more
simulated OOMs than the baseline. Among those, policies within 1 % of the best peak count as
equal, and a setting of the native allocator wins, then the shorter PYTORCH_CUDA_ALLOC_CONF. A
policy of an unvalidated model that would have passed is *worth trying, not validated*: shown
as such, never as the recommendation, never with another model's error.

OOMs come first. When the run recorded a failed allocation or the baseline has simulated OOMs,
a validated policy with fewer simulated OOMs than the baseline is recommended for that reason
(``FEWER_OOMS``), whatever it costs in peak reserved (the cost is part of the recommendation),
before any saving is considered: the fewest OOMs, then the least peak reserved, with the same
tie rule. Only when none avoids more failures does the saving rule above apply (``SAVING``). So
the report never says "keep" of a run that died while a validated setting avoids the death.
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
VALIDATED_FAMILY = "torch"  # the model a snapshot checks: the allocator that recorded it
FEWER_OOMS = "fewer_ooms"  # why ``chosen`` is recommended: it avoids failures the baseline has
SAVING = "saving"  # ... it saves more peak reserved than max(e, 1 %)
REMEDY = "remedy"  # an nsys trace: a remedy worth trying, not validated (``DriverVerdict.pick``)


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
    validated: bool = False  # its model was checked against this input
    model_error: float | None = None  # that model's own error on this input (validated only)




@dataclass(frozen=True)
class Remedy:
    """One remedy against the recorded driver behaviour."""

    policy: str
    description: str
    peak_reserved_bytes: int
    saving_bytes: int  # the driver's peak reserved - this remedy's (negative: it needs more)
    saving_ratio: float
    new_failures: int  # requests the driver served that this remedy could not place
    roomier: int  # recorded failures at which it could serve a larger request than the driver
    room_bytes: tuple[int, int] | None  # the least and most it could serve at them (None: none)


@dataclass(frozen=True)
class DriverVerdict:
    """What the recommendation of an nsys trace follows from."""

    program: str  # whatif.driver.PROGRAM_DRIVER or PROGRAM_SEGMENTS
    failures: int  # allocations that failed in the driver
    driver_room_bytes: tuple[int, int] | None  # the driver's largest usable request at them
    remedies: tuple[Remedy, ...]  # ranked as the policies are
    pick: Remedy | None
    reason: str | None  # FEWER_OOMS or SAVING with a pick


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
    reason: str | None  # SWITCH: FEWER_OOMS or SAVING
    best_other: Candidate | None  # KEEP: the best policy that did not make it, if any
    scale: Scale | None  # the reference models' best, for scale
    # KEEP: the best-ranked policy with fewer simulated OOMs than the baseline, if any. The
    # truth rule recommends savings only; a policy that removes the run's failures at a cost in
    # peak reserved is still news to a user whose job died for memory, so the report says so.
    fewer_ooms: Candidate | None = None
    # A policy of a model not validated on this input that saves more than the threshold (and
    # more than ``chosen``) with no more simulated OOMs: worth trying, never the recommendation.
    worth_trying: Candidate | None = None
    recorded_failures: int = 0  # the failed allocations the run itself recorded
    # An nsys trace: its kind of program and each remedy against the recorded driver behaviour
    # (whatif.remedies); None for a snapshot.
    driver: DriverVerdict | None = None

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
    recorded_failures: int = 0,
    peak_requested: int | None = None,
) -> Recommendation:
    """The policy to switch to under the truth rule, against the baseline (the run's own
    settings, or PyTorch's defaults); ``error`` is the ``torch`` model's error on this input,
    measured as ``error_basis`` says (None: it cannot be checked, so nothing is validated);
    ``recorded_failures`` the run's own failed allocations; ``peak_requested`` the most the
    run requested at once (default: the reference model's own)."""
    base = next((o for o in outcomes if o.baseline), outcomes[0])
    threshold = max(error or 0.0, MIN_SAVING)
    others = [_candidate(o, base, error) for o in sorted(outcomes, key=rank_key)
              if o.policy.actionable and not o.baseline]  # fmt: skip
    checked = [c for c in others if c.validated]
    # The run died (or would, in the model): avoiding that comes before any saving.
    failing = recorded_failures > 0 or base.simulated_ooms > 0
    avoiding = [c for c in checked if c.simulated_ooms < base.simulated_ooms] if failing else []
    passing = [c for c in checked
               if c.simulated_ooms <= base.simulated_ooms and c.saving_ratio > threshold]  # fmt: skip
    chosen, reason = None, None
    if not segments_suspected and avoiding:
        chosen, reason = _preferred(avoiding), FEWER_OOMS
    elif not segments_suspected and passing:
        chosen, reason = _preferred(passing), SAVING
    verdict = SEGMENTS if segments_suspected else (SWITCH if chosen else KEEP)
    # An unchecked model's saving must clear 1 % and the checked one's: nothing else bounds it.
    bar = max(MIN_SAVING, chosen.saving_ratio if chosen else 0.0)
    untested = [c for c in others if not c.validated
                and c.simulated_ooms <= base.simulated_ooms and c.saving_ratio > bar]  # fmt: skip
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
        reason=reason,
        best_other=max(checked, key=lambda c: c.saving_bytes) if checked and not chosen else None,
        fewer_ooms=next((c for c in others if c.simulated_ooms < base.simulated_ooms), None)
        if not chosen and not segments_suspected
        else None,
        scale=None if segments_suspected else _scale(outcomes, peak_requested),
        worth_trying=None
        if segments_suspected or not untested
        else max(untested, key=lambda c: c.saving_bytes),
        recorded_failures=recorded_failures,
    )


def _candidate(o: PolicyOutcome, base: PolicyOutcome, error: float | None) -> Candidate:
    """``o`` against the baseline; validated when its model is the one ``error`` measured."""
    saving = base.peak_reserved_bytes - o.peak_reserved_bytes
    ratio = saving / base.peak_reserved_bytes if base.peak_reserved_bytes else 0.0
    validated = error is not None and o.policy.family == VALIDATED_FAMILY
    return Candidate(o.name, o.policy.family, o.policy.alloc_conf(), o.peak_reserved_bytes,
                     saving, ratio, o.simulated_ooms, validated,
                     error if validated else None)  # fmt: skip


def _preferred(passing: list[Candidate]) -> Candidate:
    """The best of the recommendable policies (they come in rank order); those within 1 % of
    its peak tie, won by a native setting, then the shorter PYTORCH_CUDA_ALLOC_CONF."""
    best = passing[0]
    near = [c for c in passing
            if c.simulated_ooms == best.simulated_ooms
            and c.peak_reserved_bytes <= best.peak_reserved_bytes * (1 + NEAR_EQUAL)]  # fmt: skip
    return min(near, key=lambda c: (c.family != "torch", len(c.alloc_conf or ""),
                                    passing.index(c)))  # fmt: skip


def _scale(outcomes: Sequence[PolicyOutcome], peak_requested: int | None) -> Scale | None:
    refs = [o for o in outcomes if not o.policy.actionable]
    if not refs:
        return None
    floor = min(refs, key=rank_key)
    requested = floor.peak_requested_bytes if peak_requested is None else peak_requested
    return Scale(floor.name, floor.peak_reserved_bytes, requested)

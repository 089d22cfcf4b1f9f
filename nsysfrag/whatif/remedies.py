"""The recommendation for an nsys trace, as data: against the recorded driver behaviour, which
remedy a program that calls ``cudaMalloc`` directly could adopt (the words are the reporters':
``reporters/whatif/driver_words.py``).

The baseline is the record itself (``whatif.driver``), so it has no model error; the remedies'
models (a stream-ordered pool, per-size free lists, one arena up front) were never run by this
program, so none is validated on it and none becomes the contract's ``recommendation``: the
one that passes the rule below is *worth trying, not validated*, with its figures.

The rule, OOM first. A remedy that cannot place a request the driver served adds a failure the
run never had (``new_failures``); it is never picked. When the run recorded failed
allocations, nsys recorded no size for them, so no replay can say a remedy would have served
them; what it can say is the largest request the remedy could have served at each failure's
moment (its largest free block, or the device's memory it has not reserved where it can still
grow), against the driver's (analyze's largest usable request, which the failed request
exceeded). A remedy with more room than the driver at a failure may have avoided it; with no
more room it certainly fails too. The pick is the remedy with more room at the most failures,
then the least peak reserved (``reason = "fewer_ooms"``, its cost in peak reserved beside it).
With no failure recorded, the pick is the remedy that lowers peak reserved the most, by more
than 1 % (``reason = "saving"``). Otherwise the recorded behaviour stays (``keep``), which is
never said of a run that failed: the report then says that no remedy tried leaves more room.

A caching allocator's segments (a PyTorch program seen from the driver) get no remedy at all:
the what-if of such a program belongs to its memory snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from nsysfrag.allocators.base import I64, SimResult
from nsysfrag.whatif.driver import PROGRAM_SEGMENTS, Recorded
from nsysfrag.whatif.recommend import (
    FEWER_OOMS,
    KEEP,
    MIN_SAVING,
    REMEDY,
    SAVING,
    SEGMENTS,
    Candidate,
    DriverVerdict,
    Recommendation,
    Remedy,
)
from nsysfrag.whatif.results import PolicyOutcome

# Families whose memory is fixed once reserved: only their own free blocks serve a request.
_FIXED = frozenset({"arena"})


def room_at(r: SimResult, events: I64, capacity: int, family: str) -> I64:
    """The largest request ``r``'s policy could serve right after each of ``events``: its
    largest free block, or the device's memory it has not reserved where it can still grow."""
    at = np.maximum(events, 0)
    largest: I64 = r.largest_free_bytes[at]
    if family in _FIXED:
        return largest
    room: I64 = np.maximum(largest, np.maximum(capacity - r.reserved_bytes[at], 0))
    return room


def with_repeats(r: SimResult, recorded: Recorded, capacity: int, family: str) -> SimResult:
    """``r`` with the recorded failures it certainly repeats among its OOMs: those at which it
    leaves no more room than the driver had, where the failed request (larger than that) cannot
    fit either. Its OOMs are then at least what it would have had on the whole program's
    requests, failed ones included (a failure where it has more room is not counted)."""
    events = recorded.result.oom_event
    room = room_at(r, events, capacity, family)
    repeated = events[room <= recorded.result.oom_largest_free_bytes]
    if not len(repeated):
        return r
    at = np.concatenate([r.oom_event, repeated])
    largest = np.concatenate([r.oom_largest_free_bytes, r.largest_free_bytes[repeated]])
    order = np.argsort(at, kind="stable")
    return replace(r, oom_event=at[order], oom_largest_free_bytes=largest[order])


def recommend_remedy(
    outcomes: Sequence[PolicyOutcome],
    replays: Mapping[str, SimResult],
    recorded: Recorded,
    program: str,
    capacity: int,
) -> Recommendation:
    """The recommendation of one space of an nsys trace, against its recorded baseline;
    ``replays`` are each policy's own replay of the requests the driver served."""
    base = next(o for o in outcomes if o.baseline)
    events = recorded.result.oom_event
    driver_room = recorded.result.oom_largest_free_bytes
    remedies = []
    for o in outcomes:
        if o.baseline or program == PROGRAM_SEGMENTS:
            continue
        replayed = replays[o.name]  # its own replay: the requests the driver served
        room = room_at(replayed, events, capacity, o.policy.family)
        saving = base.peak_reserved_bytes - o.peak_reserved_bytes
        remedies.append(Remedy(
            o.name, o.policy.description, o.peak_reserved_bytes, saving,
            saving / base.peak_reserved_bytes if base.peak_reserved_bytes else 0.0,
            len(replayed.oom_event), int((room > driver_room).sum()),
            _span(room),
        ))  # fmt: skip
    pick, reason = _pick(remedies, recorded.failures)
    verdict = SEGMENTS if program == PROGRAM_SEGMENTS else (REMEDY if pick else KEEP)
    candidate = _candidate(pick, _outcome_of(outcomes, pick)) if pick else None
    return Recommendation(
        verdict=verdict,
        baseline=base.name,
        baseline_peak_reserved_bytes=base.peak_reserved_bytes,
        recorded_peak_reserved_bytes=base.peak_reserved_bytes,  # the baseline is the record
        baseline_ooms=recorded.failures,
        model_error=None,  # no remedy's model can be checked against this program
        error_basis=None,
        threshold=MIN_SAVING,
        capacity_bytes=capacity,
        chosen=None,
        reason=None,  # nothing is recommended (SWITCH); the pick's reason is the driver's
        best_other=None,
        scale=None,
        fewer_ooms=candidate if reason == FEWER_OOMS else None,
        worth_trying=candidate,
        recorded_failures=recorded.failures,
        driver=DriverVerdict(
            program=program,
            failures=recorded.failures,
            driver_room_bytes=_span(driver_room),
            remedies=tuple(remedies),
            pick=pick,
            reason=reason,
        ),
    )


def _span(values: I64) -> tuple[int, int] | None:
    return (int(values.min()), int(values.max())) if len(values) else None


def _pick(remedies: list[Remedy], failures: int) -> tuple[Remedy | None, str | None]:
    safe = [r for r in remedies if r.new_failures == 0]
    if failures:
        roomier = [r for r in safe if r.roomier > 0]
        if roomier:
            return min(roomier, key=lambda r: (-r.roomier, r.peak_reserved_bytes)), FEWER_OOMS
        return None, None
    saving = [r for r in safe if r.saving_ratio > MIN_SAVING]
    return (max(saving, key=lambda r: r.saving_bytes), SAVING) if saving else (None, None)


def _outcome_of(outcomes: Sequence[PolicyOutcome], remedy: Remedy) -> PolicyOutcome:
    return next(o for o in outcomes if o.name == remedy.policy)


def _candidate(r: Remedy, o: PolicyOutcome) -> Candidate:
    """The remedy as the report's candidate: no PYTORCH_CUDA_ALLOC_CONF (the program does
    not run PyTorch's allocator), not validated."""
    return Candidate(r.policy, o.policy.family, None, r.peak_reserved_bytes, r.saving_bytes,
                     r.saving_ratio, r.new_failures)  # fmt: skip

"""Replay one request stream through every policy and rank the outcomes: fewest simulated OOMs,
then least peak reserved, then least fragmentation."""

from __future__ import annotations

import time
from collections.abc import Sequence

from nsysfrag.allocators import Policy
from nsysfrag.allocators.base import FREE, SimResult
from nsysfrag.whatif.recommend import model_error, recommend
from nsysfrag.whatif.remedies import recommend_remedy, with_repeats
from nsysfrag.whatif.report import SpaceComparison
from nsysfrag.whatif.results import rank_key
from nsysfrag.whatif.streams import RequestSource
from nsysfrag.whatif.summary import summarize


def rank_policies(
    source: RequestSource, policies: Sequence[Policy], replay_error: float | None = None
) -> SpaceComparison:
    """Replay one request stream through every policy and rank them; ``replay_error`` is the
    validation replay's peak error on this device, where there is one."""
    outcomes = []
    todo = list(policies)
    baseline = next((p for p in todo if p.same_settings(source.baseline)), None)
    record = source.recorded  # an nsys trace: the baseline is the record, not a replay
    if baseline is None and (not source.segments_suspected or record is not None):
        baseline = source.baseline
        todo.insert(0, baseline)
    replays: dict[str, SimResult] = {}
    for p in todo:
        started = time.perf_counter()
        if p is baseline and record is not None:
            r = record.result
            outcome = record.outcome(p, source.stream, source.capacity_bytes, 0.0)
        else:
            r = p.simulate(source.stream, source.capacity_bytes)
            seconds = time.perf_counter() - started
            replays[p.name] = r
            if record is not None:  # the recorded failures it certainly repeats are its OOMs too
                r = with_repeats(r, record, source.capacity_bytes, p.family)
            outcome = summarize(p, r, source.stream, source.capacity_bytes, p is baseline,
                                seconds, source.timestamps)  # fmt: skip
        replays.setdefault(p.name, r)
        outcomes.append(outcome)
    outcomes.sort(key=rank_key)
    stream = source.stream
    base = next((o for o in outcomes if o.baseline), None)
    recorded = source.recorded_peak_reserved_bytes
    # A state-only snapshot's replay never frees: its peak is its end, the moment recorded.
    error = model_error(base.peak_reserved_bytes, recorded, replay_error) if base else None
    return SpaceComparison(
        label=source.label,
        pid=source.pid,
        device=source.device,
        capacity_bytes=source.capacity_bytes,
        capacity_source=source.capacity_source,
        capacity_basis=source.capacity_basis,
        requests=stream.n_requests,
        frees=int((stream.kind == FREE).sum()),
        streams=len(stream.stream_names),
        first_time_ns=source.origin_ns,
        counts=source.counts,
        peak_requested_bytes=source.peak_requested_bytes,
        recorded_peak_reserved_bytes=source.recorded_peak_reserved_bytes,
        outcomes=outcomes,
        recommendation=recommend(
            outcomes, source.capacity_bytes, source.segments_suspected, recorded, error,
            source.error_basis, source.counts.failed_allocations, source.peak_requested_bytes,
        )
        if record is None
        else recommend_remedy(outcomes, replays, record, source.program, source.capacity_bytes),
        warnings=source.warnings,
        timestamps=source.timestamps,
    )

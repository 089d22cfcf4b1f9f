"""A policy's replay in analyze's terms — the peak, the final state, the maxima, health — plus the
reserved figures a what-if compares: the one place a :class:`~nsysfrag.allocators.base.SimResult`
becomes a :class:`~nsysfrag.whatif.results.PolicyOutcome`. The replay's state is analyze's
(:mod:`~nsysfrag.whatif.states`: free memory is everything free on the device, the largest
request ``L_eff``) and its figures come from analyze's own code
(:func:`nsysfrag.analysis.summary.fragmentation`)."""

from __future__ import annotations

import numpy as np

from nsysfrag.allocators import Policy
from nsysfrag.allocators.base import I64, RequestStream, SimResult
from nsysfrag.analysis.summary import fragmentation
from nsysfrag.whatif.results import PolicyOutcome
from nsysfrag.whatif.states import device_states

MAX_OOMS_LISTED = 1000  # largest_free_at_oom_bytes keeps the first this many
TIMELINE_POINTS = 400


def summarize(
    policy: Policy,
    r: SimResult,
    stream: RequestStream,
    capacity: int,
    baseline: bool,
    seconds: float,
    timed: bool = True,
) -> PolicyOutcome:
    """analyze's figures of one replay on a device of ``capacity`` bytes, and the reserved
    figures; ``timed=False`` when the stream's times are entry numbers."""
    t = stream.time_ns
    states, pool = device_states(r, capacity)
    f = fragmentation(states, t, capacity, timed, pool)
    last = len(f.global_frag) - 1
    a_peak = int(np.argmax(r.allocated_bytes))
    a = int(r.allocated_bytes[a_peak])
    internal = (a - int(r.live_bytes[a_peak])) / a if a > 0 else 0.0
    r_peak = int(np.argmax(r.reserved_bytes))
    peak_reserved = int(r.reserved_bytes[r_peak])
    u_at = int(r.live_bytes[r_peak])
    peak_requested = f.max_live_bytes
    idx = _sample(len(f.global_frag), [f.peak_index, r_peak])
    return PolicyOutcome(
        policy=policy,
        baseline=baseline,
        **f.headline(),
        internal_frag=internal,
        peak_reserved_bytes=peak_reserved,
        final_reserved_bytes=int(r.reserved_bytes[last]),
        peak_requested_bytes=peak_requested,
        reserved_over_requested_at_peak=peak_reserved / u_at if u_at > 0 else 0.0,
        max_reserved_over_max_requested=peak_reserved / peak_requested if peak_requested else 0.0,
        simulated_ooms=len(r.oom_event),
        first_oom_time_ns=int(t[r.oom_event[0]]) if len(r.oom_event) else None,
        largest_free_at_oom_bytes=r.oom_largest_free_bytes[:MAX_OOMS_LISTED].tolist(),
        timeline_time_ns=t[idx].tolist(),
        timeline_reserved_bytes=r.reserved_bytes[idx].tolist(),
        seconds=seconds,
    )


def _sample(n: int, keep: list[int]) -> I64:
    if n <= TIMELINE_POINTS:
        return np.arange(n, dtype=np.int64)
    spread = np.linspace(0, n - 1, TIMELINE_POINTS - len(keep)).round().astype(np.int64)
    return np.unique(np.concatenate([spread, keep]))

"""A policy's replay in SPEC §3 terms — the peak, the final state, the maxima, health — plus the
reserved figures a what-if compares: the one place a :class:`~nsysfrag.allocators.base.SimResult`
becomes a :class:`~nsysfrag.whatif.results.PolicyOutcome`."""

from __future__ import annotations

import numpy as np

from nsysfrag.allocators import Policy
from nsysfrag.allocators.base import I64, RequestStream, SimResult
from nsysfrag.analysis import State
from nsysfrag.analysis.metrics import (
    F64,
    global_frag,
    growth_per_second,
    local_frag,
    overall_health,
)
from nsysfrag.whatif.results import PolicyOutcome

MAX_OOMS_LISTED = 1000  # largest_free_at_oom_bytes keeps the first this many
TIMELINE_POINTS = 400


def _state(i: int, t: I64, g: F64, loc: F64, r: SimResult) -> State:
    return State(
        time_ns=int(t[i]),
        global_frag=float(g[i]),
        local_frag=float(loc[i]),
        free_blocks=int(r.free_blocks[i]),
        largest_free_bytes=int(r.largest_free_bytes[i]),
        free_bytes=int(r.free_bytes[i]),
        live_bytes=int(r.live_bytes[i]),
    )


def summarize(
    policy: Policy, r: SimResult, stream: RequestStream, capacity: int, baseline: bool, seconds: float
) -> PolicyOutcome:
    """SPEC §3 figures of one replay, with the policy's own free memory as F."""
    g = global_frag(r.free_bytes, r.largest_free_bytes, capacity)
    loc = local_frag(r.free_bytes, r.largest_free_bytes)
    t = stream.time_ns
    peak = int(np.argmax(g))
    last = len(g) - 1
    max_global, max_local = float(g.max()), float(loc.max())
    max_blocks = int(r.free_blocks.max())
    a_peak = int(np.argmax(r.allocated_bytes))
    a = int(r.allocated_bytes[a_peak])
    internal = (a - int(r.live_bytes[a_peak])) / a if a > 0 else 0.0
    r_peak = int(np.argmax(r.reserved_bytes))
    peak_reserved = int(r.reserved_bytes[r_peak])
    u_at = int(r.live_bytes[r_peak])
    peak_requested = int(r.live_bytes.max())
    idx = _sample(len(g), [peak, r_peak])
    return PolicyOutcome(
        policy=policy,
        baseline=baseline,
        peak=_state(peak, t, g, loc, r),
        final=_state(last, t, g, loc, r),
        max_global_frag=max_global,
        max_local_frag=max_local,
        max_free_blocks=max_blocks,
        max_live_bytes=peak_requested,
        health=overall_health(max_global, max_local, max_blocks),
        internal_frag=internal,
        growth_per_s=growth_per_second(t, g) if len(t) else 0.0,
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

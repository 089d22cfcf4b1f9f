"""From the list of moments of one space to peak, final, max, health and health_basis (SPEC §3).

A *moment* is a plain dict: the state after one event. Every model fills ``time_ns``,
``global_frag``, ``local_frag``, ``free_blocks``, ``largest_free_bytes``, ``free_bytes``,
``live_bytes`` and ``material`` (whether local_frag and free_blocks count toward health there:
F >= 0.05 C in the observed model, D + F >= 0.05 C in the pytorch-segments model). The
pytorch-segments model adds the SPEC §9 byte keys, which peak and final carry along.
"""

from __future__ import annotations

from typing import Any

Moment = dict[str, Any]

RATED = ("global_frag", "local_frag", "free_blocks")
LEVELS = ("ok", "warn", "critical")


def level(metric: str, value: float) -> str:
    """The SPEC §3 table, boundaries exactly as written there."""
    if metric == "global_frag":  # < 0.20 / 0.20–0.40 / >= 0.40
        if value >= 0.40:
            return "critical"
        return "warn" if value >= 0.20 else "ok"
    if metric == "local_frag":  # < 0.30 / 0.30–0.60 / > 0.60
        if value > 0.60:
            return "critical"
        return "warn" if value >= 0.30 else "ok"
    if metric == "free_blocks":  # < 100 / 100–500 / > 500
        if value > 500:
            return "critical"
        return "warn" if value >= 100 else "ok"
    raise ValueError(metric)


def summarize(moments: list[Moment], state_keys: tuple[str, ...]) -> dict[str, Any]:
    """peak, final, max, health and health_basis of one space (moments in event order)."""
    if not moments:
        raise ValueError("a space without moments")

    def state(m: Moment) -> dict[str, Any]:
        return {k: m[k] for k in state_keys}

    # Peak: the FIRST moment at which global_frag reaches its maximum.
    peak = moments[0]
    for m in moments:
        if m["global_frag"] > peak["global_frag"]:
            peak = m
    # Memory peak (SPEC 1.2 §3): the first moment reserved is at its maximum; of equal ones,
    # the larger allocated, then the first.
    memory_peak = None
    if "reserved_bytes" in moments[0]:
        memory_peak = moments[0]
        for m in moments:
            if (m["reserved_bytes"], m["allocated_bytes"]) > (
                memory_peak["reserved_bytes"], memory_peak["allocated_bytes"]
            ):
                memory_peak = m
    unconditional = {
        k: max(m[k] for m in moments) for k in ("global_frag", "local_frag", "free_blocks", "live_bytes")
    }

    # Health: each rated metric at its maximum over the material moments (global_frag: all).
    worst = "ok"
    candidates: list[tuple[int, int, str, Any]] = []  # (time order, metric order, metric, value)
    for order, metric in enumerate(RATED):
        considered = [
            (i, m) for i, m in enumerate(moments) if metric == "global_frag" or m["material"]
        ]
        if not considered:
            continue
        top_i, top = considered[0]
        for i, m in considered:
            if m[metric] > top[metric]:
                top_i, top = i, m
        lv = level(metric, top[metric])
        if LEVELS.index(lv) > LEVELS.index(worst):
            worst, candidates = lv, []
        if lv == worst and lv != "ok":
            candidates.append((top_i, order, metric, top))
    basis = None
    if candidates:
        # Several metrics at the worst level: the one whose maximum came first (QUESTIONS.md Q2).
        _, _, metric, m = min(candidates, key=lambda c: (c[0], c[1]))
        basis = {"metric": metric, "value": m[metric], "time_ns": m["time_ns"]}
    return {
        "peak": state(peak),
        **({} if memory_peak is None else {"memory_peak": state(memory_peak)}),
        "final": state(moments[-1]),
        "max": unconditional,
        "health": worst,
        "health_basis": basis,
    }

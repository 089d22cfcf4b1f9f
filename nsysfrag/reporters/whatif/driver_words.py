"""The what-if's words for an nsys trace: the recorded driver behaviour as the baseline, and
the remedies a program that calls ``cudaMalloc`` directly could adopt (``whatif.remedies``).
Never a PYTORCH_CUDA_ALLOC_CONF: such a program does not run PyTorch's allocator."""

from __future__ import annotations

from nsysfrag.allocators.driver import NAME as DRIVER
from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.whatif import PolicyOutcome
from nsysfrag.whatif.recommend import FEWER_OOMS, SEGMENTS, DriverVerdict, Recommendation, Remedy

SNAPSHOT_HINT = (
    "take a PyTorch memory snapshot (nsysfrag record -- python train.py, or"
    " torch.cuda.memory._record_memory_history then _dump_snapshot) and run nsysfrag whatif on"
    " it; or record with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (nsysfrag profile --torch-tensors)"
)


def _span(room: tuple[int, int] | None) -> str:
    if room is None:
        return "nothing"
    low, high = room
    return format_bytes(low) if low == high else f"{format_bytes(low)}–{format_bytes(high)}"


def _change(rec: Recommendation, r: Remedy) -> str:
    """``39.46 GiB → 38.90 GiB (−1.4 %)``: the remedy's peak reserved against the driver's."""
    sign = "−" if r.saving_ratio > 0 else "+"
    return (
        f"{format_bytes(rec.baseline_peak_reserved_bytes)} →"
        f" {format_bytes(r.peak_reserved_bytes)} ({sign}{abs(r.saving_ratio) * 100:.1f} %)"
    )


def _served(r: Remedy) -> str:
    if r.new_failures == 0:
        return "places every allocation the driver served"
    return f"fails {r.new_failures} allocation(s) the driver served"


def _others(rec: Recommendation, d: DriverVerdict) -> str:
    """One clause per remedy other than the pick."""
    parts = []
    for r in d.remedies:
        if r is d.pick:
            continue
        room = (
            f", more room than the driver at {r.roomier} of {d.failures} failures"
            if d.failures
            else ""
        )
        parts.append(f"{r.policy} {_served(r)}{room}, peak reserved {_change(rec, r)}")
    return ("; ".join(parts) + ".") if parts else ""


def driver_recommendation_text(rec: Recommendation) -> str:
    """Plain words that follow from the numbers of an nsys trace's recommendation."""
    d = rec.driver
    assert d is not None
    if rec.verdict == SEGMENTS:
        return (
            "No recommendation: every allocation is a multiple of 2 MiB, a caching allocator's"
            " segments (a PyTorch program), so a replay of them says nothing about the tensors"
            f" inside; for the allocator-level what-if, {SNAPSHOT_HINT}."
        )
    failed = (
        f"The run had {d.failures} failed allocation(s) in the driver, each larger than the"
        f" largest request the driver could serve then ({_span(d.driver_room_bytes)}); nsys"
        " records no size for a failed call, so no replay can show one avoided, only where a"
        " remedy leaves room for a larger request (a remedy's simulated OOMs count the failures"
        " where it has no more room than the driver)."
        if d.failures
        else ""
    )
    pick = d.pick
    others = _others(rec, d)
    if pick is None:
        if d.failures:
            return (
                f"{failed} No remedy tried leaves more room at any failure without failing"
                f" allocations the driver served. {others}"
            ).strip()
        return (
            f"Keep cudaMalloc as recorded ({format_bytes(rec.baseline_peak_reserved_bytes)} peak"
            " reserved): no remedy tried places every allocation the driver served with more"
            f" than 1 % less peak reserved. {others}"
        ).strip()
    if d.reason == FEWER_OOMS:
        gain = (
            f"leaves room for a larger request than the driver did at {pick.roomier} of the"
            f" {d.failures} failures (it could serve {_span(pick.room_bytes)} there),"
            f" {_served(pick)}, at peak reserved {_change(rec, pick)}"
        )
    else:
        gain = f"lowers peak reserved {_change(rec, pick)} and {_served(pick)}"
    text = (
        f"Worth trying, not validated: {pick.policy} ({pick.description}) {gain}; this program"
        " never ran under it, so the figure has no error bound."
    )
    rest = f" Also tried: {others}" if others else ""
    return f"{failed} {text}{rest}".strip()


def driver_baseline_text(rec: Recommendation) -> str:
    """The baseline of an nsys trace: the record itself, not a simulation."""
    d = rec.driver
    assert d is not None
    failed = f", {d.failures} failed allocation(s)" if d.failures else ""
    return (
        f"{rec.baseline}: {format_bytes(rec.baseline_peak_reserved_bytes)} peak reserved"
        f"{failed}, as recorded (the observed model, as analyze reports it: no simulation, no"
        " model error)"
    )


def failures_phrase(o: PolicyOutcome) -> tuple[str, str]:
    """What a row's failures are, and what the size listed at each is: the recorded driver's
    are real failed calls, at each of which analyze gives the largest usable request."""
    if o.policy.family == DRIVER:
        return "failed allocation(s) recorded", "largest usable request at each"
    return "simulated OOM(s)", "largest free block at each"

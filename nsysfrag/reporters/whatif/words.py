"""The what-if report's words and numbers as text, shared by the terminal and HTML renderers:
the recommendation in a sentence, the reference models for scale, and the small formatters."""

from __future__ import annotations

from nsysfrag.metrics import format_bytes
from nsysfrag.whatif import PolicyOutcome, Recommendation, SpaceComparison
from nsysfrag.whatif.recommend import SEGMENTS, SWITCH

VALIDATION_COLUMNS = (
    "device", "compared", "recorded", "simulated", "matched\nin order", "match",
    "peak reserved\nrecorded", "peak reserved\nsimulated", "error", "OOM\npaths", "empty\ncache",
)  # fmt: skip


def pair(a: int, b: int) -> str:
    """``61.2 → 47.9 GiB``: both in the unit of the larger, with enough decimals to differ."""
    big = max(abs(a), abs(b), 1)
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if big >= scale:
            x, y = a / scale, b / scale
            digits = 1 if big / scale >= 10 else 2
            while digits < 4 and a != b and f"{x:.{digits}f}" == f"{y:.{digits}f}":
                digits += 1
            return f"{x:.{digits}f} → {y:.{digits}f} {unit}"
    return f"{a} → {b} B"


def signed_percent(x: float) -> str:
    text = f"{abs(x) * 100:.0f} %"
    return ("−" if x < 0 else "+") + text


def capacity_text(capacity: int) -> str:
    return format_bytes(capacity).replace(".00 ", " ")


def conf_text(conf: str | None) -> str:
    if conf == "":
        return "the default settings (unset PYTORCH_CUDA_ALLOC_CONF)"
    return f"PYTORCH_CUDA_ALLOC_CONF={conf}"


def recommendation_text(rec: Recommendation) -> str:
    """Plain words that follow from the numbers."""
    cap = capacity_text(rec.capacity_bytes)
    if rec.verdict == SEGMENTS:
        return (
            "No recommendation: the requests look like caching-allocator segments (every size a"
            " multiple of 2 MiB), so the replay says nothing about the tensors inside them."
        )
    if rec.verdict != SWITCH:
        ooms = (
            f"no simulated OOM at {cap}"
            if rec.baseline_ooms == 0
            else f"{rec.baseline_ooms} simulated OOM(s) at {cap} that no setting tried avoids"
        )
        return (
            f"Keep {rec.baseline}: no allocator setting tried lowers peak reserved by 1 % or more"
            f" ({format_bytes(rec.baseline_peak_reserved_bytes)} peak reserved, {ooms})."
        )
    if rec.recommended_ooms == 0:
        ooms = f"no simulated OOM at {cap}"
        if rec.baseline_ooms:
            ooms += f" (vs {rec.baseline_ooms} with {rec.baseline})"
    else:
        ooms = f"{rec.recommended_ooms} simulated OOM(s) at {cap} (vs {rec.baseline_ooms})"
    label = (rec.alloc_conf or "defaults") if rec.family == "torch" else rec.policy
    return (
        f"{label}: peak reserved"
        f" {pair(rec.baseline_peak_reserved_bytes, rec.recommended_peak_reserved_bytes)}"
        f" ({signed_percent(rec.change)}), {ooms}; set {conf_text(rec.alloc_conf)}"
    )


def reference_text(rec: Recommendation) -> str | None:
    """A line about the reference models, for scale."""
    s = rec.scale
    if s is None:
        return None
    return (
        f"For scale: the {s.policy} reference model peaks at"
        f" {format_bytes(s.peak_reserved_bytes)} reserved for"
        f" {format_bytes(s.peak_requested_bytes)} requested at most; {rec.baseline} peaks at"
        f" {format_bytes(rec.baseline_peak_reserved_bytes)}."
    )


def ratio(x: float) -> str:
    return f"{x:.2f}×"


def change(o: PolicyOutcome, base: PolicyOutcome | None) -> str:
    if base is None or o is base or base.peak_reserved_bytes == 0:
        return "baseline" if o.baseline else ""
    d = (o.peak_reserved_bytes - base.peak_reserved_bytes) / base.peak_reserved_bytes
    return ("−" if d < 0 else "+") + f"{abs(d) * 100:.1f} %"


def when(ns: int | None, s: SpaceComparison) -> str:
    """A time relative to the stream's start, or a trace entry number without timestamps."""
    if ns is None:
        return ""
    return f"{(ns - s.first_time_ns) / 1e9:.3f} s" if s.timestamps else f"entry {ns}"


def oom_list(sizes: list[int], shown: int = 8) -> str:
    text = ", ".join(format_bytes(x) for x in sizes[:shown])
    return text + (" …" if len(sizes) > shown else "")


def space_title(s: SpaceComparison) -> str:
    return f"{s.label} · capacity {format_bytes(s.capacity_bytes)}"


def space_meta(s: SpaceComparison) -> list[tuple[str, str]]:
    peak_requested = max((o.peak_requested_bytes for o in s.outcomes), default=0)
    meta = [
        ("capacity", f"{format_bytes(s.capacity_bytes)} ({s.capacity_source})"),
        (
            "requests",
            (
                f"{s.requests:,} allocations, {s.frees:,} frees, {s.streams} stream(s);"
                f" at most {format_bytes(peak_requested)} requested at once"
            ),
        ),
    ]
    if s.recorded_peak_reserved_bytes is not None:
        meta.append(("recorded peak reserved", format_bytes(s.recorded_peak_reserved_bytes)))
    return meta


def match(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def error(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2%}"

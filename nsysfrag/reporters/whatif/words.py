"""The what-if report's words and numbers as text, shared by the terminal and HTML renderers:
the recommendation in a sentence, the reference models for scale, and the small formatters."""

from __future__ import annotations

from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.reporters.whatif.driver_words import driver_baseline_text, driver_recommendation_text
from nsysfrag.whatif import PolicyOutcome, Recommendation, SpaceComparison
from nsysfrag.whatif.validate import DeviceValidation
from nsysfrag.whatif.recommend import (
    FEWER_OOMS,
    MIN_SAVING,
    SEGMENTS,
    STATE,
    SWITCH,
    VALIDATED_FAMILY,
    Candidate,
)

VALIDATION_COLUMNS = (
    "device", "compared", "recorded", "simulated", "matched\nin order", "match",
    "peak reserved\nrecorded", "peak reserved\nsimulated", "error", "OOM paths\nrec. → sim.",
    "empty\ncache",
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
    collector = (
        " and a memory fraction (torch.cuda.set_per_process_memory_fraction: PyTorch runs the"
        " collector only under one; the model lets it allow the whole device)"
        if conf is not None and "garbage_collection_threshold" in conf
        else ""
    )
    return f"PYTORCH_CUDA_ALLOC_CONF={conf}{collector}"


def percent(x: float) -> str:
    return f"{x * 100:.1f} %"


def _label(c: Candidate) -> str:
    """A torch setting by its PYTORCH_CUDA_ALLOC_CONF, anything else by its name."""
    return (c.alloc_conf or "defaults") if c.family == "torch" else c.policy


def _ooms(rec: Recommendation, c: Candidate) -> str:
    cap = capacity_text(rec.capacity_bytes)
    if c.simulated_ooms == 0:
        extra = f" (vs {rec.baseline_ooms} with {rec.baseline})" if rec.baseline_ooms else ""
        return f"no simulated OOM at {cap}{extra}"
    return f"{c.simulated_ooms} simulated OOM(s) at {cap} (vs {rec.baseline_ooms})"


def _checked(rec: Recommendation) -> str:
    """How the model's error on this input was measured, in words."""
    if rec.model_error is None or rec.recorded_peak_reserved_bytes is None:
        return "the input records no reserved memory to check the model against"
    if rec.error_basis == STATE:
        return (
            f"the snapshot records its final state only: {rec.baseline}, given its live blocks,"
            f" reserves {format_bytes(rec.baseline_peak_reserved_bytes)}, its segments hold"
            f" {format_bytes(rec.recorded_peak_reserved_bytes)}"
        )
    return (
        f"{rec.baseline} simulates {format_bytes(rec.baseline_peak_reserved_bytes)} of peak"
        f" reserved, the run recorded {format_bytes(rec.recorded_peak_reserved_bytes)}"
    )


def recommendation_text(rec: Recommendation) -> str:
    """Plain words that follow from the numbers."""
    if rec.driver is not None:  # an nsys trace: the recorded driver behaviour and its remedies
        return driver_recommendation_text(rec)
    if rec.verdict == SEGMENTS:
        return (
            "No recommendation: the requests look like caching-allocator segments (every size a"
            " multiple of 2 MiB), so the replay says nothing about the tensors inside them."
        )
    if rec.model_error is None:
        error = (
            f"No model can be checked against this input ({_checked(rec)}), so nothing is"
            " recommended"
        )
    else:
        error = (
            f"The {VALIDATED_FAMILY} model's error on this input is {percent(rec.model_error)}"
            f" ({_checked(rec)})"
        )
    c = rec.chosen
    if rec.verdict == SWITCH and c is not None and rec.reason == FEWER_OOMS:
        return (
            f"{_label(c)}, to avoid {_failures(rec)}: {_ooms(rec, c)},"
            f" {'at a cost in peak reserved of' if c.saving_bytes < 0 else 'peak reserved'}"
            f" {pair(rec.baseline_peak_reserved_bytes, c.peak_reserved_bytes)}"
            f" ({signed_percent(-c.saving_ratio)}); set {conf_text(c.alloc_conf)}. {error}."
            f"{_worth_trying(rec)}"
        )
    if rec.verdict == SWITCH and c is not None:
        return (
            f"{_label(c)}: peak reserved"
            f" {pair(rec.baseline_peak_reserved_bytes, c.peak_reserved_bytes)}"
            f" ({signed_percent(-c.saving_ratio)}), {_ooms(rec, c)};"
            f" set {conf_text(c.alloc_conf)}. {error}; the saving is larger.{_unreproduced(rec)}"
            f"{_worth_trying(rec)}"
        )
    cap = capacity_text(rec.capacity_bytes)
    ooms = (
        f"no simulated OOM at {cap}" if rec.baseline_ooms == 0
        else f"{rec.baseline_ooms} simulated OOM(s) at {cap}"
    )  # fmt: skip
    held = f"{format_bytes(rec.baseline_peak_reserved_bytes)} peak reserved, {ooms}"
    bar = "the model's error" if rec.threshold > MIN_SAVING else "1 %"
    if rec.recorded_failures or rec.baseline_ooms:
        # A run that died is not told to keep its settings: it is told that none tested helps.
        text = f"No validated policy avoids {_failures(rec)} ({rec.baseline}: {held})"
        if rec.model_error is not None:
            text += f", and none beats the baseline by more than {bar}"
    else:
        text = f"Keep {rec.baseline} ({held})"
        if rec.model_error is not None:
            text += f": no validated policy beats the baseline by more than {bar}"
    other = rec.best_other
    if other is not None and other.saving_bytes > 0:
        if other.simulated_ooms > rec.baseline_ooms:
            text += (
                f"; {_label(other)} would lower peak reserved by {percent(other.saving_ratio)}"
                f" but with {other.simulated_ooms} simulated OOM(s) against {rec.baseline_ooms}"
            )
        else:
            text += (
                f"; the best, {_label(other)}, lowers peak reserved by"
                f" {percent(other.saving_ratio)}"
            )
    fewer = rec.fewer_ooms
    if fewer is not None:
        conf = (
            f"; set {conf_text(fewer.alloc_conf)} if the run failed for memory"
            if fewer.alloc_conf
            else ""
        )
        text += (
            f". {_label(fewer)} has {fewer.simulated_ooms} simulated OOM(s) against"
            f" {rec.baseline_ooms} at peak reserved"
            f" {pair(rec.baseline_peak_reserved_bytes, fewer.peak_reserved_bytes)}"
            f" ({signed_percent(-fewer.saving_ratio)}){_unchecked(fewer)}{conf}"
        )
    return f"{text}. {error}.{_unreproduced(rec)}{_worth_trying(rec)}"


def _unreproduced(rec: Recommendation) -> str:
    """`` The run recorded …`` (with its leading space) when the baseline simulates fewer
    failures than the run recorded, or ''."""
    if rec.recorded_failures <= rec.baseline_ooms:
        return ""
    return (
        f" The run recorded {rec.recorded_failures} failed allocation(s) and {rec.baseline}"
        f" simulates {rec.baseline_ooms}: the replay does not reproduce them (it places the"
        " blocks live when the trace opens afresh, and the capacity is an estimate), so no"
        " policy is credited with avoiding them."
    )


def _failures(rec: Recommendation) -> str:
    """What the baseline's failures are, in words: the run's own, or the model's."""
    if rec.recorded_failures and rec.baseline_ooms:
        return (
            f"the run's failure for memory ({rec.recorded_failures} failed allocation(s)"
            f" recorded, {rec.baseline_ooms} simulated with {rec.baseline})"
        )
    if rec.recorded_failures:
        return f"the run's failure for memory ({rec.recorded_failures} failed allocation(s))"
    return f"the {rec.baseline_ooms} simulated OOM(s) of {rec.baseline}"


def _unchecked(c: Candidate) -> str:
    return "" if c.validated else f" in the {c.family} model, not validated on this input"


def _worth_trying(rec: Recommendation) -> str:
    """`` Worth trying, not validated: …`` (with its leading space), or ''."""
    c = rec.worth_trying
    if c is None:
        return ""
    return (
        f" Worth trying, not validated: {_label(c)} lowers peak reserved"
        f" {pair(rec.baseline_peak_reserved_bytes, c.peak_reserved_bytes)}"
        f" ({signed_percent(-c.saving_ratio)}) in the {c.family} model, {_ooms(rec, c)}; this"
        f" input cannot check that model, so the figure has no error bound"
        + (f" (set {conf_text(c.alloc_conf)} to try it)." if c.alloc_conf is not None else ".")
    )


def baseline_text(rec: Recommendation) -> str:
    """The baseline, simulated, with the recorded figure beside it."""
    if rec.driver is not None:
        return driver_baseline_text(rec)
    sim = format_bytes(rec.baseline_peak_reserved_bytes)
    if rec.recorded_peak_reserved_bytes is None:
        return f"{rec.baseline}: {sim} peak reserved simulated (nothing recorded to compare)"
    if rec.model_error is None:
        error = "model error n/a: nothing recorded to check the model against"
    elif rec.error_basis == STATE:
        error = f"model error {percent(rec.model_error)}, on the final state: no trace"
    else:
        error = f"model error {percent(rec.model_error)}"
    recorded = "in the snapshot's segments" if rec.error_basis == STATE else "recorded"
    return (
        f"{rec.baseline}: {sim} peak reserved simulated,"
        f" {format_bytes(rec.recorded_peak_reserved_bytes)} {recorded} ({error})"
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


def requests_text(s: SpaceComparison) -> str:
    """The run's allocations as analyze counts them, and how many requests the policies
    replay when that differs (the blocks live at the window's start, the failed requests)."""
    c = s.counts
    failed = f", {c.failed_allocations:,} failed" if c.failed_allocations else ""
    replayed = (
        f" ({s.requests:,} requests replayed)"
        if (s.requests, s.frees) != (c.allocations, c.frees)
        else ""
    )
    return (
        f"{c.allocations:,} allocations, {c.frees:,} frees{failed}{replayed}, {s.streams}"
        f" stream(s); at most {format_bytes(s.peak_requested_bytes)} requested at once"
    )


def space_meta(s: SpaceComparison) -> list[tuple[str, str]]:
    meta = [
        ("capacity", f"{format_bytes(s.capacity_bytes)} ({s.capacity_basis})"),
        ("requests", requests_text(s)),
    ]
    meta.append(("baseline", baseline_text(s.recommendation)))
    return meta


def match(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def error(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2%}"


def release_bursts_text(d: DeviceValidation) -> str | None:
    """Whose each recorded burst of segment releases was, in a sentence (None: no burst)."""
    total = sum(d.release_bursts)
    if not total:
        return None
    program, retry, collected, unknown = d.release_bursts
    return (
        f"Segment releases, device {d.device}: {total} burst(s) of segment frees / unmaps:"
        f" {program} the program's empty_cache(), {retry} the allocator's before a retry,"
        f" {collected} garbage collection, {unknown} unknown (a new segment the device had room"
        " for followed; replayed as the program's). Every policy gives memory back at the"
        " program's, by its own rules; the retries come from each policy's own capacity."
    )

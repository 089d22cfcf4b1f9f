"""The what-if report: JSON data first (:func:`document`), then the terminal table
(:func:`render_terminal`) and the self-contained HTML page (:func:`render_html`) drawn from the
same report. The page inlines its CSS and its SVG charts and escapes every string that comes
from the input, so it opens offline."""

from __future__ import annotations

import json
from html import escape
from pathlib import PurePath
from typing import Any

from rich import box
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from nsysfrag.analysis import State
from nsysfrag.analysis.metrics import (
    Health,
    format_bytes,
    free_blocks_health,
    global_frag_health,
    local_frag_health,
)
from nsysfrag.whatif import (
    VALIDATION_TARGET_MATCH,
    VALIDATION_TARGET_PEAK,
    PolicyOutcome,
    SpaceComparison,
    Validation,
    WhatifReport,
)

SCHEMA = "nsysfrag-whatif/1"
STYLE = {Health.OK: "green", Health.WARN: "yellow", Health.CRITICAL: "bold red"}


# ------------------------------------------------------------------------------------ data


def _state(s: State) -> dict[str, Any]:
    return {
        "time_ns": s.time_ns,
        "global_frag": s.global_frag,
        "local_frag": s.local_frag,
        "free_blocks": s.free_blocks,
        "largest_free_bytes": s.largest_free_bytes,
        "free_bytes": s.free_bytes,
        "live_bytes": s.live_bytes,
    }


def policy_document(o: PolicyOutcome, rank: int) -> dict[str, Any]:
    return {
        "policy": o.name,
        "family": o.policy.family,
        "description": o.policy.description,
        "options": o.policy.options,
        "alloc_conf": o.policy.alloc_conf(),
        "rank": rank,
        "baseline": o.baseline,
        "model": o.name,
        "peak": _state(o.peak),
        "max": {
            "global_frag": o.max_global_frag,
            "local_frag": o.max_local_frag,
            "free_blocks": o.max_free_blocks,
            "live_bytes": o.max_live_bytes,
        },
        "final": _state(o.final),
        "health": o.health.label,
        "internal_frag": o.internal_frag,
        "growth_per_s": o.growth_per_s,
        "peak_reserved_bytes": o.peak_reserved_bytes,
        "final_reserved_bytes": o.final_reserved_bytes,
        "peak_requested_bytes": o.peak_requested_bytes,
        "reserved_over_requested_at_peak": o.reserved_over_requested_at_peak,
        "max_reserved_over_max_requested": o.max_reserved_over_max_requested,
        "simulated_ooms": o.simulated_ooms,
        "first_oom_time_ns": o.first_oom_time_ns,
        "largest_free_at_oom_bytes": o.largest_free_at_oom_bytes,
    }


def space_document(s: SpaceComparison) -> dict[str, Any]:
    rec = s.recommendation
    return {
        "label": s.label,
        "pid": s.pid,
        "device": s.device,
        "capacity_bytes": s.capacity_bytes,
        "capacity_source": s.capacity_source,
        "requests": s.requests,
        "frees": s.frees,
        "streams": s.streams,
        "timestamps": s.timestamps,
        "recorded_peak_reserved_bytes": s.recorded_peak_reserved_bytes,
        "warnings": s.warnings,
        "baseline": rec.baseline,
        "ranking": [o.name for o in s.outcomes],
        "recommendation": {
            "text": rec.text,
            "policy": rec.policy,
            "alloc_conf": rec.alloc_conf,
            "baseline": rec.baseline,
            "baseline_peak_reserved_bytes": rec.baseline_peak_reserved_bytes,
            "recommended_peak_reserved_bytes": rec.recommended_peak_reserved_bytes,
            "peak_reserved_change": rec.change,
            "reference": rec.reference,
        },
        "policies": [policy_document(o, i + 1) for i, o in enumerate(s.outcomes)],
    }


def validation_document(v: Validation) -> dict[str, Any]:
    return {
        "model": "torch",
        "settings": v.settings,
        "segment_alloc_match": v.segment_alloc_match,
        "peak_reserved_simulated_bytes": v.peak_reserved_simulated_bytes,
        "peak_reserved_recorded_bytes": v.peak_reserved_recorded_bytes,
        "peak_reserved_error": v.peak_error,
        "meets_target": v.meets_target,
        "target": {
            "segment_alloc_match": VALIDATION_TARGET_MATCH,
            "peak_reserved_error": VALIDATION_TARGET_PEAK,
        },
        "devices": [
            {
                "device": d.device,
                "compared_action": d.action,
                "recorded_segment_allocs": d.recorded_segment_allocs,
                "simulated_segment_allocs": d.simulated_segment_allocs,
                "matched_segment_allocs": d.matched_segment_allocs,
                "segment_alloc_match": d.segment_alloc_match,
                "peak_reserved_recorded_bytes": d.peak_reserved_recorded_bytes,
                "peak_reserved_simulated_bytes": d.peak_reserved_simulated_bytes,
                "peak_reserved_error": d.peak_error,
                "initial_reserved_bytes": d.initial_reserved_bytes,
                "requests": d.requests,
                "recorded_oom_paths": d.forced_failures,
                "empty_cache_calls": d.empty_cache_calls,
                "note": d.note,
            }
            for d in v.devices
        ],
    }


def document(report: WhatifReport) -> dict[str, Any]:
    """The whole report as JSON-ready data (deterministic for a given input)."""
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "input": {
            "path": report.input_path,
            "kind": report.input_kind,
            "request_level": report.request_level,
            "notes": report.notes,
        },
        "spaces": [space_document(s) for s in report.spaces],
    }
    if report.validation is not None:
        doc["validation"] = validation_document(report.validation)
    return doc


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------- formatting


def _ratio(x: float) -> str:
    return f"{x:.2f}×"


def _change(o: PolicyOutcome, base: PolicyOutcome | None) -> str:
    if base is None or o is base or base.peak_reserved_bytes == 0:
        return "baseline" if o.baseline else ""
    d = (o.peak_reserved_bytes - base.peak_reserved_bytes) / base.peak_reserved_bytes
    return ("−" if d < 0 else "+") + f"{abs(d) * 100:.1f} %"


def _when(ns: int | None, s: SpaceComparison) -> str:
    """A time relative to the stream's start, or a trace entry number without timestamps."""
    if ns is None:
        return ""
    return f"{(ns - s.first_time_ns) / 1e9:.3f} s" if s.timestamps else f"entry {ns}"


def _oom_text(o: PolicyOutcome) -> str:
    return str(o.simulated_ooms)


def _baseline(s: SpaceComparison) -> PolicyOutcome | None:
    return next((o for o in s.outcomes if o.baseline), None)


def _space_title(s: SpaceComparison) -> str:
    return f"{s.label} · capacity {format_bytes(s.capacity_bytes)}"


def _space_meta(s: SpaceComparison) -> list[tuple[str, str]]:
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


COLUMNS = (
    "#", "policy", "peak reserved", "vs baseline", "peak requested", "R/U at peak R",
    "max R / max U", "simulated OOMs", "first OOM", "max global frag", "max local frag",
    "max free blocks", "health",
)  # fmt: skip

TERMINAL_COLUMNS = (
    "#", "policy", "peak\nreserved", "vs\nbaseline", "sim.\nOOMs", "1st OOM",
    "R/U at\npeak", "max\nglobal", "max\nlocal", "max free\nblocks", "health",
)  # fmt: skip
VALIDATION_COLUMNS = (
    "device", "compared", "recorded", "simulated", "matched\nin order", "match",
    "peak reserved\nrecorded", "peak reserved\nsimulated", "error", "OOM\npaths", "empty\ncache",
)  # fmt: skip
_VALIDATION_DROP = ("empty\ncache", "OOM\npaths", "simulated", "matched\nin order", "device")


# ------------------------------------------------------------------------------ terminal


def render_terminal(report: WhatifReport, console: Console) -> None:
    head = Text()
    head.append("What if: ", style="bold")
    head.append(f"{report.input_path}\n")
    head.append(f"{report.input_kind} · {report.request_level}", style="dim")
    console.print(head)
    for note in report.notes:
        console.print(Text(f"note: {note}", style="dim"))
    for s in report.spaces:
        console.print()
        _terminal_space(s, console)
    if report.validation is not None:
        console.print()
        _terminal_validation(report.validation, console)


def _fitted_table(
    console: Console,
    title: str,
    columns: tuple[str, ...],
    rows: list[list[RenderableType]],
    drop_order: tuple[str, ...],
) -> Table:
    """The table with as many columns as the console's width allows: the columns in
    ``drop_order`` go first, in that order, so the key figures always show whole."""
    shown = list(columns)
    while True:
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                      collapse_padding=True)  # fmt: skip
        for c in shown:
            left = c in ("policy", "compared")
            table.add_column(c, justify="left" if left else "right", no_wrap=True)
        for row in rows:
            table.add_row(*(cell for c, cell in zip(columns, row, strict=True) if c in shown))
        width = Measurement.get(console, console.options.update(max_width=100_000), table).maximum
        droppable = [c for c in drop_order if c in shown]
        if width <= console.width or not droppable:
            return table
        shown.remove(droppable[0])


_TERMINAL_DROP = ("1st OOM", "R/U at\npeak", "max free\nblocks", "health", "max\nlocal", "#",
                  "max\nglobal")  # fmt: skip


def _terminal_space(s: SpaceComparison, console: Console) -> None:
    console.print(Text(_space_title(s), style="bold"))
    for k, v in _space_meta(s):
        console.print(Text(f"  {k}: {v}"))
    for w in s.warnings:
        console.print(Text(f"warning: {w}", style="yellow"))
    base = _baseline(s)
    rows: list[list[RenderableType]] = []
    for i, o in enumerate(s.outcomes, 1):
        style = "bold" if o.baseline else ""
        rows.append([
            str(i),
            Text(o.name, style=style),
            Text(format_bytes(o.peak_reserved_bytes), style=style),
            _change(o, base),
            Text(_oom_text(o), style="bold red" if o.simulated_ooms else "green"),
            _when(o.first_oom_time_ns, s),
            _ratio(o.reserved_over_requested_at_peak),
            Text(f"{o.max_global_frag:.1%}", style=STYLE[global_frag_health(o.max_global_frag)]),
            Text(f"{o.max_local_frag:.1%}", style=STYLE[local_frag_health(o.max_local_frag)]),
            Text(str(o.max_free_blocks), style=STYLE[free_blocks_health(o.max_free_blocks)]),
            Text(o.health.label, style=STYLE[o.health]),
        ])  # fmt: skip
    title = "Policies, ranked (fewest simulated OOMs, then least peak reserved)"
    console.print(_fitted_table(console, title, TERMINAL_COLUMNS, rows, _TERMINAL_DROP))
    console.print(
        Text(
            "R/U at peak: reserved over requested bytes when reserved peaks (Johnstone &"
            " Wilson); sim. OOMs: requests the policy could not place on this capacity; global,"
            " local frag and free blocks: maxima over the run (SPEC §3, each policy's own free"
            " memory).",
            style="dim",
        )
    )
    for o in s.outcomes:
        if o.simulated_ooms:
            console.print(
                Text(
                    f"{o.name}: {o.simulated_ooms} simulated OOM(s), the first at"
                    f" {_when(o.first_oom_time_ns, s)}; largest free block at each:"
                    f" {_oom_list(o.largest_free_at_oom_bytes, 4)}",
                    style="dim",
                )
            )
    rec = s.recommendation
    console.print(Text.assemble(("Recommendation: ", "bold"), rec.text))
    if rec.reference:
        console.print(Text(rec.reference, style="dim"))


def _match(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _error(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2%}"


def _terminal_validation(v: Validation, console: Console) -> None:
    rows: list[list[RenderableType]] = [
        [
            str(d.device), d.action.replace("segment_", ""), str(d.recorded_segment_allocs),
            str(d.simulated_segment_allocs), str(d.matched_segment_allocs),
            _match(d.segment_alloc_match), format_bytes(d.peak_reserved_recorded_bytes),
            format_bytes(d.peak_reserved_simulated_bytes), _error(d.peak_error),
            str(d.forced_failures), str(d.empty_cache_calls),
        ]
        for d in v.devices
    ]
    title = f"Validation of the torch model against the recorded segments ({v.settings})"
    table = _fitted_table(console, title, VALIDATION_COLUMNS, rows, _VALIDATION_DROP)
    console.print(table)
    verdict = {True: ("meets the target", "green"), False: ("misses the target", "bold red"),
               None: ("no segment events to compare", "yellow")}[v.meets_target]  # fmt: skip
    console.print(
        Text.assemble(
            ("Validation: ", "bold"),
            f"segment allocations reproduced {_match(v.segment_alloc_match)}, peak reserved"
            f" {format_bytes(v.peak_reserved_simulated_bytes)} simulated vs"
            f" {format_bytes(v.peak_reserved_recorded_bytes)} recorded ({_error(v.peak_error)}): ",
            verdict,
            f" (≥ {VALIDATION_TARGET_MATCH:.0%} reproduced, peak within {VALIDATION_TARGET_PEAK:.0%})",
        )
    )


# ---------------------------------------------------------------------------------- HTML

_CSS = """
:root { --ok: #2e7d32; --ok-bg: #e8f5e9; --warn: #7a5d00; --warn-bg: #fff3b0;
  --critical: #b71c1c; --critical-bg: #ffd6d6; --muted: #5f6b7a; --rule: #d8dde3; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1200px; padding: 1.5rem 1.25rem 3rem;
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
  color: #1d232a; background: #fff; }
h1 { font-size: 1.6rem; margin: 0 0 .25rem; }
h2 { font-size: 1.3rem; margin: 2.2rem 0 .4rem; padding-top: .75rem; border-top: 3px solid #1d232a; }
h3 { font-size: 1.05rem; margin: 1.4rem 0 .4rem; }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .92em; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: .1rem 1rem; margin: .5rem 0; }
dl.meta dt { color: var(--muted); }
dl.meta dd { margin: 0; overflow-wrap: anywhere; }
.warnings { border-left: 4px solid var(--warn); background: #fffbe6; padding: .4rem .8rem; margin: .8rem 0; }
.rec { border-left: 4px solid #1f77b4; background: #eef5fb; padding: .5rem .9rem; margin: .8rem 0; }
.muted { color: var(--muted); }
table { border-collapse: collapse; margin: .4rem 0 .8rem; font-variant-numeric: tabular-nums; }
th, td { padding: .25rem .55rem; border-bottom: 1px solid var(--rule); text-align: left; vertical-align: top; }
th { font-weight: 600; color: #39424c; }
thead th { border-bottom: 2px solid #9aa5b1; }
td.n, th.n { text-align: right; white-space: nowrap; }
tr.baseline td { font-weight: 600; }
.ok { color: var(--ok); background: var(--ok-bg); }
.warn { color: var(--warn); background: var(--warn-bg); }
.critical { color: var(--critical); background: var(--critical-bg); font-weight: 600; }
figure { margin: 1rem 0; }
figure svg { display: block; max-width: 100%; height: auto; }
figcaption { color: var(--muted); font-size: .9rem; }
footer { margin-top: 3rem; color: var(--muted); font-size: .85rem; }
"""
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
            "#17becf", "#7f7f7f", "#bcbd22")  # fmt: skip


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _cell(text: str, cls: str = "n") -> str:
    return f'<td class="{cls}">{_e(text)}</td>'


def _rated(text: str, level: Health) -> str:
    return f'<td class="n {level.label}">{_e(text)}</td>'


def _table(head: list[str], rows: list[str]) -> str:
    cells = "".join(f"<th>{_e(h)}</th>" for h in head)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _bars(s: SpaceComparison) -> str:
    """Peak reserved per policy, and peak requested as a reference line."""
    width, row, left = 760, 24, 300
    height = row * len(s.outcomes) + 30
    top = max([o.peak_reserved_bytes for o in s.outcomes] + [1])
    scale = (width - left - 90) / top
    out = [f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="peak reserved per policy">']
    for i, o in enumerate(s.outcomes):
        y = 10 + i * row
        w = max(o.peak_reserved_bytes * scale, 1)
        color = "#d62728" if o.simulated_ooms else ("#1d232a" if o.baseline else "#1f77b4")
        out.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end" font-size="12">{_e(o.name)}</text>')
        out.append(f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 8}" fill="{color}"/>')
        out.append(f'<text x="{left + w + 6:.1f}" y="{y + 15}" font-size="12">'
                   f"{_e(format_bytes(o.peak_reserved_bytes))}</text>")  # fmt: skip
    req = max(o.peak_requested_bytes for o in s.outcomes)
    x = left + req * scale
    out.append(f'<line x1="{x:.1f}" y1="4" x2="{x:.1f}" y2="{height - 18}" stroke="#2ca02c"'
               ' stroke-dasharray="4 3"/>')  # fmt: skip
    out.append(f'<text x="{x:.1f}" y="{height - 4}" font-size="11" fill="#2ca02c"'
               f' text-anchor="middle">peak requested {_e(format_bytes(req))}</text>')  # fmt: skip
    out.append("</svg>")
    return ("<figure>" + "".join(out) + "<figcaption>Peak reserved per policy (red: simulated"
            " OOMs; dark: the baseline). The dashed line is the most the program ever had"
            " live.</figcaption></figure>")  # fmt: skip


def _lines(s: SpaceComparison) -> str:
    """Reserved bytes over time, one line per policy."""
    width, height, left, bottom = 760, 260, 70, 30
    t0 = s.first_time_ns
    t_end = max((o.timeline_time_ns[-1] for o in s.outcomes if o.timeline_time_ns), default=t0)
    span = max(t_end - t0, 1)
    top = max([max(o.timeline_reserved_bytes, default=0) for o in s.outcomes] + [1])
    plot_w, plot_h = width - left - 10, height - bottom - 10
    view = f"0 0 {width} {height + 18 * len(s.outcomes)}"
    out = [f'<svg viewBox="{view}" role="img" aria-label="reserved bytes over time">']
    out.append(f'<rect x="{left}" y="10" width="{plot_w}" height="{plot_h}" fill="none" stroke="#d8dde3"/>')
    out.append(f'<text x="{left - 6}" y="18" font-size="11" text-anchor="end">{_e(format_bytes(top))}</text>')
    out.append(f'<text x="{left - 6}" y="{10 + plot_h}" font-size="11" text-anchor="end">0</text>')
    end_label = f"{span / 1e9:.3f} s" if s.timestamps else f"{span} trace entries"
    out.append(f'<text x="{left + plot_w}" y="{height - 8}" font-size="11" text-anchor="end">'
               f"{_e(end_label)}</text>")  # fmt: skip
    for i, o in enumerate(s.outcomes):
        color = _PALETTE[i % len(_PALETTE)]
        pts = []
        prev_y = None
        for t, r in zip(o.timeline_time_ns, o.timeline_reserved_bytes, strict=True):
            x = left + (t - t0) / span * plot_w
            y = 10 + plot_h - r / top * plot_h
            if prev_y is not None:
                pts.append(f"{x:.1f},{prev_y:.1f}")  # a step: the value holds until the next event
            pts.append(f"{x:.1f},{y:.1f}")
            prev_y = y
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{" ".join(pts)}"/>')
        ly = height + 18 * i + 4
        out.append(f'<rect x="{left}" y="{ly}" width="14" height="4" fill="{color}"/>')
        out.append(f'<text x="{left + 20}" y="{ly + 6}" font-size="12">{_e(o.name)}</text>')
    out.append("</svg>")
    return "<figure>" + "".join(out) + "<figcaption>Reserved bytes over time.</figcaption></figure>"


def _oom_list(sizes: list[int], shown: int = 8) -> str:
    text = ", ".join(format_bytes(x) for x in sizes[:shown])
    return text + (" …" if len(sizes) > shown else "")


def _html_space(s: SpaceComparison) -> str:
    out = [f"<h2>{_e(_space_title(s))}</h2>", '<dl class="meta">']
    out += [f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in _space_meta(s)]
    out.append("</dl>")
    if s.warnings:
        items = "".join(f"<li>{_e(w)}</li>" for w in s.warnings)
        out.append(f'<div class="warnings"><strong>Warnings</strong><ul>{items}</ul></div>')
    rec = s.recommendation
    out.append(f'<div class="rec"><strong>Recommendation.</strong> {_e(rec.text)}')
    if rec.reference:
        out.append(f'<br><span class="muted">{_e(rec.reference)}</span>')
    out.append("</div>")
    base = _baseline(s)
    rows = []
    for i, o in enumerate(s.outcomes, 1):
        name = _e(o.name) + (' <span class="muted">(baseline)</span>' if o.baseline else "")
        rows.append(
            f'<tr class="{"baseline" if o.baseline else ""}">'
            + _cell(str(i))
            + f'<td>{name}<br><span class="muted">{_e(o.policy.description)}</span></td>'
            + _cell(format_bytes(o.peak_reserved_bytes))
            + _cell(_change(o, base))
            + _cell(format_bytes(o.peak_requested_bytes))
            + _cell(_ratio(o.reserved_over_requested_at_peak))
            + _cell(_ratio(o.max_reserved_over_max_requested))
            + (
                f'<td class="n critical">{o.simulated_ooms}</td>'
                if o.simulated_ooms
                else '<td class="n ok">0</td>'
            )
            + _cell(_when(o.first_oom_time_ns, s))
            + _rated(f"{o.max_global_frag:.1%}", global_frag_health(o.max_global_frag))
            + _rated(f"{o.max_local_frag:.1%}", local_frag_health(o.max_local_frag))
            + _rated(str(o.max_free_blocks), free_blocks_health(o.max_free_blocks))
            + f'<td class="{o.health.label}">{_e(o.health.label)}</td></tr>'
        )
    out.append("<h3>Policies, ranked</h3>")
    out.append('<p class="muted">Ranked by simulated OOMs, then peak reserved bytes. Every'
               " figure is the named policy's own model of free memory (SPEC §8).</p>")  # fmt: skip
    out.append(_table(list(COLUMNS), rows))
    out.append(_bars(s))
    out.append(_lines(s))
    oom_rows = [
        f"<tr><td>{_e(o.name)}</td>"
        + _cell(str(o.simulated_ooms))
        + _cell(_oom_list(o.largest_free_at_oom_bytes), "")
        + "</tr>"
        for o in s.outcomes
        if o.simulated_ooms
    ]
    if oom_rows:
        out.append("<h3>Largest free block at each simulated OOM</h3>")
        out.append(_table(["policy", "OOMs", "largest free block"], oom_rows))
    return "".join(out)


def _html_validation(v: Validation) -> str:
    rows = [
        "<tr>"
        + _cell(str(d.device))
        + _cell(d.action, "")
        + _cell(str(d.recorded_segment_allocs))
        + _cell(str(d.simulated_segment_allocs))
        + _cell(str(d.matched_segment_allocs))
        + _cell(_match(d.segment_alloc_match))
        + _cell(format_bytes(d.peak_reserved_recorded_bytes))
        + _cell(format_bytes(d.peak_reserved_simulated_bytes))
        + _cell(_error(d.peak_error))
        + _cell(str(d.forced_failures))
        + _cell(str(d.empty_cache_calls))
        + "</tr>"
        for d in v.devices
    ]
    verdict = {True: "meets", False: "misses", None: "has nothing to compare for"}[v.meets_target]
    return (
        f"<h2>Validation: the torch model against the recorded segments</h2>"
        f'<p>Settings: <span class="mono">{_e(v.settings)}</span>. Segment allocations reproduced'
        f" in order: {_e(_match(v.segment_alloc_match))}; peak reserved"
        f" {_e(format_bytes(v.peak_reserved_simulated_bytes))} simulated vs"
        f" {_e(format_bytes(v.peak_reserved_recorded_bytes))} recorded ({_e(_error(v.peak_error))}),"
        f" which {verdict} the target (≥ {VALIDATION_TARGET_MATCH:.0%},"
        f" within {VALIDATION_TARGET_PEAK:.0%}).</p>"
        + _table([c.replace("\n", " ") for c in VALIDATION_COLUMNS], rows)
    )


def render_html(report: WhatifReport) -> str:
    """One self-contained HTML5 page (deterministic for a given report)."""
    name = PurePath(report.input_path).name or report.input_path
    body = [
        "<header><h1>nsysfrag: what if another allocator?</h1>",
        '<dl class="meta">',
        f'<dt>input</dt><dd class="mono">{_e(report.input_path)}</dd>',
        f"<dt>kind</dt><dd>{_e(report.input_kind)}</dd>",
        f"<dt>requests</dt><dd>{_e(report.request_level)}</dd>",
        "</dl>",
    ]
    if report.notes:
        items = "".join(f"<li>{_e(n)}</li>" for n in report.notes)
        body.append(f'<ul class="muted">{items}</ul>')
    body.append("</header>")
    body += [_html_space(s) for s in report.spaces]
    if report.validation is not None:
        body.append(_html_validation(report.validation))
    body.append("<footer>Generated by nsysfrag. This page is self-contained and works offline."
                "</footer>")  # fmt: skip
    return (
        "<!doctype html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>nsysfrag what-if — {_e(name)}</title>\n"
        f"<style>{_CSS}</style>\n</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n"
    )

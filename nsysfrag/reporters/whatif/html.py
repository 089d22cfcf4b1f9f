"""The what-if report as one self-contained HTML page: inline CSS and SVG charts, every string
from the input escaped, so it opens offline."""

from __future__ import annotations

from pathlib import PurePath

from nsysfrag.analysis.metrics import (
    format_bytes,
    free_blocks_health,
    global_frag_health,
    local_frag_health,
)
from nsysfrag.reporters.html_page import BASE_CSS, esc, page, prose, rated_cell, table, warnings_box
import nsysfrag.reporters.whatif.words as words
from nsysfrag.whatif import (
    VALIDATION_TARGET_MATCH,
    VALIDATION_TARGET_PEAK,
    PolicyOutcome,
    SpaceComparison,
    Validation,
    WhatifReport,
)

COLUMNS = (
    "#", "policy", "peak reserved", "vs baseline", "R/U at peak R",
    "max R / max U", "simulated OOMs", "first OOM", "max global frag", "max local frag",
    "max free blocks", "health",
)  # fmt: skip

# The what-if page's own parts, after the page rules every nsysfrag page shares.
_CSS = BASE_CSS + """
.rec { border-left: 4px solid #1f77b4; background: #eef5fb; padding: .5rem .9rem; margin: .8rem 0; }
.muted { color: var(--muted); }
table { border-collapse: collapse; margin: .4rem 0 .8rem; font-variant-numeric: tabular-nums; }
th, td { padding: .25rem .45rem; border-bottom: 1px solid var(--rule); text-align: left; vertical-align: top; }
th { font-weight: 600; color: #39424c; }
thead th { border-bottom: 2px solid #9aa5b1; }
td.n, th.n { text-align: right; }
td.n { white-space: nowrap; }
td.policy { min-width: 12rem; }
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


def _breakable(name: str) -> str:
    """``name`` escaped, with a line break opportunity after each ',' and ':'."""
    return esc(name).replace(",", ",<wbr>").replace(":", ":<wbr>")


def _cell(text: str, cls: str = "n") -> str:
    return f'<td class="{cls}">{esc(text)}</td>'


# Bar labels: a policy name takes one line per option (after each ','); the label column is
# as wide as the longest line needs at 12 px (an upper bound of 7 px a character, so no label
# is clipped), within these bounds.
_CHAR_PX = 7.0
_LABEL_PX = (120, 420)


def _label_lines(name: str) -> list[str]:
    parts = name.split(",")
    return [p + "," for p in parts[:-1]] + parts[-1:]


def _bars(s: SpaceComparison) -> str:
    """Peak reserved per policy, and peak requested as a reference line."""
    labels = [_label_lines(o.name) for o in s.outcomes]
    longest = max((len(line) for lines in labels for line in lines), default=0)
    width, line_h = 760, 15
    left = int(min(max(longest * _CHAR_PX + 16, _LABEL_PX[0]), _LABEL_PX[1]))
    rows = [max(24, 9 + line_h * len(lines)) for lines in labels]
    height = sum(rows) + 30
    top = max([o.peak_reserved_bytes for o in s.outcomes] + [1])
    scale = (width - left - 90) / top
    out = [f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="peak reserved per policy">']
    y = 10
    for o, lines, row in zip(s.outcomes, labels, rows, strict=True):
        w = max(o.peak_reserved_bytes * scale, 1)
        color = "#d62728" if o.simulated_ooms else ("#1d232a" if o.baseline else "#1f77b4")
        spans = "".join(
            f'<tspan x="{left - 8}" dy="{0 if i == 0 else line_h}">{esc(line)}</tspan>'
            for i, line in enumerate(lines)
        )
        out.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end" font-size="12">{spans}</text>')
        out.append(f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="16" fill="{color}"/>')
        out.append(f'<text x="{left + w + 6:.1f}" y="{y + 15}" font-size="12">'
                   f"{esc(format_bytes(o.peak_reserved_bytes))}</text>")  # fmt: skip
        y += row
    req = s.peak_requested_bytes
    x = left + req * scale
    out.append(f'<line x1="{x:.1f}" y1="4" x2="{x:.1f}" y2="{height - 18}" stroke="#2ca02c"'
               ' stroke-dasharray="4 3"/>')  # fmt: skip
    out.append(f'<text x="{x:.1f}" y="{height - 4}" font-size="11" fill="#2ca02c"'
               f' text-anchor="middle">peak requested {esc(format_bytes(req))}</text>')  # fmt: skip
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
    out.append(f'<text x="{left - 6}" y="18" font-size="11" text-anchor="end">{esc(format_bytes(top))}</text>')
    out.append(f'<text x="{left - 6}" y="{10 + plot_h}" font-size="11" text-anchor="end">0</text>')
    end_label = f"{span / 1e9:.3f} s" if s.timestamps else f"{span} trace entries"
    out.append(f'<text x="{left + plot_w}" y="{height - 8}" font-size="11" text-anchor="end">'
               f"{esc(end_label)}</text>")  # fmt: skip
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
        out.append(f'<text x="{left + 20}" y="{ly + 6}" font-size="12">{esc(o.name)}</text>')
    out.append("</svg>")
    return "<figure>" + "".join(out) + "<figcaption>Reserved bytes over time.</figcaption></figure>"


def _peak_cell(o: PolicyOutcome, s: SpaceComparison) -> str:
    """Peak reserved; the baseline's with the recorded figure beside it."""
    text = esc(format_bytes(o.peak_reserved_bytes))
    recorded = s.recommendation.recorded_peak_reserved_bytes
    if o.baseline and recorded is not None:
        text += f'<br><span class="muted">recorded<br>{esc(format_bytes(recorded))}</span>'
    return f'<td class="n">{text}</td>'


def _html_space(s: SpaceComparison) -> str:
    out = [f"<h2>{esc(words.space_title(s))}</h2>", '<dl class="meta">']
    out += [f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in words.space_meta(s)]
    out.append("</dl>")
    if s.warnings:
        out.append(warnings_box(s.warnings))
    rec = s.recommendation
    out.append(f'<div class="rec"><strong>Recommendation.</strong> {prose(words.recommendation_text(rec))}')
    reference = words.reference_text(rec)
    if reference:
        out.append(f'<br><span class="muted">{prose(reference)}</span>')
    out.append("</div>")
    base = s.baseline
    rows = []
    for i, o in enumerate(s.outcomes, 1):
        # a long policy name may break after an option (',') or the family (':'), never inside
        name = _breakable(o.name) + (' <span class="muted">(baseline)</span>' if o.baseline else "")
        rows.append(
            f'<tr class="{"baseline" if o.baseline else ""}">'
            + _cell(str(i))
            + f'<td class="policy">{name}<br><span class="muted">{esc(o.policy.description)}</span></td>'
            + _peak_cell(o, s)
            + _cell(words.change(o, base))
            + _cell(words.ratio(o.reserved_over_requested_at_peak))
            + _cell(words.ratio(o.max_reserved_over_max_requested))
            + (
                f'<td class="n critical">{o.simulated_ooms}</td>'
                if o.simulated_ooms
                else '<td class="n ok">0</td>'
            )
            + _cell(words.when(o.first_oom_time_ns, s))
            + rated_cell(f"{o.max_global_frag:.1%}", global_frag_health(o.max_global_frag), titled=False)
            + rated_cell(f"{o.max_local_frag:.1%}", local_frag_health(o.max_local_frag), titled=False)
            + rated_cell(str(o.max_free_blocks), free_blocks_health(o.max_free_blocks), titled=False)
            + f'<td class="{o.health.label}">{esc(o.health.label)}</td></tr>'
        )
    out.append("<h3>Policies, ranked</h3>")
    out.append('<p class="muted">Ranked by simulated OOMs, then peak reserved bytes. Every'
               " figure is analyze's, over the device as the named policy holds it (free"
               " memory is the device's outside what the policy reserved plus the free bytes"
               " inside); R is reserved, U requested (at most"
               f" {esc(format_bytes(s.peak_requested_bytes))}, the program's own"
               " figure).</p>")  # fmt: skip
    out.append(table(list(COLUMNS), rows))
    out.append(_bars(s))
    out.append(_lines(s))
    oom_rows = [
        f"<tr><td>{esc(o.name)}</td>"
        + _cell(str(o.simulated_ooms))
        + _cell(words.oom_list(o.largest_free_at_oom_bytes), "")
        + "</tr>"
        for o in s.outcomes
        if o.simulated_ooms
    ]
    if oom_rows:
        out.append("<h3>Largest free block at each simulated OOM</h3>")
        out.append(table(["policy", "OOMs", "largest free block"], oom_rows))
    return "".join(out)


def _html_validation(v: Validation) -> str:
    rows = [
        "<tr>"
        + _cell(str(d.device))
        + _cell(d.action, "")
        + _cell(str(d.recorded_segment_allocs))
        + _cell(str(d.simulated_segment_allocs))
        + _cell(str(d.matched_segment_allocs))
        + _cell(words.match(d.segment_alloc_match))
        + _cell(format_bytes(d.peak_reserved_recorded_bytes))
        + _cell(format_bytes(d.peak_reserved_simulated_bytes))
        + _cell(words.error(d.peak_error))
        + _cell(f"{d.recorded_oom_paths} → {d.simulated_oom_paths}")
        + _cell(str(d.empty_cache_calls))
        + "</tr>"
        for d in v.devices
    ]
    verdict = {True: "meets", False: "misses", None: "has nothing to compare for"}[v.meets_target]
    return (
        f"<h2>Validation: the torch model against the recorded segments</h2>"
        f'<p>Settings: <span class="mono">{esc(v.settings)}</span>. Segment allocations reproduced'
        f" in order: {esc(words.match(v.segment_alloc_match))}; peak reserved"
        f" {esc(format_bytes(v.peak_reserved_simulated_bytes))} simulated vs"
        f" {esc(format_bytes(v.peak_reserved_recorded_bytes))} recorded ({esc(words.error(v.peak_error))}),"
        f" which {verdict} the target (≥ {VALIDATION_TARGET_MATCH:.0%},"
        f" within {VALIDATION_TARGET_PEAK:.0%}).</p>"
        + table([c.replace("\n", " ") for c in words.VALIDATION_COLUMNS], rows)
        + "".join(f"<p>{esc(t)}</p>" for d in v.devices if (t := words.release_bursts_text(d)))
    )


def render_html(report: WhatifReport) -> str:
    """One self-contained HTML5 page (deterministic for a given report)."""
    name = PurePath(report.input_path).name or report.input_path
    body = [
        "<header><h1>nsysfrag: what if another allocator?</h1>",
        '<dl class="meta">',
        f'<dt>input</dt><dd class="mono">{esc(report.input_path)}</dd>',
        f"<dt>kind</dt><dd>{esc(report.input_kind)}</dd>",
        f"<dt>requests</dt><dd>{esc(report.request_level)}</dd>",
        "</dl>",
    ]
    if report.notes:
        items = "".join(f"<li>{prose(n)}</li>" for n in report.notes)
        body.append(f'<ul class="muted">{items}</ul>')
    body.append("</header>")
    body += [_html_space(s) for s in report.spaces]
    if report.validation is not None:
        body.append(_html_validation(report.validation))
    return page(f"nsysfrag what-if — {name}", _CSS, body)

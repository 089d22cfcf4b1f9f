"""One self-contained HTML page: the whole analysis, its figures inlined as SVG, no network.

The page inlines its CSS and its figures (SVG, or a PNG data URI for a figure whose SVG would be
huge), so it opens offline and can be mailed or attached to a ticket as one file. Every string
that comes from the trace (paths, process, device and NVTX names, warnings) is escaped.
"""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path, PurePath

import matplotlib
from matplotlib.figure import Figure

from nsysfrag.analysis import Analysis, Bucket, SpaceAnalysis
from nsysfrag.analysis.advice import advise
from nsysfrag.analysis.metrics import Health, format_bytes, size_class_label, unrated_words
from nsysfrag.analysis.time_base import growth_words, moment
from nsysfrag.events import Words
from nsysfrag.reporters import shared_figures
from nsysfrag.reporters.failure_words import (
    failure_table,
    failure_text,
    failures_title,
    unknown_note,
)
from nsysfrag.reporters.figure_axes import save_figure
from nsysfrag.reporters.figures import figures_for, one_moment
from nsysfrag.reporters.html_page import (
    BASE_CSS,
    esc,
    page,
    prose,
    rated_cell,
    site_markup,
    table,
    warnings_box,
)
from nsysfrag.reporters.state_cells import Cell, health_reason, state_table

output_file_extension = "html"
TOP_HOTSPOTS = 20
PINNED_BY_SHOWN = 5
# A figure whose SVG is larger than this is embedded as a PNG instead (smaller, faster to draw).
# The figures are bounded whatever the input (reporters.timeline_points, reporters.address_map):
# at a million events the largest, the memory timeline, is about 0.65 MB, so in practice every
# figure stays SVG (the address map's blocks are an image inside it).
MAX_SVG_BYTES = 3_000_000
# Matplotlib writes a Dublin Core block with a date and its homepage; neither belongs in a
# deterministic offline page.
SVG_METADATA: dict[str, str | None] = {"Date": None, "Creator": None, "Format": None, "Type": None}

# The single-input report's page style; a job's page (reporters/job/html.py) adds its own rules.
CSS = BASE_CSS + """table { border-collapse: collapse; margin: .4rem 0 .8rem; font-variant-numeric: tabular-nums; }
th, td { padding: .25rem .6rem; border-bottom: 1px solid var(--rule); text-align: left; vertical-align: top; }
th { font-weight: 600; color: #39424c; }
thead th { border-bottom: 2px solid #9aa5b1; }
.pair { display: flex; flex-wrap: wrap; gap: 0 2.5rem; align-items: flex-start; }
td.n, th.n { text-align: right; white-space: nowrap; }
td.site { overflow-wrap: anywhere; max-width: 26rem; }
.ok { color: var(--ok); background: var(--ok-bg); }
.warn { color: var(--warn); background: var(--warn-bg); }
.critical { color: var(--critical); background: var(--critical-bg); font-weight: 600; }
.badge { display: inline-block; padding: .05rem .55rem; border-radius: .8rem; font-weight: 700;
  letter-spacing: .04em; font-size: .85rem; vertical-align: .1em; }
.sub { color: var(--muted); margin: .1rem 0 .6rem; }
ul.advice { list-style: none; padding: 0; }
.failures h3 { color: var(--critical); }
td.verdict { font-weight: 600; white-space: nowrap; }
.failures table { font-size: .88rem; }
.failures th.n { white-space: normal; }
.failures th, .failures td { padding: .25rem .45rem; }
ul.oom { padding-left: 1.2rem; }
ul.oom li { margin: .5rem 0; }
ul.oom p { margin: .2rem 0; }
ul.advice li { border-left: 4px solid #1f77b4; background: #eef5fb; padding: .4rem .8rem; margin: .35rem 0; }
.figures figure { margin: 1rem 0; border: 1px solid var(--rule); border-radius: 4px; padding: .25rem; }
.figures svg, .figures img { display: block; width: 100%; height: auto; }
.bar { display: inline-block; height: .8em; background: #5f6b7a; vertical-align: middle; }
.bar.bytes { background: #c9a227; }
td.bars { width: 12rem; }
nav ul { margin: .3rem 0; }
.definitions td:first-child, .definitions td.ok, .definitions td.warn,
.definitions td.critical { white-space: nowrap; }
.empty { color: var(--muted); font-style: italic; }
footer { margin-top: 3rem; color: var(--muted); font-size: .85rem; }
"""


# ---------------------------------------------------------------- formatting


def _badge(level: Health) -> str:
    return f'<span class="badge {level.label}">{level.label.upper()}</span>'


def _td(cell: Cell) -> str:
    if cell.level is not None:
        return rated_cell(cell.text, cell.level)
    return f'<td class="n">{esc(cell.text)}</td>'


def space_anchor(space: SpaceAnalysis) -> str:
    return f"pid{space.pid}-dev{space.device}"


def space_title(space: SpaceAnalysis) -> str:
    """``pid 3310 (python3) · device 0: NVIDIA H100 80GB HBM3, 79.65 GiB`` (not escaped)."""
    process = f" ({space.process_name})" if space.process_name else ""
    return (
        f"pid {space.pid}{process} · device {space.device}: {space.device_name},"
        f" {space.capacity.heading() if space.capacity else format_bytes(space.capacity_bytes)}"
    )


# ---------------------------------------------------------------- figures


_ID = re.compile(r'\bid="([^"]*)"')
_REF = re.compile(r'(xlink:href="#|url\(#)')
_PATH_DATA = re.compile(r' d="([^"]*)"')
_NUMBER = re.compile(r"-?\d+\.\d+")
_COMMENT = re.compile(r"<!--.*?-->\n?", re.DOTALL)
_NAMESPACES = re.compile(r' xmlns(?::xlink)?="[^"]*"')


def _round(m: re.Match[str]) -> str:
    text = f"{float(m.group()):.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _compact_path(m: re.Match[str]) -> str:
    # Coordinates are in points of a 720 pt wide figure: 0.01 pt is far below a screen pixel.
    d = _NUMBER.sub(_round, m.group(1))
    d = re.sub(r"\s+", " ", d).strip()
    d = re.sub(r" ?([A-Za-z]) ?", r"\1", d)
    return f' d="{d}"'


def svg_markup(fig: Figure, id_prefix: str) -> str:
    """``fig`` as an ``<svg>`` element to inline in HTML5.

    Drops the XML prolog, doctype, metadata, namespace declarations (the HTML parser supplies
    them) and comments (matplotlib repeats every text there); prefixes every id so several
    figures can share a page; rounds path coordinates to 0.01 pt.
    """
    buf = io.StringIO()
    # Glyphs as paths, so the SVG needs no fonts; a fixed salt, so its ids do not change from
    # run to run (matplotlib otherwise salts them with a random UUID).
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "nsysfrag"}):
        save_figure(fig, buf, format="svg", metadata=SVG_METADATA)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = _COMMENT.sub("", svg)
    svg = _NAMESPACES.sub("", svg, count=2)
    svg = _ID.sub(lambda m: f'id="{id_prefix}{m.group(1)}"', svg)
    svg = _REF.sub(lambda m: m.group(1) + id_prefix, svg)
    svg = _PATH_DATA.sub(_compact_path, svg)
    return svg.strip()


def png_data_uri(fig: Figure) -> str:
    buf = io.BytesIO()
    # dpi="figure" so a user's savefig.dpi cannot change the size; no Software key, so no URL.
    save_figure(fig, buf, format="png", dpi="figure", metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def figure_markup(fig: Figure, id_prefix: str, alt: str) -> str:
    """The figure inline as SVG, or as a PNG data URI when its SVG exceeds ``MAX_SVG_BYTES``."""
    svg = svg_markup(fig, id_prefix)
    if len(svg) <= MAX_SVG_BYTES:
        return svg
    return f'<img alt="{esc(alt)}" src="{png_data_uri(fig)}" width="1000" height="450">'


# ---------------------------------------------------------------- sections


def _header(analysis: Analysis) -> str:
    words = analysis.source.words
    version = analysis.source.version or words.no_version_short
    meta = [
        (esc(words.input_noun), f'<span class="mono">{esc(analysis.source.path)}</span>'),
        (esc(words.version_label), esc(version)),
        ("model", esc(words.space_title)),
        ("granularity", f"{analysis.granularity_bytes} B"),
        ("spaces", str(len(analysis.spaces))),
        ("times", "seconds since the input's first event"),
    ]
    out = ["<header><h1>nsysfrag: GPU memory fragmentation</h1>", '<dl class="meta">']
    out += [f"<dt>{k}</dt><dd>{v}</dd>" for k, v in meta]
    out.append("</dl>")
    if analysis.warnings:
        out.append(warnings_box(analysis.warnings))
    if len(analysis.spaces) > 1:
        links = "".join(
            f'<li><a href="#{space_anchor(s)}">{esc(space_title(s))}</a> {_badge(s.health)}</li>'
            for s in analysis.spaces
        )
        out.append(f"<nav><ul>{links}</ul></nav>")
    out.append("</header>")
    return "".join(out)


def _summary(s: SpaceAnalysis) -> str:
    c = s.counts
    counts = [
        ("allocations", str(c.allocations)),
        ("frees", str(c.frees)),
        ("unmatched frees", str(c.unmatched_frees)),
        ("overlaps", str(c.overlaps)),
        ("zero-size allocations", str(c.zero_size_allocs)),
        ("failed allocations", f"{c.failed_allocations} ({s.alloc_failure_rate:.2%})"),
        *([("other-kind events", str(c.other_kind_events))] if s.source.words.other_kinds else []),
        ("out-of-order frees", str(s.out_of_order_frees)),
        ("hole-creating frees", str(s.hole_creating_frees)),
    ]
    count_rows = "".join(f'<tr><th>{k}</th><td class="n">{v}</td></tr>' for k, v in counts)
    state = state_table(s)
    rows = [
        f"<tr><th>{esc(label)}</th>{''.join(_td(c) for c in cells)}</tr>"
        for label, cells in state.rows
    ]
    states = table(["", *state.headings], rows, numeric=range(1, len(state.headings) + 1))
    figures = [
        ("global frag growth", growth_words(s)),
        ("internal frag at peak footprint", f"{s.internal_frag:.2%}"),
        ("lowest block address", f"0x{s.base_address:x}"),
        ("highest block end", f"0x{s.arena_end:x}"),
        *([("page size", format_bytes(s.page_bytes))] if s.page_bytes else []),
    ]
    figure_rows = "".join(f'<tr><th>{k}</th><td class="n">{v}</td></tr>' for k, v in figures)
    unrated = "".join(
        f'<p class="sub">{esc(unrated_words(u, moment(s, u.time_ns)))}</p>' for u in s.unrated
    )
    return (
        f"<h3>State ({esc(s.source.words.space_title)})</h3>{states}{unrated}"
        '<div class="pair"><div><h3>Events</h3>'
        f'<table class="counts"><tbody>{count_rows}</tbody></table></div>'
        "<div><h3>Growth and layout</h3>"
        f'<table class="trends"><tbody>{figure_rows}</tbody></table></div></div>'
    )


def _moments_words(moments: list[str]) -> str:
    """``at 2.729 s``; of several failures told alike, ``22 failures, at 2.729 s to 4.852 s``."""
    if len(moments) == 1:
        return f"at {esc(moments[0])}"
    return f"{len(moments)} failures, at {esc(moments[0])} to {esc(moments[-1])}"


def _failures(s: SpaceAnalysis) -> str:
    """Every failed allocation, first thing in its space: its own moment, request and state in
    one table, then what each verdict means and whose blocks stranded memory."""
    if not s.ooms:
        return ""
    texts = [failure_text(s, f) for f in s.ooms]
    head, values = failure_table(texts)
    rows = [
        "<tr>" + "".join(
            f'<td class="verdict">{esc(v)}</td>' if label == "verdict" else f'<td class="n">{esc(v)}</td>'
            for label, v in zip(head, row, strict=True)
        ) + "</tr>"
        for row in values
    ]  # fmt: skip
    out = [
        f'<div class="failures"><h3>{esc(failures_title(s))}</h3>',
        table(head, rows, numeric=[i for i, label in enumerate(head) if label != "verdict"]),
    ]
    # Failures told alike apart from their moment are one item: the table has each moment
    # (main listed the serving sample's 22 failures twice, the table then 22 like bullets).
    groups: dict[str, list[str]] = {}
    told = 0
    for t in texts:
        if not (t.explanation or t.requested_at or t.stranded or t.callers):
            continue
        told += 1
        item = []
        if t.requested_at is not None:
            item.append(f' — requested at <span class="mono">{site_markup(t.requested_at)}</span>')
        if t.callers:
            frames = "".join(f"<li>{site_markup(c)}</li>" for c in t.callers)
            item.append(f'<details><summary>called from ({len(t.callers)} frames, innermost'
                        f' first)</summary><ol class="mono">{frames}</ol></details>')  # fmt: skip
        if t.explanation:
            item.append(f"<p>{prose(t.explanation)}</p>")
        if t.stranded:
            sites = "".join(
                f'<tr><td class="site mono">{site_markup(site)}</td><td class="n">{esc(held)}</td></tr>'
                for site, held in t.stranded
            )
            item.append(table(["stranded beside blocks from", "stranded"], [sites], numeric={1}))
        groups.setdefault("".join(item), []).append(t.cells[0][1])
    details = [
        f"<li><strong>{_moments_words(moments)}</strong>{body}</li>" for body, moments in groups.items()
    ]
    if details:
        out.append(f'<ul class="oom">{"".join(details)}</ul>')
    if told < len(texts):
        out.append(f'<p class="sub">{esc(unknown_note(s))}</p>')
    out.append("</div>")
    return "".join(out)


def _advice(s: SpaceAnalysis) -> str:
    lines = advise(s, failures=False)  # the failures have their own section
    if not lines:
        return ""
    items = "".join(f"<li>{prose(line)}</li>" for line in lines)
    return f'<h3>Advice</h3><ul class="advice">{items}</ul>'


def _figures(s: SpaceAnalysis, space_index: int) -> str:
    out = ["<h3>Figures</h3>"]
    if one_moment(s):
        out.append(
            '<p class="sub">No figures over time: the input records one moment of this space'
            " (a snapshot without a trace: its final state), so the figures below are of that"
            " moment.</p>"
        )
    out.append('<div class="figures">')
    for j, (name, build) in enumerate(figures_for(s).items()):
        # Short: a 20,000-block address map repeats its clip-path id 20,000 times.
        prefix = f"s{space_index}f{j}-"
        alt = f"{name} figure of {space_title(s)}"
        markup = figure_markup(shared_figures.figure(s, name, build), prefix, alt)
        out.append(
            f'<figure id="{space_anchor(s)}-fig-{name}" data-figure="{name}">{markup}</figure>'
        )
    out.append("</div>")
    return "".join(out)


def _hotspots(s: SpaceAnalysis) -> str:
    title = "<h3>Out-of-order free hotspots</h3>"
    if not s.hotspots:
        return title + '<p class="empty">No out-of-order frees.</p>'
    rows = []
    for h in s.hotspots[:TOP_HOTSPOTS]:
        pins = ", ".join(h.pinned_by[:PINNED_BY_SHOWN])
        if len(h.pinned_by) > PINNED_BY_SHOWN:
            pins += f", … {len(h.pinned_by) - PINNED_BY_SHOWN} more"
        rows.append(
            f'<tr><td class="site mono">{site_markup(h.site)}</td><td class="n">{esc(h.size_class)}</td>'
            f'<td class="n">{h.out_of_order_frees}</td><td class="n">{h.hole_creating_frees}</td>'
            f'<td class="n">{format_bytes(h.hole_bytes)}</td>'
            f'<td class="site mono">{site_markup(pins)}</td></tr>'
        )
    shown = f"top {TOP_HOTSPOTS} of {len(s.hotspots)}" if len(s.hotspots) > TOP_HOTSPOTS else ""
    note = f'<p class="sub">{shown}</p>' if shown else ""
    head = ["site", "size class", "out-of-order frees", "holes", "hole bytes", "pinned by"]
    return title + note + table(head, rows, numeric={1, 2, 3, 4})


def _histogram(title: str, buckets: list[Bucket], empty: str) -> str:
    out = f"<h3>{esc(title)}</h3>"
    if not buckets:
        return out + f'<p class="empty">{esc(empty)}</p>'
    most_count = max(b.count for b in buckets)
    most_bytes = max(b.bytes for b in buckets) or 1
    rows = []
    for b in buckets:
        wc = max(1, round(100 * b.count / most_count))
        wb = max(1, round(100 * b.bytes / most_bytes))
        rows.append(
            f'<tr><td class="n">{size_class_label(b.lo_bytes.bit_length() - 1)}</td>'
            f'<td class="n">{b.count}</td><td class="bars"><span class="bar" style="width:{wc}%">'
            f'</span></td><td class="n">{format_bytes(b.bytes)}</td><td class="bars">'
            f'<span class="bar bytes" style="width:{wb}%"></span></td></tr>'
        )
    return out + table(["size class", "count", "", "bytes", ""], rows, numeric={0, 1, 3})


def _space(s: SpaceAnalysis, index: int) -> str:
    return "".join(
        [
            f'<section class="space" id="{space_anchor(s)}">',
            f"<h2>{esc(space_title(s))} {_badge(s.health)}</h2>",
            (
                f'<p class="sub">health {s.health.label}: {esc(health_reason(s))}</p>'
            ),
            _failures(s),
            _summary(s),
            _advice(s),
            _figures(s, index),
            _hotspots(s),
            _histogram("Allocation sizes (whole trace)", s.size_histogram, "No allocations."),
            _histogram(
                f"Free blocks at peak fragmentation (at {moment(s, s.peak.time_ns)})",
                s.free_block_histogram,
                "No free memory at the peak.",
            ),
            "</section>",
        ]
    )


# (metric, formula / meaning, ok, warn, critical); text as in docs/metrics.md's table.
METRICS: tuple[tuple[str, str, str, str, str], ...] = (
    ("global_frag", "(F − L) / C — free memory outside the largest block, as a share of the device",
     "< 20 %", "20 – 40 %", "≥ 40 %"),
    ("local_frag", "1 − L / F (0 when F = 0) — share of free memory a maximal request cannot use",
     "< 30 %", "30 – 60 %", "> 60 %"),
    ("free_blocks", "N — the number of free blocks", "< 100", "100 – 500", "> 500"),
    ("largest_free_bytes", "L — the largest free block", "", "", ""),
    ("free_bytes, live_bytes", "F, U — free bytes and live (requested) bytes", "", "", ""),
)  # fmt: skip

# The terms every input shares; an input's own come first, from its words (SourceInfo).
TERMS: tuple[tuple[str, str], ...] = (
    (
        "Health",
        (
            "The worst level of the three rated metrics, each at its maximum over the moments it"
            " counts at: global frag always, local frag and free blocks only while at least 5 % of"
            " the device is free."
        ),
    ),
    ("Peak", "The state after the first event at which global_frag reaches its maximum."),
    (
        "Growth",
        (
            "The least-squares slope of global_frag per second, over 1,000 evenly spaced samples of "
            "the step function between the first and last event (shown in percentage points/s)."
        ),
    ),
    ("Times", "Seconds since the input's first event, in every table and figure of this page."),
    (
        "Out-of-order free",
        "A free of a block that is not the most recently allocated live block.",
    ),
    (
        "Hole-creating free",
        (
            "A free whose free block is bounded by live blocks on both sides. The space's count "
            "includes in-order frees; a hotspot's counts only its out-of-order frees."
        ),
    ),
    (
        "Hotspots",
        (
            "Out-of-order frees grouped by (site, size class [2^k, 2^(k+1))), ranked by the bytes of "
            "the holes they created; each lists the sites of the live blocks that pinned those holes."
        ),
    ),
    (
        "Histograms",
        "Allocation sizes (every allocation) and free blocks at the peak, by size class.",
    ),
    (
        "Anomalies",
        (
            "Counted, never fatal: a free of an address that starts no live block is an unmatched"
            " free; an allocation overlapping live blocks counts one overlap and evicts them;"
            " zero-byte allocations are counted and not placed."
        ),
    ),
)


def _definitions(words: Words) -> str:
    rows = [
        f'<tr><td><code>{esc(m)}</code></td><td>{esc(f)}</td><td class="ok">{esc(ok)}</td>'
        f'<td class="warn">{esc(w)}</td><td class="critical">{esc(c)}</td></tr>'
        if ok
        else f"<tr><td><code>{esc(m)}</code></td><td>{esc(f)}</td><td></td><td></td><td></td></tr>"
        for m, f, ok, w, c in METRICS
    ]
    terms = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in (*words.terms, *TERMS))
    return (
        '<section class="definitions" id="definitions"><h2>Metric definitions</h2>'
        + table(["metric", "formula", "ok", "warn", "critical"], rows)
        + f'<dl class="meta">{terms}</dl></section>'
    )


def render(analysis: Analysis) -> str:
    """The whole report as one HTML5 document (deterministic for a given analysis)."""
    name = PurePath(analysis.source.path).name or analysis.source.path
    body = [_header(analysis)]
    if not analysis.spaces:
        body.append('<p class="empty">No device-memory allocations in this trace.</p>')
    body += [_space(s, i) for i, s in enumerate(analysis.spaces)]
    body.append(_definitions(analysis.source.words))
    return page(f"nsysfrag — {name}", CSS, body)


def write(analysis: Analysis, path: Path) -> None:
    """Write :func:`render`'s page to ``path`` as UTF-8 (``nsysfrag.destinations``)."""
    from nsysfrag import destinations

    destinations.write_text(path, render(analysis), "html")

"""The job as one self-contained HTML page: the rank table, the worst rank, the skew, a
rank × time heatmap of global fragmentation, and a section per rank (a summary of its analysis,
read from its document; its full page is ``nsysfrag analyze PATH --html``).

Deterministic for a given job document; every string from an input is escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.checks.job_ranks import RankSummary
from nsysfrag.reporters.html import CSS
from nsysfrag.reporters.html_page import esc, page, site_markup, table
from nsysfrag.reporters.job import heatmap, terminal
from nsysfrag.reporters.job.terminal import at, basis_text, hotspot_text, memory_text, oom_text
from nsysfrag.reporters.state_cells import percent

TOP_HOTSPOTS = 5
_EXTRA_CSS = """
.heatmap svg { display: block; max-width: 100%; height: auto; }
.heatmap a:hover rect { opacity: .75; }
td.error { color: var(--critical); overflow-wrap: anywhere; }
section.rank h2 { font-size: 1.15rem; }
"""


def anchor(rank: int) -> str:
    return f"rank-{rank}"


def _health(health: str) -> str:
    return f'<span class="badge {esc(health)}">{esc(health.upper())}</span>'


def _rank_table(summaries: Sequence[RankSummary]) -> str:
    rows = []
    for s in summaries:
        link = f'<td class="n"><a href="#{anchor(s.rank)}">{s.rank}</a></td>'
        if not s.ok:
            rows.append(f'<tr>{link}<td>{_health("failed")}</td>'
                        f'<td class="error" colspan="5">{esc(s.error)}</td></tr>')
            continue
        rows.append(
            f"<tr>{link}<td>{_health(s.health)}</td><td>{esc(basis_text(s))}</td>"
            f'<td class="n">{percent(s.peak_global_frag)}</td>'
            f'<td class="n">{esc(memory_text(s))}</td><td>{esc(oom_text(s))}</td>'
            f'<td class="site">{site_markup(hotspot_text(s))}</td></tr>'
        )
    head = ["rank", "health", "basis", "peak global frag", "peak memory", "OOMs", "top hotspot"]
    return table(head, rows, numeric={0, 3, 4})


def _overview(summaries: Sequence[RankSummary], document: dict[str, Any]) -> str:
    out = []
    worst = document.get("worst")
    if worst is not None:
        s = next(s for s in summaries if s.rank == worst["rank"])
        out.append(
            f'<p><strong>Worst rank: <a href="#{anchor(s.rank)}">{s.rank}</a></strong> — peak'
            f" global fragmentation {percent(s.peak_global_frag)} (pid {s.peak_pid}, device"
            f" {s.peak_device}, at {at(s, s.peak_time_ns)}); health {_health(s.health)}"
            f" {esc(basis_text(s))}</p>"
        )
    skew = document["skew"]
    if skew["ranks"] >= 2:
        memory, frag = skew["peak_memory"], skew["peak_global_frag"]
        out.append(
            f"<p><strong>Skew across {skew['ranks']} ranks</strong> (max / median): peak memory"
            f" ({esc(memory['metric'])}) {_ratio(memory['max_over_median'])}, rank"
            f" {memory['max_rank']} {format_bytes(memory['max'])} against a median of"
            f" {format_bytes(memory['median'])}; peak global fragmentation"
            f" {_ratio(frag['max_over_median'])}, rank {frag['max_rank']} {percent(frag['max'])}"
            f" against {percent(frag['median'])}.</p>"
        )
    return "".join(out)


def _ratio(value: float | None) -> str:
    return "n/a (median 0)" if value is None else f"{value:.2f}×"


def _state_row(s: RankSummary, label: str, state: dict[str, Any]) -> str:
    cells = [
        at(s, int(state["time_ns"])) if "time_ns" in state else "",
        percent(state["global_frag"]),
        percent(state["local_frag"]),
        str(state["free_blocks"]),
        format_bytes(state["largest_free_bytes"]) if "largest_free_bytes" in state else "",
        format_bytes(state["live_bytes"]),
    ]
    return f"<tr><th>{label}</th>" + "".join(f'<td class="n">{c}</td>' for c in cells) + "</tr>"


def _space(s: RankSummary, space: dict[str, Any]) -> str:
    process = f" ({space['process_name']})" if space.get("process_name") else ""
    title = (
        f"pid {space['pid']}{process} · device {space['device']}"
        f"{': ' + str(space['device_name']) if space.get('device_name') else ''}"
        f", {format_bytes(space['capacity_bytes'])}"
    )
    states = table(
        ["", "at", "global frag", "local frag", "free blocks", "largest free", "live"],
        [_state_row(s, "peak", space["peak"]), _state_row(s, "final", space["final"]),
         _state_row(s, "max", space["max"])],
        numeric={1, 2, 3, 4, 5, 6},
    )  # fmt: skip
    out = [f"<h3>{esc(title)} {_health(space['health'])}</h3>", states]
    if space.get("ooms"):
        rows = [
            f'<tr><td class="n">{at(s, int(o["time_ns"]))}</td>'
            f'<td class="n">{"—" if o.get("requested_bytes") is None else format_bytes(o["requested_bytes"])}</td>'
            f'<td class="n">{format_bytes(o["largest_free_bytes"]) if "largest_free_bytes" in o else ""}</td>'
            f"<td>{esc(o.get('verdict', 'unknown'))}</td></tr>"
            for o in space["ooms"]
        ]
        out.append("<h4>Failed allocations</h4>" + table(
            ["at", "requested", "largest free", "verdict"], rows, numeric={0, 1, 2}
        ))
    if space["hotspots"]:
        rows = [
            f'<tr><td class="site">{site_markup(h["site"])}</td><td>{esc(h["size_class"])}</td>'
            f'<td class="n">{h["out_of_order_frees"]}</td>'
            f'<td class="n">{format_bytes(h["hole_bytes"])}</td>'
            f'<td class="site">{site_markup(", ".join(h["pinned_by"][:3]))}</td></tr>'
            for h in space["hotspots"][:TOP_HOTSPOTS]
        ]
        out.append("<h4>Out-of-order free hotspots</h4>" + table(
            ["site", "size", "out-of-order", "hole bytes", "pinned by"], rows, numeric={2, 3}
        ))
    return "".join(out)


def _rank_section(entry: dict[str, Any], s: RankSummary) -> str:
    out = [
        f'<section class="rank" id="{anchor(s.rank)}">',
        f'<h2>Rank {s.rank} · <span class="mono">{esc(s.path)}</span></h2>',
    ]
    if not s.ok:
        out.append(f'<p class="error">{_health("failed")} {esc(s.error)}</p></section>')
        return "".join(out)
    doc = entry["analysis"]
    out.append(f'<p class="sub">{esc(doc["model"].get("name", "observed"))} model ·'
               f' {_health(s.health)} {esc(basis_text(s))}</p>')
    warnings = doc["trace"].get("warnings", [])
    if warnings:
        items = "".join(f"<li>{esc(w)}</li>" for w in warnings)
        out.append(f'<div class="warnings"><strong>Warnings</strong><ul>{items}</ul></div>')
    if not doc["spaces"]:
        out.append('<p class="empty">No device-memory allocations in this input.</p>')
    out += [_space(s, space) for space in doc["spaces"]]
    out.append(f'<p class="sub">Its full report: <code>nsysfrag analyze {esc(s.path)}'
               " --html PAGE.html</code></p></section>")
    return "".join(out)


def render(summaries: Sequence[RankSummary], document: dict[str, Any]) -> str:
    """The job's page as one HTML5 document."""
    analyzed = sum(1 for s in summaries if s.ok)
    rows, span = heatmap.heat_rows(document["ranks"])
    body = [
        "<header><h1>nsysfrag: GPU memory fragmentation across a job</h1>",
        (
            f'<p class="sub">{len(summaries)} ranks: {analyzed} analyzed,'
            f" {len(summaries) - analyzed} failed</p></header>"
        ),
        _overview(summaries, document),
        "<h2>Ranks</h2>",
        _rank_table(summaries),
    ]
    if any(not s.basis_known or (s.ooms and not s.verdicts) for s in summaries if s.ok):
        body.append(f'<p class="sub">{esc(terminal.UNRECORDED)}</p>')
    if rows:
        body += [
            "<h2>Global fragmentation by rank over time</h2>",
            (
                '<p class="sub">Each row a rank (click to go to its section), each cell the'
                " highest global fragmentation in that slice of time since the rank's first"
                " event.</p>"
            ),
            f'<figure class="heatmap">{heatmap.svg(rows, span, anchor="rank-{rank}")}</figure>',
        ]
    body += [_rank_section(entry, s) for entry, s in zip(document["ranks"], summaries)]
    return page(f"nsysfrag — job of {len(summaries)} ranks", CSS + _EXTRA_CSS, body)

"""A run-to-run comparison as one self-contained HTML page: per space the verdict, the state
side by side moment by moment, and the sites whose figures changed most, each with a bar for
its change. Inline CSS, no script, every string from the inputs escaped."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nsysfrag.checks.comparison import Comparison, SpaceComparison
from nsysfrag.checks.verdict import Piece, signed_bytes
from nsysfrag.reporters.comparison_cells import (
    BETTER,
    WORSE,
    Change,
    Row,
    SiteRow,
    capacity_footnote,
    site_rows,
    state_sections,
    unchanged_words,
)
from nsysfrag.reporters.html_page import BASE_CSS, esc, page, table, warnings_box

if TYPE_CHECKING:
    from nsysfrag.checks.job_comparison import JobComparison

# The sites a table lists on the page (the largest changes; the JSON has every listed site).
SITES_SHOWN = 25

_CSS = (
    BASE_CSS
    + """
table { border-collapse: collapse; margin: .4rem 0 .8rem; font-variant-numeric: tabular-nums; }
th, td { padding: .22rem .6rem; border-bottom: 1px solid var(--rule); text-align: left; vertical-align: top; }
th { font-weight: 600; color: #39424c; }
thead th { border-bottom: 2px solid #9aa5b1; }
td.n, th.n { text-align: right; white-space: nowrap; }
tr.moment th { background: #f2f4f7; border-top: 2px solid #9aa5b1; }
td.label { padding-left: 1.4rem; }
table.moments { font-size: .88rem; }
table.moments td:first-child { white-space: nowrap; }
.share { font-size: .85em; }
table.moments th, table.moments td { padding: .2rem .45rem; }
th.group { text-align: center; border-left: 2px solid #9aa5b1; }
td.group { border-right: 2px solid #9aa5b1; }
td.site { overflow-wrap: anywhere; max-width: 30rem; }
td.worse { color: var(--critical); }
td.better { color: var(--ok); }
.verdict { border-left: 4px solid #1f77b4; background: #eef5fb; padding: .5rem .9rem; margin: .8rem 0; }
.status { color: var(--muted); font-size: .9em; }
.more, .empty { color: var(--muted); }
td.bars { width: 14rem; position: relative; }
.bar { display: inline-block; height: .8em; vertical-align: middle; }
.bar.worse { background: #d62728; }
.bar.better { background: #2ca02c; }
.bar.neither { background: #5f6b7a; }
footer { margin-top: 3rem; color: var(--muted); font-size: .85rem; }
"""
)


def render(comparison: Comparison, base_name: str, current_name: str) -> str:
    words = comparison.words
    body = [
        f"<h1>nsysfrag compare: {esc(base_name)} → {esc(current_name)}</h1>",
        '<dl class="meta">',
        f"<dt>base</dt><dd>{esc(base_name)}</dd>",
        f"<dt>current</dt><dd>{esc(current_name)}</dd>",
    ]
    if words is not None:
        body.append(f"<dt>input</dt><dd>{esc(words.description)}</dd>")
        body.append(f"<dt>model</dt><dd>{esc(words.space_title)}</dd>")
    body.append("</dl>")
    body += space_sections(comparison, base_name, current_name)
    return page(f"nsysfrag compare — {base_name} → {current_name}", _CSS, body)


def render_job(comparison: JobComparison, base_name: str, current_name: str) -> str:
    """Two jobs: the worst rank of each and what changed in the current one's, then rank by
    rank."""
    body = [f"<h1>nsysfrag compare: {esc(base_name)} → {esc(current_name)} (jobs)</h1>"]
    worst = comparison.worst_words(base_name, current_name)
    if worst is not None:
        body.append(f"<p><strong>{esc(worst)}</strong></p>")
    top = comparison.worst_rank()
    if top is not None and top.comparison is not None:
        for s in top.comparison.spaces:
            if s.verdict:
                body.append(
                    f'<p class="verdict">rank {top.rank}, {esc(s.current_space)}:'
                    f" {verdict_html(s.verdict)}</p>"
                )
    for r in comparison.ranks:
        body.append(f'<h2 class="rank">rank {r.rank}</h2>')
        if r.comparison is None:
            body.append(warnings_box([r.problem or "not compared"]))
            continue
        body += space_sections(
            r.comparison, f"{base_name}, rank {r.rank}", f"{current_name}, rank {r.rank}"
        )
    unpaired = [f"only in {base_name}: rank {n}" for n in comparison.only_in_base]
    unpaired += [f"only in {current_name}: rank {n}" for n in comparison.only_in_current]
    if unpaired:
        body.append(warnings_box(unpaired))
    return page(f"nsysfrag compare — {base_name} → {current_name}", _CSS, body)


def space_sections(comparison: Comparison, base_name: str, current_name: str) -> list[str]:
    """Each space's section, then what only one run has; a job's page adds its own heading."""
    out = []
    for s in comparison.spaces:
        out += _space(comparison, s, base_name, current_name)
    unpaired = [f"only in {base_name}: {n}" for n in comparison.only_in_base]
    unpaired += [f"only in {current_name}: {n}" for n in comparison.only_in_current]
    if unpaired:
        out.append(warnings_box(unpaired))
    if not comparison.spaces:
        out.append('<p class="empty">No matching spaces to compare.</p>')
    return out


def verdict_html(pieces: tuple[Piece, ...]) -> str:
    return "".join(f"<code>{esc(p.text)}</code>" if p.site else esc(p.text) for p in pieces)


def _space(c: Comparison, s: SpaceComparison, base_name: str, current_name: str) -> list[str]:
    title = f"{s.base_space} ({base_name}) → {s.current_space} ({current_name})"
    words = c.words
    out = [f"<h2>{esc(title)}</h2>"]
    if words is not None:
        out.append(f'<p class="status">{esc(words.space_title)}</p>')
    if s.verdict:
        out.append(f'<p class="verdict">{verdict_html(s.verdict)}</p>')
    if s.missing:
        out.append(warnings_box([f"not compared: {m}" for m in s.missing]))
    out.append("<h3>State, side by side</h3>")
    sections = state_sections(c, s)
    out.append(_moments_table(sections[:-1]))
    out.append(_over_the_run(sections[-1]))
    if footnote := capacity_footnote(s):
        out.append(f'<p class="note">{esc(footnote)}</p>')
    site_label = words.site_label if words is not None else "site"
    for figure in s.sites:
        out.append(f"<h3>{esc(figure.label[:1].upper() + figure.label[1:])}</h3>")
        shown, more, more_delta = site_rows(figure, SITES_SHOWN)
        if not shown:
            out.append(f'<p class="empty">{esc(unchanged_words(figure))}.</p>')
            continue
        widest = max(abs(r.delta_bytes) for r in shown) or 1
        body = [_site_row(r, widest) for r in shown]
        out.append(
            table([site_label, "base", "current", "change", "", "match"], body, numeric=(1, 2, 3))
        )
        if more:
            out.append(
                f'<p class="more">… and {more} more sites changed,'
                f" {esc(signed_bytes(more_delta))} in all.</p>"
            )
    return out


def _moments_table(sections: list[list[Row]]) -> str:
    """One row per figure, one group of columns (base, current, change) per moment."""
    if not sections:
        return '<p class="empty">Neither run has a moment in common.</p>'
    head = ['<tr><th rowspan="2"></th>']
    for rows in sections:
        h = rows[0]
        head.append(f'<th colspan="3" class="group">{esc(h.label)}<br><span class="status">'
                    f"{esc(h.base)} → {esc(h.current)}</span></th>")  # fmt: skip
    head.append("</tr><tr>")
    head += ['<th class="n">base</th><th class="n">current</th><th class="n">change</th>'] * len(
        sections
    )
    head.append("</tr>")
    labels: list[str] = []
    cells: dict[tuple[int, str], Row] = {}
    for i, rows in enumerate(sections):
        for r in rows[1:]:
            if r.label not in labels:
                labels.append(r.label)
            cells[i, r.label] = r
    body = []
    for label in labels:
        tds = [f"<td>{esc(label)}</td>"]
        for i in range(len(sections)):
            cell = cells.get((i, label))
            if cell is None:
                tds.append('<td></td><td></td><td class="group"></td>')
                continue
            tds.append(f'<td class="n">{esc(cell.base)}</td><td class="n">{esc(cell.current)}</td>')
            tds.append(_change(cell.change, "group"))
        body.append("<tr>" + "".join(tds) + "</tr>")
    return (f'<table class="moments"><thead>{"".join(head)}</thead>'
            f"<tbody>{''.join(body)}</tbody></table>")  # fmt: skip


def _over_the_run(rows: list[Row]) -> str:
    body = [
        f'<tr><td>{esc(r.label)}</td><td class="n">{esc(r.base)}</td>'
        f'<td class="n">{esc(r.current)}</td>{_change(r.change)}</tr>'
        for r in rows[1:]
    ]
    return table([rows[0].label, "base", "current", "change"], body, numeric=(1, 2, 3))


def _change(c: Change, extra: str = "") -> str:
    """A change's cell; in a moment's group its share of the base goes on a line of its own,
    so that three moments fit the page."""
    tone = f" {c.tone}" if c.tone in (WORSE, BETTER) else ""
    text = esc(c.text)
    if extra:
        text = text.replace(" (", '<br><span class="share">(', 1) + (
            "</span>" if " (" in c.text else ""
        )
    return f'<td class="n{tone} {extra}">{text}</td>'


def _site_row(r: SiteRow, widest: float) -> str:
    width = max(abs(r.delta_bytes) / widest * 12, 0.15)
    tone = r.change.tone if r.change.tone in (WORSE, BETTER) else "neither"
    bar = f'<span class="bar {tone}" style="width:{width:.2f}rem"></span>'
    was = f'<br><span class="status">was {esc(r.base_site)}</span>' if r.base_site else ""
    return (
        f'<tr><td class="site"><code>{esc(r.site)}</code>{was}</td><td class="n">{esc(r.base)}</td>'
        f'<td class="n">{esc(r.current)}</td>{_change(r.change)}<td class="bars">{bar}</td>'
        f'<td class="status">{esc(r.status)}</td></tr>'
    )

"""The round as one self-contained HTML page: the same table, setting lines and verdict as the
terminal, read from the ``nsysfrag-try/1`` document; every string from it escaped."""

from __future__ import annotations

from typing import Any

from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.reporters.html import CSS
from nsysfrag.reporters.html_page import esc, page, table
from nsysfrag.trial.terminal import setting_line

_HEAD = ["setting", "rank", "peak reserved", "peak allocated", "OOMs", "frag at peak", "retries",
         "wall", "per step", "what-if peak", "what-if error"]  # fmt: skip
_EXTRA_CSS = """
.verdict { font-size: 1.15em; font-weight: bold; margin: 1em 0; }
tr.job td { font-weight: bold; }
td.oom { color: #b00020; font-weight: bold; }
"""


def render(doc: dict[str, Any]) -> str:
    rows = []
    for run in doc["runs"]:
        label = run["setting"] + (f" #{run['round']}" if doc["repeat"] > 1 else "")
        if run["ended"] != "exit" or run["exit_code"]:
            label += f" ({run['ended']}, exit code {run['exit_code']})"
        if not run["ranks"]:
            rows.append(f"<tr><td>{esc(label)}</td><td colspan=\"10\">nothing recorded:"
                        f" {esc(run['unrecorded'] or '')}</td></tr>")  # fmt: skip
            continue
        for i, r in enumerate(run["ranks"]):
            rows.append(_row(label if i == 0 else "", str(r["rank"]), r, r["predicted"], ""))
        if len(run["ranks"]) > 1:
            job = run["job"]
            predicted = None
            if job["predicted_peak_reserved_bytes"] is not None:
                predicted = {"peak_reserved_bytes": job["predicted_peak_reserved_bytes"],
                             "error": job["whatif_error"]}  # fmt: skip
            rows.append(_row("", "job", job, predicted, ' class="job"'))
    body = [
        "<h1>nsysfrag record --try</h1>",
        f"<p>Command: <code>{esc(' '.join(doc['command']))}</code></p>",
        f'<p class="verdict">verdict: {esc(doc["verdict"]["line"])}</p>',
        table(_HEAD, rows, numeric=range(1, 11)),
        "<ul>" + "".join(f"<li>{esc(setting_line(s))}</li>" for s in doc["settings"]) + "</ul>",
    ]
    if doc["refused"]:
        body.append("<ul>" + "".join(f"<li>{esc(r['setting'])}: not run, {esc(r['reason'])}</li>"
                                     for r in doc["refused"]) + "</ul>")  # fmt: skip
    if doc["notes"]:
        body.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in doc["notes"]) + "</ul>")
    return page("nsysfrag — record --try", CSS + _EXTRA_CSS, body)


def _row(
    label: str, rank: str, f: dict[str, Any], predicted: dict[str, Any] | None, attrs: str
) -> str:
    cells = [
        f"<td>{esc(label)}</td>",
        f'<td class="n">{esc(rank)}</td>',
        _n(_bytes(f["peak_reserved_bytes"])),
        _n(_bytes(f["peak_allocated_bytes"])),
        f'<td class="n{" oom" if f["ooms"] else ""}">{f["ooms"]}</td>',
        _n("—" if f["frag_at_peak"] is None else f"{f['frag_at_peak']:.1%}"),
        _n(str(f["alloc_retries"])),
        _n("—" if f["wall_s"] is None else f"{f['wall_s']:.1f} s"),
        _n("—" if f["step_s"] is None else f"{f['step_s'] * 1e3:.1f} ms"),
        _n("—" if predicted is None else format_bytes(predicted["peak_reserved_bytes"])),
        _n("—" if predicted is None or predicted["error"] is None
           else f"{predicted['error']:+.1%}"),  # fmt: skip
    ]
    return f"<tr{attrs}>{''.join(cells)}</tr>"


def _n(text: str) -> str:
    return f'<td class="n">{esc(text)}</td>'


def _bytes(n: int | float | None) -> str:
    return "—" if n is None else format_bytes(n)

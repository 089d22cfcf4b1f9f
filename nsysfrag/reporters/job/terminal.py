"""The job in the terminal: a table of ranks, the worst rank and why, the skew across ranks.

Readable at 80 columns (reporters.layout): figures stay whole, a hotspot's site is shortened from
the left (its innermost frame or range kept whole), and text from an input or a document is printed as text, control characters escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from nsysfrag.analysis.metrics import basis_words, format_bytes
from nsysfrag.checks.job_ranks import RankSummary
from nsysfrag.moments import moment_since
from nsysfrag.printable import printable
from nsysfrag.reporters.layout import (
    Cell,
    Column,
    FittedTable,
    Layout,
    Prose,
    Site,
    outside,
    right,
)

HEALTH_STYLE = {"ok": "green", "warn": "yellow", "critical": "bold red"}
UNRECORDED = (
    "The analyses of some ranks record no health basis or OOM verdicts (an nsysfrag before they"
    " were added), so those cells are empty."
)

def at(s: RankSummary, time_ns: int) -> str:
    """A moment of rank ``s`` as its own report tells it: seconds since its input's first event
    (``2.028 s``), or ``entry 17`` for a snapshot without times."""
    return moment_since(time_ns, s.origin_ns, s.timestamps, span=s.span_ns)


def basis_text(s: RankSummary) -> str:
    """What set the rank's health, as its document says (``health_basis``); empty when it says
    nothing (ok, or a document from before the basis was recorded)."""
    if s.health_basis is None:
        return ""
    words = basis_words(str(s.health_basis.get("metric", "?")), s.health_basis.get("value"))
    time_ns = s.health_basis.get("time_ns")
    if time_ns is None:
        return words
    # The table's cells wrap through reporters.layout, which keeps a figure with its unit.
    return f"{words} at {at(s, int(time_ns))}"


def oom_text(s: RankSummary) -> str:
    if not s.ooms:
        return "0"
    if not s.verdicts:
        return str(s.ooms)
    return f"{s.ooms}: " + ", ".join(f"{n} {verdict}" for verdict, n in s.verdicts)


def memory_text(s: RankSummary) -> str:
    return f"{format_bytes(s.peak_memory_bytes)} {s.memory_kind}"


def hotspot_text(s: RankSummary) -> str:
    h = s.hotspot
    return "—" if h is None else f"{h.site} ({h.size_class}, holes {format_bytes(h.hole_bytes)})"


def failure(path: str, error: str | None) -> str:
    """A rank's error, naming its input once."""
    text = error or "not analyzed"
    return text if path in text else f"{path}: {text}"


_RANK_COLUMNS = (
    Column("rank", justify="right"),
    Column("health", kind="words"),
    *right("peak frag", "peak memory"),
    Column("OOMs", kind="words"),
    Column("top hotspot", kind="site"),
)


def _rank_row(s: RankSummary) -> list[Cell]:
    if not s.ok:
        return [str(s.rank), Text("FAILED", style="bold red"), "", "", "", "see below"]
    health = Text(s.health.upper(), style=HEALTH_STYLE.get(s.health, ""))
    basis = basis_text(s)
    if basis:
        health.append(f"\n{printable(basis)}", style="dim")
    hotspot: Cell = "—"
    if s.hotspot is not None:  # the site shortened from the left where the column is narrow
        hotspot = Site(
            s.hotspot.site,
            Text(
                f"\n{printable(s.hotspot.size_class)} · {format_bytes(s.hotspot.hole_bytes)} holes",
                style="dim",
            ),
        )
    memory = Text(format_bytes(s.peak_memory_bytes))
    memory.append(f"\n{printable(s.memory_kind)}", style="dim")
    return [str(s.rank), health, f"{s.peak_global_frag:.1%}", memory, outside(oom_text(s)), hotspot]


def render(
    summaries: Sequence[RankSummary], document: dict[str, Any], console: Console
) -> None:
    """The job's terminal report; every string from a rank's input or document is shown as
    text, escaped (reporters.layout)."""
    analyzed = [s for s in summaries if s.ok]
    failed = [s for s in summaries if not s.ok]
    models = sorted({s.model for s in analyzed})
    console.print(Prose(outside(
        f"nsysfrag job · {len(summaries)} rank{'s' if len(summaries) != 1 else ''}:"
        f" {len(analyzed)} analyzed, {len(failed)} failed"
        + (f" · model{'s' if len(models) > 1 else ''}: {', '.join(models)}" if models else ""),
        style="bold",
    )))
    console.print(FittedTable(None, Layout(_RANK_COLUMNS, [_rank_row(s) for s in summaries])))
    if any(not s.basis_known or (s.ooms and not s.verdicts) for s in analyzed):
        console.print(Prose(Text(UNRECORDED, style="dim")))
    _worst(summaries, document, console)
    _skew(document, console)
    for s in failed:  # its error itself is the `nsysfrag: error: rank N: …` line on stderr, once
        said = f"rank {s.rank} failed ({s.path}): its error line on stderr says why"
        console.print(Prose(outside(said, style="red")))
    if analyzed:
        console.print(Prose(Text(
            "A rank's full report: nsysfrag analyze PATH (or --html, --json) on its input alone.",
            style="dim",
        )))


def _worst(summaries: Sequence[RankSummary], document: dict[str, Any], console: Console) -> None:
    worst = document.get("worst")
    if worst is None:
        console.print(Prose(Text("No rank has a device-memory allocation: no worst rank.", style="yellow")))
        return
    s = next(s for s in summaries if s.rank == worst["rank"])
    line = Text("worst rank: ", style="bold")
    line.append(f"{s.rank}", style="bold")
    line.append(
        f" — peak global fragmentation {s.peak_global_frag:.1%} (pid {s.peak_pid}, device"
        f" {s.peak_device}, at {at(s, s.peak_time_ns)}); health "
    )
    line.append(printable(s.health), style=HEALTH_STYLE.get(s.health, ""))
    basis = basis_text(s)
    line.append(f" ({printable(basis)})" if basis else "")
    if s.hotspot is not None:
        line.append(f"; top hotspot {printable(hotspot_text(s))}")
    console.print(Prose(line))


def _skew(document: dict[str, Any], console: Console) -> None:
    skew = document["skew"]
    if skew["ranks"] < 2:
        return
    memory, frag = skew["peak_memory"], skew["peak_global_frag"]
    kind = {"reserved_bytes_peak": "peak reserved", "max.live_bytes": "peak live"}.get(
        memory["metric"], "peak memory (reserved or live)"
    )
    console.print(Prose(Text(
        f"skew across {skew['ranks']} ranks (max / median): {kind}"
        f" {_ratio(memory['max_over_median'])} (rank {memory['max_rank']}"
        f" {format_bytes(memory['max'])}, median {format_bytes(memory['median'])}); peak global"
        f" frag {_ratio(frag['max_over_median'])} (rank {frag['max_rank']} {frag['max']:.1%},"
        f" median {frag['median']:.1%})"
    )))


def _ratio(value: float | None) -> str:
    return "n/a (median 0)" if value is None else f"{value:.2f}×"

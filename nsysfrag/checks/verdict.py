"""The verdict of a comparison, one paragraph in words: how peak memory changed and which site's
live bytes did it, how the stranded memory changed and which site pins it, how the worst
fragmentation changed and which hotspot made new holes, and the health.

    peak reserved +2.10 GiB (+14 %); 1.60 GiB of it is live at `model.py:150 forward` (new);
    stranded +310.00 MiB, 80 % pinned by `attention.py:88 forward`.

A change smaller than the noise of a run (a MiB, half a percent, half a point of global
fragmentation) is not news: the verdict says the figure held instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.checks.site_changes import GONE, MOVED, NEW, UNLISTED, SiteChange
from nsysfrag.checks.space_changes import (
    HOLES,
    LIVE,
    STRANDED,
    MomentChange,
    SiteFigure,
)

# Marks, in a comparison's tables, a figure the device memory C enters (device free, the ratios)
# where the runs' C differ.
CAPACITY_MARK = "‡"
NOISE_BYTES = 1 << 20
NOISE_SHARE = 0.005
NOISE_POINTS = 0.005


@dataclass(frozen=True, slots=True)
class Piece:
    """A run of the verdict's text; ``site`` pieces are a site's text (code in HTML)."""

    text: str
    site: bool = False


def signed_bytes(n: float) -> str:
    """``+2.10 GiB``, ``−310.00 MiB``, ``±0 B``."""
    if n == 0:
        return "±0 B"
    return ("+" if n > 0 else "−") + format_bytes(abs(n))


def signed(text: str) -> str:
    """A figure formatted with ``+`` as its sign (``f"{x:+.2f}"``), with a true minus sign."""
    return "−" + text[1:] if text.startswith("-") else text


def signed_share(r: float) -> str:
    """``+14 %``, ``−2.5 %``."""
    text = f"{abs(r) * 100:.0f}" if abs(r) >= 0.1 else f"{abs(r) * 100:.1f}"
    return ("+" if r >= 0 else "−") + f"{text} %"


def plain(pieces: Sequence[Piece]) -> str:
    """The verdict as text, sites in backticks."""
    return "".join(f"`{p.text}`" if p.site else p.text for p in pieces)


def verdict(
    moments: Sequence[MomentChange],
    sites: Sequence[SiteFigure],
    health: tuple[str, str],
    max_live: tuple[float, float] | None = None,
    failures: tuple[int, int] = (0, 0),
    capacity_note: str = "",
) -> tuple[Piece, ...]:
    """The paragraph, as pieces (see the module's docstring). Out-of-memory errors that appear
    or vanish lead it (nothing else a run does matters as much); where the two runs' device
    memory differs in size or in the evidence it comes from, it ends saying that the figures
    it enters compare unlike things."""
    by_key = {m.key: m for m in moments}
    site_of = {s.key: s for s in sites}
    clauses: list[list[Piece]] = [[Piece(t)] for t in _failure_words(*failures)]
    clauses += _memory(by_key.get("memory_peak"), site_of.get(LIVE), max_live)
    clauses += _stranded(by_key.get("memory_peak"), site_of.get(STRANDED))
    clauses += _fragmentation(by_key.get("peak"), site_of.get(HOLES))
    if health[0] != health[1]:
        clauses.append([Piece(f"health {health[0]} → {health[1]}")])
    if capacity_note:
        clauses.append([Piece(
            f"the device memory differs ({capacity_note}), so the figures marked"
            f" {CAPACITY_MARK} compare different capacities"
        )])  # fmt: skip
    out: list[Piece] = []
    for i, clause in enumerate(clauses):
        if i:
            out.append(Piece("; "))
        out += clause
    if out:
        out.append(Piece("."))
        out[0] = Piece(out[0].text[:1].upper() + out[0].text[1:], out[0].site)
    return tuple(out)


def _failure_words(base: int, current: int) -> list[str]:
    def n(k: int) -> str:
        return f"{k:,} failed allocation{'s' if k != 1 else ''}"

    if base and not current:
        return [f"the out-of-memory errors are gone ({n(base)} → none)"]
    if current and not base:
        return [f"out-of-memory errors appear (none → {n(current)})"]
    if base != current:
        return [f"{'more' if current > base else 'fewer'} out-of-memory errors ({n(base)} → {n(current)})"]
    return []


def _news(delta: float, base: float) -> bool:
    return abs(delta) >= NOISE_BYTES and abs(delta) >= NOISE_SHARE * abs(base)


def _memory(
    moment: MomentChange | None, live: SiteFigure | None, max_live: tuple[float, float] | None
) -> list[list[Piece]]:
    figure = moment.figure("reserved_bytes") if moment is not None else None
    if figure is not None:
        what, base, current = "peak reserved", figure.base, figure.current
    elif max_live is not None:
        what, (base, current) = "peak live bytes", max_live
    else:
        return []
    delta = current - base
    if not _news(delta, base):
        return [[Piece(f"{what} held at {format_bytes(current)} ({signed_bytes(delta)})")]]
    clause = [
        Piece(
            f"{what} {signed_bytes(delta)}" + (f" ({signed_share(delta / base)})" if base else "")
        )
    ]
    top = _top(live, delta)
    if top is not None:
        if abs(top.delta) <= abs(delta):
            verb = "is live" if delta > 0 else "was live"
            clause += _named(top, LIVE, f"; {format_bytes(abs(top.delta))} of it {verb} at ")
        else:
            clause += _named(top, LIVE, "; live at ", f" {signed_bytes(top.delta)}")
    return [clause]


def _stranded(moment: MomentChange | None, stranded: SiteFigure | None) -> list[list[Piece]]:
    figure = moment.figure("stranded_bytes") if moment is not None else None
    if figure is None or not _news(figure.delta, figure.base):
        return []
    clause = [Piece(f"stranded {signed_bytes(figure.delta)}")]
    top = _top(stranded, figure.delta)
    if top is not None:
        share = abs(top.delta) / abs(figure.delta)
        if share <= 1:
            verb = "pinned by" if figure.delta > 0 else "of it was pinned by"
            clause += _named(top, STRANDED, f", {share * 100:.0f} % {verb} ")
        else:  # other sites' stranded bytes moved the other way
            clause += _named(top, STRANDED, "; pinned by ", f": {signed_bytes(top.delta)}")
    return [clause]


def _fragmentation(moment: MomentChange | None, holes: SiteFigure | None) -> list[list[Piece]]:
    figure = moment.figure("global_frag") if moment is not None else None
    clause: list[Piece] = []
    if figure is not None and abs(figure.delta) >= NOISE_POINTS:
        b, c = figure.base * 100, figure.current * 100
        clause.append(Piece(f"worst global frag {b:.1f} % → {c:.1f} %"))
    top = _top(holes, 1.0)
    if top is not None and _news(top.delta, top.base or 0):
        lead = (", " if clause else "") + f"holes {signed_bytes(top.delta)} from "
        clause += _named(top, HOLES, lead)
    return [clause] if clause else []


def _top(figure: SiteFigure | None, direction: float) -> SiteChange | None:
    """The site whose change is largest in the direction of ``direction``'s sign."""
    if figure is None:
        return None
    return next((c for c in figure.changes if c.delta and (c.delta > 0) == (direction > 0)), None)


# How a site that appeared or vanished is told, per figure.
_APPEARED = {LIVE: " (new)", STRANDED: " (it pinned none before)", HOLES: " (a new hotspot)"}
_VANISHED = {LIVE: " (gone)", STRANDED: " (it pins none now)", HOLES: " (no longer a hotspot)"}


def _named(top: SiteChange, figure: str, before: str, after: str = "") -> list[Piece]:
    """A clause's site: ``before``, the site, ``after`` (where there is one), and whether the
    site appeared, vanished or was another in the base run."""
    return [Piece(before), Piece(top.site, True), *([Piece(after)] if after else []),
            *_status(top, figure)]  # fmt: skip


def _status(change: SiteChange, figure: str) -> list[Piece]:
    if change.status == NEW:
        return [Piece(_APPEARED[figure])]
    if change.status == GONE:
        return [Piece(_VANISHED[figure])]
    if change.status == MOVED and change.base_site and change.base_site != change.site:
        return [Piece(" (was "), Piece(change.base_site, True), Piece(")")]
    if change.status == UNLISTED:
        return [Piece(" (not among the other run's largest sites)")]
    return []

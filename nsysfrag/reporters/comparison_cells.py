"""The cells a comparison's terminal and HTML reports both show: the state side by side, moment
by moment, and the sites' figures, each change with its tone (worse, better or neither)."""

from __future__ import annotations

from dataclasses import dataclass

from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.checks.comparison import Comparison, MetricDelta, SpaceComparison
from nsysfrag.checks.site_changes import GONE, MOVED, NEW, SAME, UNLISTED, SiteChange
from nsysfrag.checks.space_changes import BYTES, RATIO, FigureChange, SiteFigure
from nsysfrag.checks.verdict import CAPACITY_MARK, signed, signed_bytes, signed_share
from nsysfrag.moments import GROWTH_SPAN_NS
from nsysfrag.reporters.state_cells import percent

WORSE, BETTER = "worse", "better"
# For these a larger value is better; for the neutral ones (what the program asked for) a change
# is neither; for every other figure larger is worse.
_HIGHER_IS_BETTER = {"device_free_bytes", "largest_free_bytes", "largest_block_bytes", "free_bytes"}
_NEUTRAL = {"allocated_bytes", "active_bytes", "live_bytes", "releasable_bytes", "max.live_bytes"}
# A site table shows this many sites (the largest changes) unless told otherwise.
SITES_SHOWN = 10
STATUS_WORDS = {
    NEW: "new",
    GONE: "gone",
    MOVED: "line moved",  # "lines moved" where several lines of the function add up
    UNLISTED: "not listed in the other run",
}


@dataclass(frozen=True, slots=True)
class Change:
    text: str
    tone: str = ""  # WORSE, BETTER or ""


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    base: str
    current: str
    change: Change
    heading: bool = False  # a moment's first row: its times


@dataclass(frozen=True, slots=True)
class SiteRow:
    site: str
    base: str
    current: str
    change: Change
    status: str  # status_words, "" for a site in both runs under the same text
    short_status: str  # the same in a word or two, for a narrow column
    base_site: str | None  # the base's text where the line moved
    delta_bytes: int


def value(kind: str, v: float) -> str:
    if kind == BYTES:
        return format_bytes(v)
    if kind == RATIO:
        return percent(v)
    return f"{v:,.0f}"


def _tone(key: str, delta: float) -> str:
    if delta == 0 or key in _NEUTRAL:
        return ""
    return BETTER if (delta > 0) == (key in _HIGHER_IS_BETTER) else WORSE


def figure_change(f: FigureChange) -> Change:
    if f.kind == RATIO:
        if abs(f.delta) < 5e-5:  # 0.01 points: less would print as a confusing "-0.00"
            return Change("=")
        return Change(signed(f"{f.delta * 100:+.2f} pt"), _tone(f.key, f.delta))
    if f.delta == 0:
        return Change("=")
    text = signed_bytes(f.delta) if f.kind == BYTES else signed(f"{f.delta:+,.0f}")
    if f.relative is not None:
        text += f" ({signed_share(f.relative)})"
    return Change(text, _tone(f.key, f.delta))


def state_sections(c: Comparison, s: SpaceComparison) -> list[list[Row]]:
    """One section per moment (a heading row with its times, then its figures), then the
    maxima and counts over the run."""
    sections = []
    for m in s.moments:
        rows = [Row(m.label, c.base_clock.at(m.base_time_ns), c.current_clock.at(m.current_time_ns),
                    Change(""), heading=True)]  # fmt: skip
        rows += [
            Row(_marked(s, f.key, f.label), value(f.kind, f.base), value(f.kind, f.current),
                figure_change(f))
            for f in m.figures
        ]  # fmt: skip
        sections.append(rows)
    health = Change(
        f"{s.base_health} → {s.current_health}" if s.base_health != s.current_health else "=",
        WORSE if s.health_worse else (BETTER if s.base_health != s.current_health else ""),
    )
    over = [Row("over the run", "", "", Change(""), heading=True)]
    over.append(Row("health", s.base_health, s.current_health, health))
    short = any(k.span_ns is not None and k.span_ns < GROWTH_SPAN_NS for k in (c.base_clock, c.current_clock))
    over += [
        _metric_row(d, _marked(s, d.key, d.label), growth_shown=not short)
        for d in s.deltas
        if d.key != "peak.global_frag"
    ]
    sections.append(over)
    return sections


# The figures the device memory C enters: device free (C − reserved), and every ratio of it.
_OF_CAPACITY = {"device_free_bytes", "largest_free_bytes", "free_bytes", "global_frag", "local_frag",
                "max.global_frag", "max.local_frag", "growth_per_s"}  # fmt: skip


def _marked(s: SpaceComparison, key: str, label: str) -> str:
    return f"{label} {CAPACITY_MARK}" if s.capacity_note and key in _OF_CAPACITY else label


def capacity_footnote(s: SpaceComparison) -> str:
    """What the mark means, where the space has marked figures ("" where it has none)."""
    if not s.capacity_note:
        return ""
    return (
        f"{CAPACITY_MARK} the device memory enters this figure, and it differs between the"
        f" runs: {s.capacity_note}"
    )


def _metric_row(d: MetricDelta, label: str, growth_shown: bool = True) -> Row:
    kind = {"max.live_bytes": BYTES}.get(d.key, RATIO if d.key in _RATIO_METRICS else "count")
    if d.key == "growth_per_s" and not growth_shown:
        # A rate per second over a run shorter than a second says nothing.
        return Row(label, "—", "—", Change("under a second"))
    if d.key == "growth_per_s":
        fmt = signed(f"{d.base * 100:+.4f} pt/s"), signed(f"{d.current * 100:+.4f} pt/s")
        change = Change(
            "=" if d.delta == 0 else signed(f"{d.delta * 100:+.4f} pt/s"), _tone(d.key, d.delta)
        )
        return Row(label, *fmt, change)
    f = FigureChange(d.key, d.label, kind, d.base, d.current)
    return Row(label, value(kind, d.base), value(kind, d.current), figure_change(f))


_RATIO_METRICS = {"max.global_frag", "max.local_frag", "internal_frag", "alloc_failure_rate"}


def site_rows(
    figure: SiteFigure, shown: int | None = SITES_SHOWN
) -> tuple[list[SiteRow], int, int]:
    """The sites whose figure changed, largest change first (the first ``shown``; None: all),
    and how many more changed and by how much in all."""
    changed = [x for x in figure.changes if x.delta != 0]
    listed = changed if shown is None else changed[:shown]
    rest = changed[len(listed) :]
    tone_key = "live_bytes" if figure.key == "live_at_memory_peak" else "stranded_bytes"
    rows = [
        SiteRow(
            x.site,
            _side(x.base, x.status == NEW),
            _side(x.current, x.status == GONE),
            Change(signed_bytes(x.delta), _tone(tone_key, x.delta)),
            status_words(x),
            "" if x.status == SAME else x.status,
            x.base_site if x.status == MOVED and x.base_site != x.site else None,
            x.delta,
        )
        for x in listed
    ]
    return rows, len(rest), sum(x.delta for x in rest)


def status_words(x: SiteChange) -> str:
    """How a site matched, in words: ``new``, ``moved from line 104``, ``lines moved``."""
    if x.status == MOVED and x.merged:
        return "lines moved"
    if x.status == MOVED and x.base_site is not None:
        line = x.base_site.split(" ", 1)[0].rsplit(":", 1)[-1]
        return f"moved from line {line}"
    return STATUS_WORDS.get(x.status, "")


def _side(v: int | None, absent: bool) -> str:
    if v is None:
        return "unlisted"
    return "—" if absent and v == 0 else format_bytes(v)


def unchanged_words(figure: SiteFigure) -> str:
    return f"no site's {figure.label} changed"

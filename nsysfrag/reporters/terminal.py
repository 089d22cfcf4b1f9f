"""The rich terminal report."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from nsysfrag.analysis import Analysis, Hotspot, SpaceAnalysis
from nsysfrag.analysis.advice import advise
from nsysfrag.analysis.metrics import (
    Health,
    format_bytes,
    size_class_label,
    unrated_words,
)
from nsysfrag.analysis.time_base import growth_words, moment
from nsysfrag.printable import printable
from nsysfrag.reporters import state_cells
from nsysfrag.reporters.failure_words import (
    TERMINAL_SHOWN,
    failure_table,
    failure_text,
    failures_title,
    unknown_note,
)
from nsysfrag.reporters.layout import Cell, Column, FittedTable, Layout, Prose, Site, outside, wrap_lines

STYLE = {Health.OK: "green", Health.WARN: "yellow", Health.CRITICAL: "bold red"}
TOP_HOTSPOTS = 5


def _shown(cell: state_cells.Cell) -> Cell:
    return cell.text if cell.level is None else Text(cell.text, style=STYLE[cell.level])




CALLERS_SHOWN = 3  # of a failed request's stack, after its site


def _failures(s: SpaceAnalysis) -> list[RenderableType]:
    """Every failed allocation (the first TERMINAL_SHOWN) with its own moment and state."""
    if not s.ooms:
        return []
    parts: list[RenderableType] = [Prose(Text(failures_title(s), style="bold red"))]
    texts = [failure_text(s, f) for f in s.ooms[:TERMINAL_SHOWN]]
    if not any(t.explanation for t in texts):
        # Nothing to tell a failure from another but its moment and state: one row each.
        labels, values = failure_table(texts)
        rows: list[list[Cell]] = [list(row) for row in values]
        columns = [Column(label, justify="right") for label in labels]
        parts.append(FittedTable(None, Layout(columns, rows)))
    for text in texts if any(t.explanation for t in texts) else []:
        cells = dict(text.cells)
        line = Text("✗ ", style="bold red")
        line.append(f"at {cells.pop('at')}: {cells.pop('requested')} requested", style="bold")
        line.append(f" — {cells.pop('verdict')}", style="bold red")
        line.append("\n" + " · ".join(f"{label} {value}" for label, value in cells.items()))
        if text.requested_at is not None:
            line.append(f"\nrequested at {printable(text.requested_at)}")
        if text.callers:
            shown = " ← ".join(map(printable, text.callers[:CALLERS_SHOWN]))
            more = len(text.callers) - CALLERS_SHOWN
            rest = f" (+{more} more; --html lists all)" if more > 0 else ""
            line.append(f"\ncalled from {shown}{rest}")
        if text.explanation:
            line.append(f"\n{text.explanation}")
        parts.append(Prose(line))
        if text.stranded:
            sites: list[list[Cell]] = [[Site(site), held] for site, held in text.stranded]
            columns = [Column("stranded beside blocks from", kind="site"), Column("stranded")]
            parts.append(FittedTable(None, Layout(columns, sites), style={"box": None}))
    if len(s.ooms) > TERMINAL_SHOWN:
        more = len(s.ooms) - TERMINAL_SHOWN
        parts.append(Prose(Text(f"… and {more} more; --json lists all.", style="dim")))
    if not all(t.explanation for t in texts):
        parts.append(Prose(Text(unknown_note(s), style="dim")))
    return parts


def _more(pinned_by: tuple[str, ...]) -> str:
    return f" +{len(pinned_by) - 1} more" if len(pinned_by) > 1 else ""


_HOTSPOT_FIGURES = (
    Column("size"),
    Column("out-of-order", justify="right"),
    Column("holes", justify="right"),
    Column("hole bytes", justify="right"),
)


@dataclass(frozen=True)
class _PinnedSite(Site):
    """A hotspot's site and, on the line under it, the site that pinned its holes, each
    shortened from the left to the column's width like any site, " +3 more" kept whole after
    it (main wrapped the pinning site's path at the column's spaces and slashes, ~22 cells,
    and split "+3 / more" across lines)."""

    pinned: str = ""
    more: str = ""

    def full(self) -> str:
        return f"{printable(self.name)}\n{_PINNED}{printable(self.pinned)}{self.more}"

    def fitted(self, width: int) -> Text:
        pinned = Site(self.pinned, Text(self.more)).shortened(max(width - len(_PINNED), 1))
        text = Text(Site(self.name).shortened(width))
        text.append(f"\n{_PINNED}{pinned}{self.more}", style="dim")
        return Text("\n").join(wrap_lines(text, width, name=True))


_PINNED = "pinned by "


def _hotspots(s: SpaceAnalysis) -> FittedTable:
    """The top hotspots: each site whole where it fits, else shortened from the left; of the
    sites that pinned its holes the most frequent one, and how many more. Where the width is
    short, the pinning site goes under the hotspot's own."""
    top = s.hotspots[:TOP_HOTSPOTS]

    def figures(h: Hotspot) -> list[Cell]:
        return [h.size_class, str(h.out_of_order_frees), str(h.hole_creating_frees),
                format_bytes(h.hole_bytes)]  # fmt: skip

    wide = Layout(
        (Column("site", kind="site"), *_HOTSPOT_FIGURES, Column("pinned by", kind="site")),
        [
            [
                Site(h.site),
                *figures(h),
                Site(h.pinned_by[0], Text(_more(h.pinned_by), style="dim")) if h.pinned_by else "",
            ]
            for h in top
        ],
    )
    stacked = Layout(
        (Column("site · pinned by", kind="site"), *_HOTSPOT_FIGURES),
        [
            [
                _PinnedSite(h.site, pinned=h.pinned_by[0], more=_more(h.pinned_by))
                if h.pinned_by
                else Site(h.site),
                *figures(h),
            ]
            for h in top
        ],
    )
    return FittedTable(Text("Out-of-order free hotspots"), wide, alternatives=(stacked,))


def _space(s: SpaceAnalysis) -> RenderableType:
    c = s.counts
    head = Text()
    process = f" ({printable(s.process_name)})" if s.process_name else ""
    head.append(f"process {s.pid}{process} · device {s.device}: {printable(s.device_name)}, ")
    head.append(f"{s.capacity.heading() if s.capacity else format_bytes(s.capacity_bytes)}\n")
    head.append("health: ")
    head.append(s.health.label.upper(), style=STYLE[s.health])
    head.append(f" ({state_cells.health_reason(s)})")
    head.append(
        f"\nallocations {c.allocations} · frees {c.frees} · unmatched frees {c.unmatched_frees}"
        f" · overlaps {c.overlaps} · zero-size {c.zero_size_allocs} · failed {c.failed_allocations}"
        f" ({s.alloc_failure_rate:.2%})"
        + (f" · other kinds {c.other_kind_events}" if s.source.words.other_kinds else "")
    )

    title = s.source.words.space_title
    table = state_cells.state_table(s)
    states = FittedTable(
        Text(f"State ({title})"),
        Layout(
            (Column(""), *(Column(name, justify="right") for name in table.headings)),
            [[label, *(_shown(c) for c in cells)] for label, cells in table.rows],
        ),
    )
    growth = growth_words(s)
    figures = Text(
        f"growth of global fragmentation: {growth} · internal"
        f" fragmentation (rounding) at peak footprint: {s.internal_frag:.2%} · out-of-order"
        f" frees: {s.out_of_order_frees} · frees that left a hole: {s.hole_creating_frees}"
    )
    unrated = [Prose(outside(unrated_words(u, moment(s, u.time_ns)), style="dim"))
               for u in s.unrated]  # fmt: skip
    parts: list[RenderableType] = [Prose(head), *_failures(s), states, *unrated, Prose(figures)]

    columns: tuple[Column, ...]
    if s.hotspots:
        parts.append(_hotspots(s))

    if s.size_histogram:
        most = max(b.count for b in s.size_histogram)
        columns = (
            Column("size class"),
            Column("count", justify="right"),
            Column("bytes", justify="right"),
            Column(""),
        )
        rows = [
            [
                size_class_label(b.lo_bytes.bit_length() - 1),
                str(b.count),
                format_bytes(b.bytes),
                "█" * max(1, round(20 * b.count / most)),
            ]
            for b in s.size_histogram
        ]
        parts.append(FittedTable(Text("Allocation sizes"), Layout(columns, rows)))

    advice = advise(s, failures=False)  # the failures are shown above, each on its own
    if advice:
        parts.append(Prose(Text("\n".join(f"→ {printable(line)}" for line in advice), style="cyan")))
    return Panel(Group(*parts), title=Text(title, style="bold"), title_align="left")


def time_words(analysis: Analysis) -> str:
    """How the report's moments are told: seconds, or event numbers where no time was recorded."""
    timed = [s.timestamps for s in analysis.spaces]
    untimed = analysis.source.words.untimed
    if all(timed):
        return "times in seconds since the input's first event"
    if not any(timed):
        return f"moments are {untimed} numbers: the input recorded no times"
    return f"times in seconds since the input's first event ({untimed} numbers where no time was recorded)"


def render(analysis: Analysis, console: Console) -> None:
    """Print the report for every space to ``console``."""
    words = analysis.source.words
    version = analysis.source.version or words.no_version
    pages = f", pages {format_bytes(analysis.page_bytes)}" if analysis.page_bytes else ""
    console.print(
        Prose(
            Text(
                f"nsysfrag · {printable(analysis.source.path)} · {printable(version)} · model:"
                f" {analysis.model}, granularity {analysis.granularity_bytes} B{pages} ·"
                f" {time_words(analysis)}",
                style="bold",
            )
        )
    )
    for warning in analysis.warnings:
        console.print(Prose(Text(f"! {printable(warning)}", style="yellow")))
    if not analysis.spaces:
        console.print(Text("No device-memory allocations in this trace."))
    for space in analysis.spaces:
        console.print(_space(space))
    console.print(
        Prose(
            Text(
                f"global frag = ({words.free_meaning} − {words.largest_meaning}) / device memory"
                f" (ok < 20 %, critical ≥ 40 %); local frag = 1 − {words.largest_meaning} /"
                " free (ok < 30 %, critical > 60 %); free blocks ok < 100, critical > 500.",
                style="dim",
            )
        )
    )

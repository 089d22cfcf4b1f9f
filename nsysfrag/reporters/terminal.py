"""The rich terminal report."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from nsysfrag.analysis import Analysis, SpaceAnalysis
from nsysfrag.analysis.advice import advise
from nsysfrag.analysis.metrics import (
    Health,
    format_bytes,
    size_class_label,
)
from nsysfrag.printable import printable
from nsysfrag.reporters import state_cells
from nsysfrag.reporters.layout import Cell, Column, FittedTable, Layout, Prose, outside

STYLE = {Health.OK: "green", Health.WARN: "yellow", Health.CRITICAL: "bold red"}
TOP_HOTSPOTS = 5


def _shown(cell: state_cells.Cell) -> Cell:
    return cell.text if cell.level is None else Text(cell.text, style=STYLE[cell.level])


_STATE_COLUMNS = (Column(""), *(Column(name, justify="right") for name in ("at", *state_cells.HEADINGS)))


def _space(s: SpaceAnalysis) -> RenderableType:
    c = s.counts
    head = Text()
    process = f" ({printable(s.process_name)})" if s.process_name else ""
    head.append(f"process {s.pid}{process} · device {s.device}: {printable(s.device_name)}, ")
    head.append(f"{format_bytes(s.capacity_bytes)}\n")
    head.append("health: ")
    head.append(s.health.label.upper(), style=STYLE[s.health])
    head.append(f" ({state_cells.health_reason(s)})")
    head.append(
        f"\nallocations {c.allocations} · frees {c.frees} · unmatched frees {c.unmatched_frees}"
        f" · overlaps {c.overlaps} · zero-size {c.zero_size_allocs} · failed {c.failed_allocations}"
        f" ({s.alloc_failure_rate:.2%}) · other kinds {c.other_kind_events}"
    )

    title = s.source.words.space_title
    states = FittedTable(
        Text(f"State ({title})"),
        Layout(
            _STATE_COLUMNS,
            [[label, *(_shown(c) for c in cells)] for label, cells in state_cells.state_rows(s)],
        ),
    )
    figures = Text(
        f"growth of global fragmentation: {s.growth_per_s * 100:+.3f} points/s · internal"
        f" fragmentation (rounding) at peak footprint: {s.internal_frag:.2%} · out-of-order"
        f" frees: {s.out_of_order_frees} · frees that left a hole: {s.hole_creating_frees}"
    )
    parts: list[RenderableType] = [Prose(head), states, Prose(figures)]

    columns: tuple[Column, ...]
    if s.hotspots:
        columns = (
            Column("site", kind="name"),
            Column("size"),
            Column("out-of-order", justify="right"),
            Column("holes", justify="right"),
            Column("hole bytes", justify="right"),
            Column("pinned by", kind="name"),
        )
        rows: list[list[Cell]] = [
            [
                outside(h.site),
                h.size_class,
                str(h.out_of_order_frees),
                str(h.hole_creating_frees),
                format_bytes(h.hole_bytes),
                outside(", ".join(h.pinned_by[:3])),
            ]
            for h in s.hotspots[:TOP_HOTSPOTS]
        ]
        parts.append(FittedTable(Text("Out-of-order free hotspots"), Layout(columns, rows)))

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

    advice = advise(s)
    if advice:
        parts.append(Prose(Text("\n".join(f"→ {printable(line)}" for line in advice), style="cyan")))
    return Panel(Group(*parts), title=Text(title, style="bold"), title_align="left")


def render(analysis: Analysis, console: Console) -> None:
    """Print the report for every space to ``console``."""
    version = analysis.source.version or analysis.source.words.no_version
    console.print(
        Prose(
            Text(
                f"nsysfrag · {printable(analysis.source.path)} · {printable(version)} · model:"
                f" {analysis.model}, granularity {analysis.granularity_bytes} B",
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
                "global frag = (free − largest free block) / device memory (ok < 20 %, critical"
                " ≥ 40 %); local frag = 1 − largest free block / free (ok < 30 %, critical > 60"
                " %); free blocks ok < 100, critical > 500.",
                style="dim",
            )
        )
    )

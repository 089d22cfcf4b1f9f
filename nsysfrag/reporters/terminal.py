"""The rich terminal report."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from nsysfrag.analysis import Analysis, SpaceAnalysis, State
from nsysfrag.analysis.advice import advise
from nsysfrag.analysis.metrics import (
    Health,
    format_bytes,
    free_blocks_health,
    global_frag_health,
    local_frag_health,
    size_class_label,
)

STYLE = {Health.OK: "green", Health.WARN: "yellow", Health.CRITICAL: "bold red"}
TOP_HOTSPOTS = 5
MODEL_TITLE = "observed address space"


def _rated(text: str, level: Health) -> Text:
    return Text(text, style=STYLE[level])


def _seconds(ns: int) -> str:
    return f"{ns / 1e9:.3f} s"


def _state_rows(table: Table, label: str, s: State) -> None:
    table.add_row(
        label,
        _seconds(s.time_ns),
        _rated(f"{s.global_frag:.1%}", global_frag_health(s.global_frag)),
        _rated(f"{s.local_frag:.1%}", local_frag_health(s.local_frag)),
        _rated(str(s.free_blocks), free_blocks_health(s.free_blocks)),
        format_bytes(s.largest_free_bytes),
        format_bytes(s.free_bytes),
        format_bytes(s.live_bytes),
    )


def _health_reason(s: SpaceAnalysis) -> str:
    """Which rated metric set the health level, at its maximum."""
    rated = [
        (global_frag_health(s.max_global_frag), f"global frag peaked at {s.max_global_frag:.1%}"),
        (local_frag_health(s.max_local_frag), f"local frag peaked at {s.max_local_frag:.1%}"),
        (free_blocks_health(s.max_free_blocks), f"up to {s.max_free_blocks} free blocks"),
    ]
    worst = [text for level, text in rated if level == s.health]
    return "; ".join(worst) if s.health is not Health.OK else "every rated metric stayed in range"


def _space(s: SpaceAnalysis) -> RenderableType:
    c = s.counts
    head = Text()
    process = f" ({s.process_name})" if s.process_name else ""
    head.append(f"process {s.pid}{process} · device {s.device}: {s.device_name}, ")
    head.append(f"{format_bytes(s.capacity_bytes)}\n")
    head.append("health: ")
    head.append(s.health.label.upper(), style=STYLE[s.health])
    head.append(f" ({_health_reason(s)})")
    head.append(
        f"\nallocations {c.allocations} · frees {c.frees} · unmatched frees {c.unmatched_frees}"
        f" · overlaps {c.overlaps} · zero-size {c.zero_size_allocs} · failed {c.failed_allocations}"
        f" ({s.alloc_failure_rate:.2%}) · other kinds {c.other_kind_events}"
    )

    title = f"{s.model} address space"
    states = Table(title=f"State ({title})", title_justify="left", expand=False)
    for col in ("", "at", "global frag", "local frag", "free blocks", "largest free", "free", "live"):
        states.add_column(col, justify="right" if col else "left")
    _state_rows(states, "peak", s.peak)
    _state_rows(states, "final", s.final)
    states.add_row(
        "max",
        "",
        _rated(f"{s.max_global_frag:.1%}", global_frag_health(s.max_global_frag)),
        _rated(f"{s.max_local_frag:.1%}", local_frag_health(s.max_local_frag)),
        _rated(str(s.max_free_blocks), free_blocks_health(s.max_free_blocks)),
        "",
        "",
        format_bytes(s.max_live_bytes),
    )
    figures = Text(
        f"growth of global fragmentation: {s.growth_per_s * 100:+.3f} points/s · internal"
        f" fragmentation (rounding) at peak footprint: {s.internal_frag:.2%} · out-of-order"
        f" frees: {s.out_of_order_frees} · frees that left a hole: {s.hole_creating_frees}"
    )
    parts: list[RenderableType] = [head, states, figures]

    if s.hotspots:
        hot = Table(title="Out-of-order free hotspots", title_justify="left")
        for col in ("site", "size", "out-of-order", "holes", "hole bytes", "pinned by"):
            hot.add_column(col, justify="left" if col in ("site", "pinned by", "size") else "right")
        for h in s.hotspots[:TOP_HOTSPOTS]:
            hot.add_row(
                Text(h.site),
                h.size_class,
                str(h.out_of_order_frees),
                str(h.hole_creating_frees),
                format_bytes(h.hole_bytes),
                Text(", ".join(h.pinned_by[:3])),
            )
        parts.append(hot)

    if s.size_histogram:
        hist = Table(title="Allocation sizes", title_justify="left")
        for col in ("size class", "count", "bytes", ""):
            hist.add_column(col, justify="right" if col in ("count", "bytes") else "left")
        most = max(b.count for b in s.size_histogram)
        for b in s.size_histogram:
            bar = "█" * max(1, round(20 * b.count / most))
            k = b.lo_bytes.bit_length() - 1
            hist.add_row(size_class_label(k), str(b.count), format_bytes(b.bytes), bar)
        parts.append(hist)

    advice = advise(s)
    if advice:
        parts.append(Text("\n".join(f"→ {line}" for line in advice), style="cyan"))
    return Panel(Group(*parts), title=f"[b]{title}[/b]", title_align="left")


def render(analysis: Analysis, console: Console) -> None:
    """Print the report for every space to ``console``."""
    version = analysis.nsys_version or (
        "PyTorch memory snapshot" if analysis.model != "observed" else "unknown nsys version"
    )
    console.print(
        Text(
            f"nsysfrag · {analysis.trace_path} · {version} · model: {analysis.model},"
            f" granularity {analysis.granularity_bytes} B",
            style="bold",
        )
    )
    for warning in analysis.warnings:
        console.print(Text(f"! {warning}", style="yellow"))
    if not analysis.spaces:
        console.print("No device-memory allocations in this trace.")
    for space in analysis.spaces:
        console.print(_space(space))
    console.print(
        Text(
            "global frag = (free − largest free block) / device memory (ok < 20 %, critical ≥ 40 %);"
            " local frag = 1 − largest free block / free (ok < 30 %, critical > 60 %);"
            " free blocks ok < 100, critical > 500.",
            style="dim",
        )
    )

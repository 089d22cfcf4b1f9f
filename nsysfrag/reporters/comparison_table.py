"""The terminal table of a run-to-run comparison."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.text import Text

from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.checks.comparison import Comparison, MetricDelta
from nsysfrag.reporters.layout import Cell, Column, FittedTable, Layout, Prose, outside

_RATIOS = {"max.global_frag", "max.local_frag", "peak.global_frag", "internal_frag", "alloc_failure_rate"}
_BYTES = {"peak.largest_free_bytes", "max.live_bytes"}
# For these a larger value is better; for every other metric larger is worse.
_HIGHER_IS_BETTER = {"peak.largest_free_bytes"}


def _format(key: str, value: float) -> str:
    if key in _RATIOS:
        return f"{value:.2%}"
    if key in _BYTES:
        return format_bytes(value)
    if key == "growth_per_s":
        return f"{value * 100:+.4f} pt/s"
    return f"{value:,.0f}"


def _delta(d: MetricDelta) -> Text:
    # Ratios print to 0.01 points: a smaller change would show as a confusing "-0.00".
    if d.delta == 0 or (d.key in _RATIOS and abs(d.delta) < 5e-5):
        return Text("=", style="dim")
    worse = (d.delta > 0) != (d.key in _HIGHER_IS_BETTER)
    if d.key in _RATIOS:
        text = f"{d.delta * 100:+.2f} pt"
    elif d.key in _BYTES:
        text = ("+" if d.delta > 0 else "−") + format_bytes(abs(d.delta))
    elif d.key == "growth_per_s":
        text = f"{d.delta * 100:+.4f} pt/s"
    else:
        text = f"{d.delta:+,.0f}"
    return Text(text, style="red" if worse else "green")


_COLUMNS = (
    Column("metric", kind="words"),
    Column("base", justify="right"),
    Column("current", justify="right"),
    Column("change", justify="right"),
)


def render(comparison: Comparison, base_name: str, current_name: str, console: Console) -> None:
    for s in comparison.spaces:
        title = outside(
            f"{s.base_space} ({base_name}) → {s.current_space} ({current_name}) · observed"
            " address space"
        )
        health = Text(f"{s.base_health} → {s.current_health}", style="red" if s.health_worse else "")
        rows: list[list[Cell]] = [["health", s.base_health, s.current_health, health]]
        for d in s.deltas:
            rows.append([d.label, _format(d.key, d.base), _format(d.key, d.current), _delta(d)])
        console.print(FittedTable(title, Layout(_COLUMNS, rows)))
    unpaired(comparison.only_in_base, comparison.only_in_current, base_name, current_name, console)
    if not comparison.spaces:
        console.print(Text("No matching spaces to compare.", style="yellow"))


def unpaired(
    only_in_base: Sequence[str],
    only_in_current: Sequence[str],
    base_name: str,
    current_name: str,
    console: Console,
) -> None:
    """What only one side has (spaces, or a job's ranks), one line each."""
    for name in only_in_base:
        console.print(Prose(outside(f"only in {base_name}: {name}", style="yellow")))
    for name in only_in_current:
        console.print(Prose(outside(f"only in {current_name}: {name}", style="yellow")))

"""A job compared with a job in the terminal: the worst rank of each, then rank by rank.

Each rank's comparison is the single-run comparison table (reporters.comparison_table), so two
jobs read as their ranks' comparisons would one by one; text from a document is printed as
text, control characters escaped (reporters.layout).
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from nsysfrag.checks.job_comparison import JobComparison
from nsysfrag.checks.verdict import plain
from nsysfrag.reporters import comparison_table
from nsysfrag.reporters.layout import Prose, outside


def render_comparison(
    comparison: JobComparison, base_name: str, current_name: str, console: Console
) -> None:
    """The worst rank of each job and what changed in the current one's, then each rank's
    comparison, then the ranks that are not in both jobs."""
    worst = comparison.worst_words(base_name, current_name)
    if worst is not None:
        console.print(Prose(outside(worst, style="bold")))
    top = comparison.worst_rank()
    if top is not None and top.comparison is not None:
        for s in top.comparison.spaces:
            if s.verdict:
                said = f"rank {top.rank}, {s.current_space}: {plain(s.verdict)}"
                console.print(Prose(outside(said)))
    for r in comparison.ranks:
        if r.comparison is None:
            console.print(Prose(outside(r.problem or "", style="yellow")))
            continue
        comparison_table.render(
            r.comparison, f"{base_name}, rank {r.rank}", f"{current_name}, rank {r.rank}", console
        )
    comparison_table.unpaired(
        [f"rank {r}" for r in comparison.only_in_base],
        [f"rank {r}" for r in comparison.only_in_current],
        base_name,
        current_name,
        console,
    )
    if not comparison.ranks:
        console.print(Text("No ranks in common to compare.", style="yellow"))

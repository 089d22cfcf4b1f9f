"""Job to job, rank by rank: each rank's analysis compared as two single runs would be."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsysfrag.checks.comparison import COMPARED, Comparison, checked_document, compare, read_json
from nsysfrag.checks.document_words import document_words
from nsysfrag.checks.documents import check_job
from nsysfrag.errors import InputError
from nsysfrag.schemas import JOB as SCHEMA
from nsysfrag.schemas import ANALYSIS as ANALYSIS_SCHEMA


@dataclass(frozen=True, slots=True)
class RankComparison:
    rank: int
    comparison: Comparison | None  # None: the rank failed in one of the runs
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class JobComparison:
    ranks: tuple[RankComparison, ...]
    only_in_base: tuple[int, ...]
    only_in_current: tuple[int, ...]
    # Each job's worst rank, as its document names it (``worst``: rank, pid, device, metric,
    # value), or None when it has none.
    base_worst: dict[str, Any] | None = None
    current_worst: dict[str, Any] | None = None

    def worst_words(self, base_name: str, current_name: str) -> str | None:
        """``worst rank: rank 3 in a.json (peak global frag 12.0 %), rank 5 in b.json
        (31.0 %)``; None when neither job has one."""
        if self.base_worst is None and self.current_worst is None:
            return None
        sides = []
        for worst, name in ((self.base_worst, base_name), (self.current_worst, current_name)):
            if worst is None:
                sides.append(f"none in {name}")
            else:
                value = float(worst.get("value") or 0.0) * 100
                sides.append(f"rank {worst['rank']} in {name} ({value:.1f} %)")
        return f"worst rank (peak global frag): {sides[0]}, {sides[1]}"

    def worst_rank(self) -> RankComparison | None:
        """The comparison of the current job's worst rank with that rank in the base job."""
        if self.current_worst is None:
            return None
        rank = self.current_worst.get("rank")
        return next((r for r in self.ranks if r.rank == rank and r.comparison), None)

    def regressions(self, threshold: float) -> list[str]:
        """Each rank's regressions (see Comparison.regressions), naming the rank."""
        return [
            line.replace("regression: ", f"regression: rank {r.rank}: ", 1)
            for r in self.ranks
            if r.comparison is not None
            for line in r.comparison.regressions(threshold)
        ]


def is_job_document(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("schema") == SCHEMA


def load_job_document(path: Path) -> dict[str, Any]:
    """Read a job's ``--json`` document; InputError with a fix when it is not one."""
    doc = read_json(path)
    if not is_job_document(doc):
        raise InputError(
            f"{path}: not a job's analysis (schema {SCHEMA}); a job compares with the --json of"
            " another job (`nsysfrag analyze` with several inputs)"
        )
    return checked_job(doc, path)


def load_either(path: Path) -> dict[str, Any]:
    """A single analysis or a job's document, checked."""
    doc = read_json(path)
    return checked_job(doc, path) if is_job_document(doc) else checked_document(doc, path)


def checked_job(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """``doc`` when its ranks and their analyses hold what a comparison reads
    (``checks.documents``)."""
    return check_job(doc, path, COMPARED, ANALYSIS_SCHEMA)


def same_kind(base: dict[str, Any], current: dict[str, Any], base_path: Path, current_path: Path) -> None:
    """InputError unless both are jobs or both are single analyses."""
    if is_job_document(base) != is_job_document(current):
        job, single = (base_path, current_path) if is_job_document(base) else (current_path, base_path)
        raise InputError(
            f"{job} is a job's analysis and {single} a single input's; compare a job with a job"
            " (rank by rank) or one analysis with another"
        )


def compare_jobs(
    base: dict[str, Any], current: dict[str, Any], names: tuple[str, str] = ("the base job", "this job")
) -> JobComparison:
    """Pair ranks by number and compare each pair's analyses; a rank analyzed from another kind
    of input (or in another model) in one job is not compared, and says so."""
    base_ranks = {int(e["rank"]): e for e in base["ranks"]}
    current_ranks = {int(e["rank"]): e for e in current["ranks"]}
    pairs = []
    for rank in sorted(base_ranks.keys() & current_ranks.keys()):
        b, c = base_ranks[rank], current_ranks[rank]
        if "analysis" in b and "analysis" in c:
            wb, wc = document_words(b["analysis"]), document_words(c["analysis"])
            if (wb.input, wb.model) != (wc.input, wc.model):
                pairs.append(RankComparison(rank, None, (
                    f"rank {rank} is {wb.description} ({wb.model} model) in {names[0]} and"
                    f" {wc.description} ({wc.model} model) in {names[1]}: not compared"
                )))  # fmt: skip
                continue
            rank_names = (f"{names[0]}, rank {rank}", f"{names[1]}, rank {rank}")
            pairs.append(RankComparison(rank, compare(b["analysis"], c["analysis"], rank_names)))
        else:
            side = "the base run" if "analysis" not in b else "this run"
            error = (b if "analysis" not in b else c).get("error", "not analyzed")
            pairs.append(RankComparison(rank, None, f"rank {rank} failed in {side}: {error}"))
    return JobComparison(
        ranks=tuple(pairs),
        only_in_base=tuple(sorted(base_ranks.keys() - current_ranks.keys())),
        only_in_current=tuple(sorted(current_ranks.keys() - base_ranks.keys())),
        base_worst=_worst(base),
        current_worst=_worst(current),
    )


def _worst(doc: dict[str, Any]) -> dict[str, Any] | None:
    worst = doc.get("worst")
    return worst if isinstance(worst, dict) and isinstance(worst.get("rank"), int) else None

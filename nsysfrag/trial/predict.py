"""What ``whatif`` predicts for the round: each setting's replay of a baseline rank's snapshot
(the figure beside each measured run, and its error on it), and for ``--try auto`` the settings
it recommends or calls worth trying. Only the report's stable parts are read: a policy's name,
peak reserved and simulated OOMs, and the recommendation's candidates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nsysfrag.whatif import WhatifReport


@dataclass(frozen=True, slots=True)
class Prediction:
    policy: str
    peak_reserved_bytes: int
    simulated_ooms: int


@dataclass(frozen=True, slots=True)
class Predictions:
    """One baseline rank's what-if: the simulated baseline and each tried policy."""

    rank: int
    baseline: Prediction | None
    policies: dict[str, Prediction]
    error: str | None = None  # why there is none


def predict(snapshot: Path, policies: Sequence[str], rank: int) -> Predictions:
    """``whatif``'s replay of the baseline rank's snapshot under each policy (its busiest
    device: the one with the highest simulated peak)."""
    from nsysfrag.allocators import parse_policy

    report, problem = _whatif(snapshot, ["torch", *policies])
    if report is None:
        return Predictions(rank, None, {}, problem)
    if not report.spaces:
        return Predictions(rank, None, {}, "no allocation to replay in the snapshot")
    space = max(report.spaces, key=lambda s: max(o.peak_reserved_bytes for o in s.outcomes))
    by_name = {o.name: o for o in space.outcomes}
    found = {}
    for p in policies:
        o = by_name.get(p) or by_name.get(parse_policy(p).name)
        if o is not None:
            found[p] = Prediction(p, int(o.peak_reserved_bytes), int(o.simulated_ooms))
    base = space.baseline
    baseline = None
    if base is not None:
        baseline = Prediction(base.name, int(base.peak_reserved_bytes), int(base.simulated_ooms))
    return Predictions(rank, baseline, found)


def recommended_confs(snapshot: Path) -> tuple[list[str], str | None]:
    """``--try auto``: the PYTORCH_CUDA_ALLOC_CONF of what ``whatif`` recommends on the
    snapshot, and of what it calls worth trying, per device (or why there are none)."""
    report, problem = _whatif(snapshot, ())
    if report is None:
        return [], problem
    confs = []
    for space in report.spaces:
        r = space.recommendation
        for c in (r.chosen, r.worth_trying):
            if c is not None and c.alloc_conf and c.alloc_conf not in confs:
                confs.append(c.alloc_conf)
    return confs, None


def _whatif(snapshot: Path, policies: Sequence[str]) -> tuple[WhatifReport | None, str | None]:
    """The report, or why there is none. The runs are done by now: a what-if that fails, even
    by a bug, costs its predictions only, never the round's table."""
    from nsysfrag.errors import NsysfragError
    from nsysfrag.whatif import whatif

    try:
        return whatif(snapshot, list(policies)), None
    except NsysfragError as err:
        return None, str(err)
    except Exception as err:  # noqa: BLE001  (a bug in whatif: said, and the round goes on)
        return None, f"internal error in whatif: {type(err).__name__}: {err}"

"""What ``whatif`` predicts for the round: each setting's replay of a baseline rank's snapshot
(the figure beside each measured run, and its error on it), and for ``--try auto`` the settings
it recommends or calls worth trying. Only the report's stable parts are read: a policy's name,
peak reserved and simulated OOMs, and the recommendation's candidates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


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
    from nsysfrag.errors import NsysfragError
    from nsysfrag.whatif import whatif

    try:
        report = whatif(snapshot, ["torch", *policies])
    except NsysfragError as err:
        return Predictions(rank, None, {}, str(err))
    if not report.spaces:
        return Predictions(rank, None, {}, "no allocation to replay in the snapshot")
    space = max(report.spaces, key=lambda s: max(o.peak_reserved_bytes for o in s.outcomes))
    from nsysfrag.allocators import parse_policy

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
    from nsysfrag.errors import NsysfragError
    from nsysfrag.whatif import whatif

    try:
        report = whatif(snapshot)
    except NsysfragError as err:
        return [], str(err)
    confs = []
    for space in report.spaces:
        r = space.recommendation
        for c in (r.chosen, r.worth_trying):
            if c is not None and c.alloc_conf and c.alloc_conf not in confs:
                confs.append(c.alloc_conf)
    return confs, None



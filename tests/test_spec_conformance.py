"""nsysfrag against an independent implementation of SPEC 1.1 (tests/spec_reference).

Every input — the samples in sample_traces/, the genuine snapshots in ../shared/real_snapshots
(when present) and the hand-made cases of tests/spec_reference/cases.py — is analyzed twice:
by ``nsysfrag analyze --json -`` and by the reference. One test per input and field group
(spaces, counts, capacity, peak, final, max, health, health_basis, ooms, and for snapshots the
project's own snapshot keys), so a run shows exactly which fields differ where: bytes and counts
must be equal, ratios within 1e-9. The reference's readings of what SPEC leaves open are in
tests/spec_reference/QUESTIONS.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from nsysfrag.cli import cli
from tests.spec_reference import is_snapshot, reference
from tests.spec_reference.cases import BUILDERS

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"
REAL_SNAPSHOTS = REPO.parent / "shared" / "real_snapshots"
GiB = 1 << 30

# (id, path or case name, capacity)
INPUTS: list[tuple[str, str, int | None]] = [
    *((f"sample:{p.name}", str(p), None) for p in sorted(SAMPLES.glob("*.sqlite"))),
    *((f"sample:{p.name}", str(p), None) for p in sorted(SAMPLES.glob("*.pickle"))),
    ("sample:training_snapshot.pickle@80GiB", str(SAMPLES / "training_snapshot.pickle"), 80 * GiB),
    *((f"real:{p.name}", str(p), None) for p in sorted(REAL_SNAPSHOTS.glob("*.p*"))),
    *((f"case:{b.__name__}", b.__name__, None) for b in BUILDERS),
]
GROUPS = ["spaces", "counts", "capacity", "peak", "final", "max", "health", "health_basis", "ooms",
          "snapshot_keys"]  # fmt: skip

_cache: dict[str, tuple[dict[str, Any], dict[str, Any], bool]] = {}


def _analyze(
    input_id: str, where: str, capacity: int | None, tmp: Path
) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """(reference document, nsysfrag document, is a snapshot), computed once per input."""
    if input_id not in _cache:
        if input_id.startswith("case:"):
            case = next(b for b in BUILDERS if b.__name__ == where)(tmp)
            path, capacity = case.path, case.capacity
        else:
            path = Path(where)
        args = ["analyze", str(path), "--json", "-"]
        if capacity is not None:
            args += ["--capacity", str(capacity)]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        _cache[input_id] = (reference(path, capacity), json.loads(result.stdout), is_snapshot(path))
    return _cache[input_id]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        ok = isinstance(b, (int, float)) and not isinstance(b, bool) and a is not None
        return ok and math.isclose(a, b, rel_tol=0, abs_tol=1e-9)
    return bool(a == b) and type(a) is type(b)


def _diff(path: str, ref: Any, got: Any, out: list[str]) -> None:
    """Every field of ``ref`` (the reference's value) that ``got`` lacks or differs in."""
    if isinstance(ref, dict):
        if not isinstance(got, dict):
            out.append(f"{path}: reference {ref!r}, nsysfrag {got!r}")
            return
        for key, value in ref.items():
            if key not in got:
                out.append(f"{path}.{key}: missing in nsysfrag (reference {value!r})")
            else:
                _diff(f"{path}.{key}", value, got[key], out)
    elif isinstance(ref, list):
        if not isinstance(got, list):
            out.append(f"{path}: reference {ref!r}, nsysfrag {got!r}")
            return
        if len(ref) != len(got):
            out.append(f"{path}: {len(ref)} entries in the reference, {len(got)} in nsysfrag")
        for i, (r, g) in enumerate(zip(ref, got)):
            _diff(f"{path}[{i}]", r, g, out)
    elif not _same(ref, got):
        out.append(f"{path}: reference {ref!r}, nsysfrag {got!r}")


def _group(space: dict[str, Any], group: str, snapshot: bool) -> Any:
    if group == "counts":
        return {"counts": space["counts"], "alloc_failure_rate": space["alloc_failure_rate"]}
    if group == "capacity":
        keys = ("capacity_bytes", "capacity_source") if snapshot else ("capacity_bytes",)
        return {k: space[k] for k in keys}
    return space[group]


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize(("input_id", "where", "capacity"), INPUTS, ids=[i[0] for i in INPUTS])
def test_conformance(
    input_id: str, where: str, capacity: int | None, group: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ref, got, snapshot = _analyze(input_id, where, capacity, tmp_path_factory.mktemp("case"))
    if group == "snapshot_keys" and not snapshot:
        pytest.skip("nsys input: the snapshot keys do not apply")
    ref_spaces = {(s["pid"], s["device"]): s for s in ref["spaces"]}
    got_spaces = {(s["pid"], s["device"]): s for s in got["spaces"]}
    if group == "spaces":
        assert sorted(got_spaces) == sorted(ref_spaces)
        return
    diffs: list[str] = []
    for key, space in ref_spaces.items():
        if key not in got_spaces:
            diffs.append(f"space {key}: missing in nsysfrag")
            continue
        label = f"pid {key[0]} device {key[1]}"
        theirs = got_spaces[key]
        if group in ("health_basis", "ooms") and group not in theirs:
            diffs.append(f"{label} {group}: missing in nsysfrag (reference {space[group]!r})")
            continue
        mine = _group(space, group, snapshot)
        if group in ("counts", "capacity", "snapshot_keys"):  # top-level keys of the space
            _diff(label, mine, theirs, diffs)
        else:
            _diff(f"{label} {group}", mine, theirs[group], diffs)
    assert not diffs, f"{input_id}: {len(diffs)} field(s) differ\n" + "\n".join(diffs)

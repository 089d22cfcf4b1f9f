"""How nsysfrag's JSON is held to the independent SPEC reference (tests/spec_reference).

One comparison for every test that checks nsysfrag against the reference: the hand-picked
inputs of test_spec_conformance.py and the random ones of test_spec_differential.py. Per space
and field group (spaces, counts, capacity, peak, final, max, health, health_basis, ooms, and for
snapshots the project's own snapshot keys): bytes and counts must be equal, ratios within 1e-9;
keys nsysfrag adds beyond the reference's are not compared.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from nsysfrag.cli import cli
from tests.spec_reference import is_snapshot, reference

GROUPS = ["spaces", "counts", "capacity", "peak", "memory_peak", "final", "max", "health",
          "health_basis", "ooms", "snapshot_keys"]  # fmt: skip

Document = dict[str, Any]


def run_nsysfrag(path: Path, capacity: int | None) -> Result:
    """``nsysfrag analyze PATH --json -`` (with ``--capacity``), run in-process."""
    args = ["analyze", str(path), "--json", "-"]
    if capacity is not None:
        args += ["--capacity", str(capacity)]
    return CliRunner().invoke(cli, args)


def nsysfrag_json(path: Path, capacity: int | None) -> Document:
    """nsysfrag's JSON document of ``path``; it must have analyzed it (exit code 0)."""
    result = run_nsysfrag(path, capacity)
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def analyze_both(path: Path, capacity: int | None) -> tuple[Document, Document, bool]:
    """(reference document, nsysfrag document, whether the input is a snapshot)."""
    return reference(path, capacity), nsysfrag_json(path, capacity), is_snapshot(path)


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


def _group(space: Document, group: str, snapshot: bool) -> Any:
    if group == "counts":
        return {"counts": space["counts"], "alloc_failure_rate": space["alloc_failure_rate"]}
    if group == "capacity":
        keys = ("capacity_bytes", "capacity_source") if snapshot else ("capacity_bytes",)
        return {k: space[k] for k in keys}
    return space[group]


def group_differences(ref: Document, got: Document, group: str, snapshot: bool) -> list[str]:
    """One line per field of ``group`` in which nsysfrag's document differs from the reference's
    (the group "snapshot_keys" applies to snapshots only: nothing to compare for nsys input)."""
    ref_spaces = {(s["pid"], s["device"]): s for s in ref["spaces"]}
    got_spaces = {(s["pid"], s["device"]): s for s in got["spaces"]}
    if group == "spaces":
        if sorted(got_spaces) == sorted(ref_spaces):
            return []
        return [f"spaces: reference {sorted(ref_spaces)}, nsysfrag {sorted(got_spaces)}"]
    if group == "snapshot_keys" and not snapshot:
        return []
    diffs: list[str] = []
    for key, space in ref_spaces.items():
        if key not in got_spaces:
            diffs.append(f"space {key}: missing in nsysfrag")
            continue
        label = f"pid {key[0]} device {key[1]}"
        theirs = got_spaces[key]
        if group in ("health_basis", "ooms", "memory_peak") and group not in theirs:
            diffs.append(f"{label} {group}: missing in nsysfrag (reference {space[group]!r})")
            continue
        mine = _group(space, group, snapshot)
        if group in ("counts", "capacity", "snapshot_keys"):  # top-level keys of the space
            _diff(label, mine, theirs, diffs)
        else:
            _diff(f"{label} {group}", mine, theirs[group], diffs)
    return diffs


def differences(ref: Document, got: Document, snapshot: bool) -> list[str]:
    """Every group's differences, group by group."""
    return [line for group in GROUPS for line in group_differences(ref, got, group, snapshot)]

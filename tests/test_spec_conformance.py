"""nsysfrag against an independent implementation of SPEC 1.2 (tests/spec_reference).

Every input — the samples in sample_traces/, the genuine snapshots in ../shared/real_snapshots
and nsys exports in ../shared/real_memory_traces (when present) and the hand-made cases of tests/spec_reference/cases.py — is analyzed twice:
by ``nsysfrag analyze --json -`` and by the reference. One test per input and field group
(spaces, counts, capacity, peak, memory_peak, final, max, health, health_basis, ooms, and for snapshots the
project's own snapshot keys), so a run shows exactly which fields differ where: bytes and counts
must be equal, ratios within 1e-9 (the comparison lives in tests/spec_compare.py, shared with the
random inputs of test_spec_differential.py). The reference's readings of what SPEC leaves open are in
tests/spec_reference/QUESTIONS.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.spec_compare import GROUPS, analyze_both, group_differences
from tests.spec_reference.cases import BUILDERS

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"
REAL_SNAPSHOTS = REPO.parent / "shared" / "real_snapshots"
REAL_MEMORY_TRACES = REPO.parent / "shared" / "real_memory_traces"
GiB = 1 << 30

# (id, path or case name, capacity)
INPUTS: list[tuple[str, str, int | None]] = [
    *((f"sample:{p.name}", str(p), None) for p in sorted(SAMPLES.glob("*.sqlite"))),
    *((f"sample:{p.name}", str(p), None) for p in sorted(SAMPLES.glob("*.pickle"))),
    ("sample:training_snapshot.pickle@80GiB", str(SAMPLES / "training_snapshot.pickle"), 80 * GiB),
    *((f"real:{p.name}", str(p), None) for p in sorted(REAL_SNAPSHOTS.glob("*.p*"))),
    *((f"real:{p.name}", str(p), None) for p in sorted(REAL_MEMORY_TRACES.glob("*.sqlite"))),
    *((f"case:{b.__name__}", b.__name__, None) for b in BUILDERS),
]
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
        _cache[input_id] = analyze_both(path, capacity)
    return _cache[input_id]


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize(("input_id", "where", "capacity"), INPUTS, ids=[i[0] for i in INPUTS])
def test_conformance(
    input_id: str, where: str, capacity: int | None, group: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ref, got, snapshot = _analyze(input_id, where, capacity, tmp_path_factory.mktemp("case"))
    if group == "snapshot_keys" and not snapshot:
        pytest.skip("nsys input: the snapshot keys do not apply")
    diffs = group_differences(ref, got, group, snapshot)
    assert not diffs, f"{input_id}: {len(diffs)} field(s) differ\n" + "\n".join(diffs)

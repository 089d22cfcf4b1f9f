"""An independent, deliberately slow reading of SPEC 1.1, used as nsysfrag's acceptance test.

``reference(path, capacity)`` returns ``{"spaces": [...]}`` with, per space, the keys of the
``nsysfrag/1`` JSON that SPEC 1.1 defines: counts, capacity, peak, final, max, health,
health_basis and ooms (plus the SPEC §9 byte keys for snapshots). It was written from SPEC.md,
ALLOCATORS.md, NSYS_SCHEMA.md and the project's README only, without reading nsysfrag's model
code; where those documents are silent, QUESTIONS.md says which reading was taken.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .observed import analyze_observed
from .segments import analyze_snapshot


def is_snapshot(path: str | Path) -> bool:
    path = Path(path)
    if path.suffix in (".pickle", ".pkl"):
        return True
    with path.open("rb") as f:
        return f.read(1) == b"\x80"  # a pickle (protocol 2+) starts with PROTO


def reference(path: str | Path, capacity: int | None = None) -> dict[str, Any]:
    if is_snapshot(path):
        return analyze_snapshot(path, capacity)
    return analyze_observed(path, capacity)

"""The reports tell each failed allocation with the state at its own moment (docs/metrics.md,
"Failed allocations"), never with the peak's; built on the hand-made cases of
tests/spec_reference/cases.py."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from nsysfrag.cli import cli
from tests.spec_reference.cases import PID, failures_at_their_moment


def _analyze(path: Path, *args: str) -> dict[tuple[int, int], dict[str, object]]:
    result = CliRunner().invoke(cli, ["analyze", str(path), "--json", "-", *args])
    assert result.exit_code == 0, result.output
    return {(s["pid"], s["device"]): s for s in json.loads(result.stdout)["spaces"]}


def test_nsys_failures_are_told_with_their_own_state(tmp_path: Path) -> None:
    """GIVEN two failed cudaMalloc calls on device 0, the first before any event (64 MiB free)
    and the second after three 8 MiB allocations, and a peak later with 48 MiB free in 2 blocks
    WHEN the trace is analyzed
    THEN the advice counts both failures, describes the first with the empty device, says the
    size is unknown, and never quotes the peak's free memory."""
    case = failures_at_their_moment(tmp_path)
    advice = _analyze(case.path)[(PID, 0)]["advice"]
    assert isinstance(advice, list)
    text = " ".join(advice)
    assert "2 allocations failed." in text
    assert "0.000 s with 64.00 MiB free in 1 block(s), the largest 64.00 MiB" in text
    assert "records no size" in text and "unknown" in text
    assert "48.00 MiB" not in text

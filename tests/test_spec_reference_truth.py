"""The reference's window rebuild checked against ground truth.

sample_traces/make_snapshots.py simulates the caching allocator and keeps only the last
entries of its trace, like PyTorch's ring buffer. Run with an unbounded buffer, the same
workload gives the whole history: replayed from an empty device, every block's size is known.
The reference, given only the cut trace and the final segments, must reproduce the state of
the full replay after every event of the window, and at the window's start.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.spec_reference import segments

MAKE_SNAPSHOTS = Path(__file__).resolve().parent.parent / "sample_traces" / "make_snapshots.py"


def _generator() -> ModuleType:
    """A private copy of the generator module, whose ring buffer we can lift."""
    spec = importlib.util.spec_from_file_location("make_snapshots_full", MAKE_SNAPSHOTS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered under its private name: dataclasses (some made inside the workloads) look
    # their module up when they are created.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.MAX_ENTRIES = 1 << 60
    return module


WORKLOADS: dict[str, Callable[[ModuleType], dict[str, Any]]] = {
    "training": lambda m: m.training_loop(),
    "inference": lambda m: m.inference_loop(False),
    "inference_expandable": lambda m: m.inference_loop(True),
}


@pytest.mark.parametrize("window", [8000, 2500])
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_rebuilt_window_matches_the_whole_history(workload: str, window: int) -> None:
    full = WORKLOADS[workload](_generator())
    trace = full["device_traces"][0]
    assert len(trace) > window  # the cut really drops history
    settings = segments.Settings.from_snapshot(full["allocator_settings"])
    offset = len(trace) - window
    whole = segments._replay(full["segments"], trace, list(range(len(trace))), settings)
    cut = segments._replay(
        full["segments"], trace[offset:], [offset + i for i in range(window)], settings
    )
    assert whole.initial_blocks == 0 and whole.conflicts == 0 and whole.final_mismatches == 0
    assert cut.initial_blocks > 0 and cut.conflicts == 0 and cut.final_mismatches == 0

    truth: dict[int, dict[str, int]] = {}
    for t, raw in whole.raw[1:]:
        truth[t] = raw  # the state after entry t (moments only)
    before = [raw for t, raw in whole.raw[1:] if t < offset]
    start_t, start = cut.raw[0]
    assert start_t == offset
    assert start == before[-1], "the rebuilt start of the window"
    wrong = [(t, raw, truth[t]) for t, raw in cut.raw[1:] if raw != truth[t]]
    assert not wrong, f"{len(wrong)} of {len(cut.raw) - 1} moments differ; first: {wrong[0]}"

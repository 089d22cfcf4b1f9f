"""nsysfrag's window rebuild against ground truth (docs/metrics.md, "The window of a snapshot").

sample_traces/make_snapshots.py simulates PyTorch's caching allocator and keeps only the last
entries of its history, as PyTorch's ring buffer does. Run with an unbounded buffer, the same
workload gives the whole history, replayed from an empty device with every block's size known.
Given only a cut window and the final segments, both replays of the pytorch-segments model (the
compiled one and the Python reference) must reproduce the state of the whole history after every
event of the window, and at its start: reserved, active (and pending), free, largest free block, free blocks,
releasable and live bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from nsysfrag.inputs.torch_snapshot.reader import parse_snapshot
from nsysfrag.inputs.torch_snapshot.spaces import device_events
from nsysfrag.models.segments import compiled, replay
from nsysfrag.models.segments.device_replay import DeviceReplay
from nsysfrag.models.segments.rules import AllocatorSettings
from tests.test_spec_reference_truth import (  # the same generator and workloads
    WORKLOADS,
    _generator,
)
from tests.kernel_modes import both_kernels  # noqa: F401  (every test both ways)

STATE = (
    "reserved_bytes", "active_bytes", "pending_bytes", "free_bytes", "largest_free_bytes", "free_blocks",
    "releasable_bytes", "live_bytes",
)  # fmt: skip
REPLAYS = {"compiled": compiled.replay_device, "python": replay.replay_device}


_whole: dict[str, dict[str, Any]] = {}


def _replay(data: dict[str, Any], how: str) -> DeviceReplay:
    records = parse_snapshot(data, "snapshot")
    settings = AllocatorSettings(
        records.roundup_power2_divisions, records.max_split_size, records.expandable_segments
    )
    events, timestamps = device_events(records.histories.get(0, []), 0)
    return REPLAYS[how](events, records.segments, settings, timestamps)


@pytest.mark.parametrize("how", sorted(REPLAYS))
@pytest.mark.parametrize("window", [8000, 2500])
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_the_rebuilt_window_is_the_whole_history(workload: str, window: int, how: str) -> None:
    """GIVEN a workload's whole history and the same history cut to its last ``window`` entries
    WHEN both are replayed
    THEN the cut one starts in the state the whole one was in before the window's first entry,
    and is in the same state after every event of the window."""
    if workload not in _whole:
        _whole[workload] = WORKLOADS[workload](_generator())
    data = _whole[workload]
    history = data["device_traces"][0]
    assert len(history) > window  # the cut really drops history
    cut = {**data, "device_traces": [history[-window:]]}
    whole, part = _replay(data, how), _replay(cut, how)
    assert whole.initial_blocks == 0 and whole.conflicts == 0 and whole.final_mismatches == 0
    assert part.initial_blocks > 0 and part.conflicts == 0 and part.final_mismatches == 0
    tail = len(part.time_ns) - part.initial_blocks  # the window's own points, in both
    for column in STATE:
        want, got = getattr(whole, column), getattr(part, column)
        start = int(want[len(want) - tail - 1])
        assert (got[: part.initial_blocks] == start).all(), f"{column} at the window's start"
        differ = np.flatnonzero(want[-tail:] != got[-tail:])
        assert len(differ) == 0, f"{column}: {len(differ)} of {tail} points differ"

"""The device capacity a snapshot's replay runs on: ``--capacity``; else what a recorded OOM
says (reserved + the device's free memory then); else the largest capacity consistent with the
recorded OOM retries; else an assumed 80 GiB."""

from __future__ import annotations

from collections.abc import Sequence

from nsysfrag.allocators.base import GiB, MiB
from nsysfrag.snapshot_reader import TraceEntry

DEFAULT_SNAPSHOT_CAPACITY = 80 * GiB
PAGE = 2 * MiB


def snapshot_capacity(
    capacity: int | None, trace: Sequence[TraceEntry], initial: int, reserved: list[int]
) -> tuple[int, str]:
    """--capacity; else what a recorded OOM says (reserved + free device memory then); else
    the largest capacity consistent with the recorded OOM retries; else an assumed 80 GiB."""
    if capacity is not None:
        return capacity, "--capacity"
    for e, r in zip(trace, reserved, strict=True):
        if e.action == "oom" and e.device_free is not None:
            return r + e.device_free, "estimated from the recorded OOM: reserved + free device memory then"
    peak = max([initial, *reserved])
    refused = [need for need in _refusals(trace, initial, reserved) if need > peak]
    if refused:
        # cudaMalloc refused reserved + the new segment there, and the run held `peak` at most.
        return max(peak, min(refused) - PAGE), (
            "estimated from the recorded OOM retries: just below the smallest reserved + new"
            " segment the device refused"
        )
    return DEFAULT_SNAPSHOT_CAPACITY, "assumed: the snapshot does not record the device's memory; pass --capacity"


def _refusals(trace: Sequence[TraceEntry], initial: int, reserved: list[int]) -> list[int]:
    """Reserved bytes + the new segment where a malloc released cached segments and then
    allocated one: what the device (apparently) refused the first time."""
    out = []
    j, n = 0, len(trace)
    while j < n:
        if trace[j].action not in ("segment_free", "segment_unmap"):
            j += 1
            continue
        before = reserved[j - 1] if j > 0 else initial
        while j < n and trace[j].action in ("segment_free", "segment_unmap"):
            j += 1
        if j < n and trace[j].action in ("segment_alloc", "segment_map"):
            out.append(before + trace[j].size)
    return out

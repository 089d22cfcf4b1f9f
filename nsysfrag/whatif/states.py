"""A policy's replay in the state model analyze rates a caching allocator in: what the policy
holds from the device (reserved), the free bytes inside it, what it could give back at once
(releasable) and the rest (stranded), the device's memory outside it (``D = C − reserved``), and
the largest request that succeeds without new memory from a fragmented device,
``L_eff = max(L, D + R)``. The metrics are then taken over everything free on the device,
``D + F``, exactly as analyze's pytorch-segments model takes them (docs/metrics.md), so a
policy's figures and analyze's are one definition.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nsysfrag.allocators.base import I64, SimResult
from nsysfrag.models.series import PoolColumns


@dataclass(frozen=True)
class DeviceStates:
    """The state after every event over the whole device (``analysis.summary.StateColumns``)."""

    free_bytes: I64  # D + F: everything free on the device
    largest_free_bytes: I64  # L_eff = max(L, D + R)
    free_blocks: I64  # N, plus 1 when D > 0 (the device's memory outside is one more range)
    live_bytes: I64  # U: the requested bytes of the live requests


def device_states(r: SimResult, capacity_bytes: int) -> tuple[DeviceStates, PoolColumns]:
    """The replay ``r`` on a device of ``capacity_bytes``: the rated columns and the pool's."""
    reserved = r.reserved_bytes
    device_free: I64 = np.maximum(capacity_bytes - reserved, 0)
    states = DeviceStates(
        free_bytes=device_free + r.free_bytes,
        largest_free_bytes=np.maximum(r.largest_free_bytes, device_free + r.releasable_bytes),
        free_blocks=r.free_blocks + (device_free > 0),
        live_bytes=r.live_bytes,
    )
    pool = PoolColumns(
        reserved_bytes=reserved,
        allocated_bytes=r.allocated_bytes,
        # Every byte reserved and not free is in a block not yet reusable: PyTorch's active.
        active_bytes=reserved - r.free_bytes,
        releasable_bytes=r.releasable_bytes,
        largest_block_bytes=r.largest_free_bytes,
        capacity_bytes=capacity_bytes,
    )
    return states, pool

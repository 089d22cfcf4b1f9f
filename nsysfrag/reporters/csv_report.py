"""The full-resolution timeline: one row per replayed event of every space."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from nsysfrag.analysis import EVENT_NAMES, Analysis

if TYPE_CHECKING:
    import pandas as pd

    from nsysfrag.models.series import PoolColumns

COLUMNS = (
    "pid",
    "device",
    "event_index",
    "time_ns",
    "event",
    "address",
    "bytes",
    "global_frag",
    "local_frag",
    "free_blocks",
    "largest_free_bytes",
    "free_bytes",
    "live_bytes",
)


def frame(analysis: Analysis) -> pd.DataFrame:
    import pandas as pd  # only CSV needs it, and it takes a fifth of a second to import

    parts = []
    for s in analysis.spaces:
        t = s.timeline
        n = len(t.time_ns)
        parts.append(
            pd.DataFrame(
                {
                    "pid": s.pid,
                    "device": s.device,
                    "event_index": range(n),
                    "time_ns": t.time_ns,
                    "event": pd.Categorical.from_codes(t.event, categories=EVENT_NAMES),
                    "address": t.address,
                    "bytes": t.bytes,
                    "global_frag": t.global_frag,
                    "local_frag": t.local_frag,
                    "free_blocks": t.free_blocks,
                    "largest_free_bytes": t.largest_free_bytes,
                    "free_bytes": t.free_bytes,
                    "live_bytes": t.live_bytes,
                    **({} if t.pool is None else _pool_columns(t.pool)),
                }
            )
        )
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(COLUMNS))


def _pool_columns(pool: PoolColumns) -> dict[str, Any]:
    """A caching allocator's own figures after each event (snapshots), after the common ones:
    what PyTorch users plot memory by."""
    stranded = np.maximum(pool.reserved_bytes - pool.active_bytes - pool.releasable_bytes, 0)
    return {
        "reserved_bytes": pool.reserved_bytes,
        "allocated_bytes": pool.allocated_bytes,
        "active_bytes": pool.active_bytes,
        "stranded_bytes": stranded,
        "releasable_bytes": pool.releasable_bytes,
        "device_free_bytes": pool.device_free_bytes,
        "largest_block_bytes": pool.largest_block_bytes,
    }


def write(analysis: Analysis, destination: Path | TextIO) -> None:
    """Write the timeline to a file, or to an open text stream (stdout)."""
    frame(analysis).to_csv(destination, index=False, float_format="%.9g")

"""A state-only snapshot rated exactly as ``analyze`` rates any snapshot: read by the snapshot
reader, replayed in the ``pytorch-segments`` model on the device's recorded size, summarized by
``analysis.summary.summarize``; the rating is that summary's final state, its rated metrics'
health levels (local fragmentation and free blocks only where they are material, as for a
space's health), and the site whose blocks pin the most stranded memory then.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from nsysfrag.analysis.failures import stranded_sites
from nsysfrag.analysis.metrics import (
    Health,
    free_blocks_health,
    global_frag_health,
    local_frag_health,
    material,
)
from nsysfrag.analysis.summary import summarize
from nsysfrag.inputs import InputOptions
from nsysfrag.inputs.torch_snapshot.columns import snapshot_columns
from nsysfrag.inputs.torch_snapshot.spaces import recording_of


@dataclass(frozen=True, slots=True)
class Rating:
    """One device's rated state at one sample."""

    device: int
    time_unix_ns: int
    global_frag: float
    local_frag: float
    free_blocks: int
    material: bool  # free memory >= 5 % of the device: local_frag and free_blocks count
    reserved_bytes: int
    allocated_bytes: int
    stranded_bytes: int
    releasable_bytes: int
    device_free_bytes: int
    largest_usable_bytes: int
    capacity_bytes: int
    capacity_source: str
    pinning_site: str | None  # the site whose blocks hold the most stranded memory
    pinning_bytes: int

    def levels(self) -> dict[str, Health]:
        """Each rated metric's level, as a space's health counts it."""
        return {
            "global_frag": global_frag_health(self.global_frag),
            "local_frag": local_frag_health(self.local_frag) if self.material else Health.OK,
            "free_blocks": free_blocks_health(self.free_blocks) if self.material else Health.OK,
        }

    def document(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["levels"] = {k: v.label for k, v in self.levels().items()}
        return out


def rate_state(
    segments: Any, label: str, device_bytes: dict[int, int], time_unix_ns: int
) -> list[Rating]:
    """Every device of a state snapshot (``torch.cuda.memory_snapshot()``'s segments), rated
    on the devices' recorded sizes (``device_bytes``; a device without one is rated as a
    snapshot alone would be)."""
    columns = snapshot_columns(segments, label)
    recording = recording_of(columns, InputOptions(), device_bytes=device_bytes)
    out = []
    for space in recording.spaces:
        run = space.model.run(space)
        if len(run.series) == 0:
            continue
        first = int(space.events.time_ns[0]) if len(space.events) else 0
        source = dataclasses.replace(recording.source, first_event_ns=first)
        s = summarize(space, run, source, recording.model)
        final, pool = s.final, s.final.pool
        last = len(run.series) - 1
        sites = stranded_sites(run.stranded_after(last), run.series)
        capacity_source = s.snapshot.capacity_source if s.snapshot is not None else ""
        out.append(
            Rating(
                device=space.device,
                time_unix_ns=time_unix_ns,
                global_frag=final.global_frag,
                local_frag=final.local_frag,
                free_blocks=final.free_blocks,
                material=bool(material(np.array([final.free_bytes]), s.capacity_bytes)[0]),
                reserved_bytes=pool.reserved_bytes if pool else 0,
                allocated_bytes=pool.allocated_bytes if pool else 0,
                stranded_bytes=pool.stranded_bytes if pool else 0,
                releasable_bytes=pool.releasable_bytes if pool else 0,
                device_free_bytes=pool.device_free_bytes if pool else 0,
                largest_usable_bytes=final.largest_free_bytes,
                capacity_bytes=s.capacity_bytes,
                capacity_source=capacity_source,
                pinning_site=sites[0].site if sites else None,
                pinning_bytes=sites[0].stranded_bytes if sites else 0,
            )
        )
    return out

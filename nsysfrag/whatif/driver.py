"""The baseline of an nsys trace: what the program did on the driver's pages, as ``analyze``
reads it.

An nsys trace records the driver's allocations, so its baseline is no simulation: it is the
observed model's replay of the space (docs/metrics.md), the same run ``analyze`` summarizes.
:func:`recorded_baseline` turns that run into the :class:`~nsysfrag.allocators.base.SimResult`
every policy gives (after each request of the stream: free bytes inside the resident pages,
the largest run of them, their number, reserved, allocated and live bytes; the recorded failed
calls as its failures), and :meth:`Recorded.outcome` summarizes it as every policy is, with
each figure ``analyze`` also reports taken from ``analyze`` itself: the baseline's row is
analyze's figures, whatever the summary of a replay computes.

Which kind of program it was decides the alternatives (``PROGRAM_*``): a caching allocator's
segments (a PyTorch program seen from the driver: the what-if belongs to a memory snapshot), or
a program that calls the driver directly (the remedies ``analyze`` names for it).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from nsysfrag.allocators import Policy
from nsysfrag.allocators.base import I64, RequestStream, SimResult
from nsysfrag.analysis import SpaceAnalysis
from nsysfrag.whatif.results import PolicyOutcome
from nsysfrag.whatif.summary import summarize

# Which kind of program recorded the input: what the baseline is and which policies compete.
PROGRAM_PYTORCH = "pytorch"  # a snapshot: the recorded allocator settings, PYTORCH_CUDA_ALLOC_CONF
PROGRAM_DRIVER = "driver"  # nsys: cudaMalloc called directly; the remedies analyze names
PROGRAM_SEGMENTS = "pytorch-segments"  # nsys: a caching allocator's segments; see a snapshot

# The figures a policy's outcome shares with analyze's summary of a space, by name.
_SHARED = tuple(
    sorted({f.name for f in fields(PolicyOutcome)} & {f.name for f in fields(SpaceAnalysis)})
)


@dataclass(frozen=True)
class Recorded:
    """One space of an nsys trace as the baseline: analyze's summary and its replay."""

    space: SpaceAnalysis
    result: SimResult  # the observed model's state after every event of the request stream

    @property
    def failures(self) -> int:
        """The allocations that failed in the driver (charged to this space)."""
        return len(self.space.ooms)

    def outcome(
        self, policy: Policy, stream: RequestStream, capacity: int, seconds: float
    ) -> PolicyOutcome:
        """The baseline's row: summarized as every policy's replay is, then analyze's own
        figures (the peak, the final state, the maxima, health) and failure times."""
        o = summarize(policy, self.result, stream, capacity, True, seconds)
        o = replace(o, **{name: getattr(self.space, name) for name in _SHARED})
        first = self.space.ooms[0].state.time_ns if self.space.ooms else None
        return replace(o, first_oom_time_ns=first)


def recorded_baseline(space: SpaceAnalysis, points: I64, stream: RequestStream) -> Recorded:
    """The observed run of ``space`` after each event of ``stream``; ``points[i]`` is the
    point of the space's state series that event ``i`` of the stream stands for."""
    tl = space.timeline
    pool = tl.pool
    if pool is None:  # the observed model always has pages; a model without them is no baseline
        raise ValueError("the observed model's run has no reserved memory")
    reserved = pool.reserved_bytes[points]
    active = pool.active_bytes[points]
    inside = np.maximum(reserved - active, 0)  # stranded + releasable: free in resident pages
    device_free = np.maximum(space.capacity_bytes - reserved, 0)
    # The series counts the device's free pages as one more free block; a policy counts only
    # its own free blocks.
    page = space.page_bytes or 1
    blocks = np.maximum(tl.free_blocks[points] - (device_free >= page), 0)
    failed_at = np.searchsorted(
        stream.time_ns, np.asarray([f.state.time_ns for f in space.ooms], dtype=np.int64),
        side="right",
    ) - 1  # fmt: skip
    result = SimResult(
        free_bytes=inside,
        largest_free_bytes=np.minimum(pool.largest_block_bytes[points], inside),
        free_blocks=np.where(inside > 0, np.maximum(blocks, 1), 0),
        reserved_bytes=reserved,
        allocated_bytes=pool.allocated_bytes[points],
        live_bytes=tl.live_bytes[points],
        releasable_bytes=np.minimum(pool.releasable_bytes[points], inside),
        # A call that failed before the stream's first event failed on the empty device.
        oom_event=np.maximum(failed_at, 0).astype(np.int64),
        oom_largest_free_bytes=np.asarray(
            [f.state.largest_free_bytes for f in space.ooms], dtype=np.int64
        ),
    )
    return Recorded(space, result)

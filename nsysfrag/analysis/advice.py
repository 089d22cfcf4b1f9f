"""What to change: advice lines drawn from a space's figures."""

from __future__ import annotations

from nsysfrag.analysis import SpaceAnalysis
from nsysfrag.analysis.metrics import Health, format_bytes

SMALL_BLOCK_BYTES = 1 << 20


def advise(s: SpaceAnalysis) -> list[str]:
    """Plain-language advice for one space, most important first."""
    lines: list[str] = []
    if s.span_mode:
        lines.append(
            "The recorded addresses span more than the device's memory (span mode): the observed"
            " layout over-states free space, so read the fragmentation figures as upper bounds."
        )
    if s.caching_allocator_suspected:
        lines.append(
            "Every allocation is a multiple of 2 MiB: this looks like a caching allocator's"
            " segments, so fragmentation inside its pool is invisible to nsys. For PyTorch, record"
            " with PYTORCH_NO_CUDA_MEMORY_CACHING=1 for a tensor-level trace, or take a memory"
            " snapshot (torch.cuda.memory._record_memory_history / _dump_snapshot)."
        )
    if s.counts.failed_allocations:
        lines.append(
            f"{s.counts.failed_allocations} allocation call(s) failed; at the peak the largest"
            f" free block was {format_bytes(s.peak.largest_free_bytes)} of"
            f" {format_bytes(s.peak.free_bytes)} free — requests larger than that fail even"
            " though the total would fit."
        )
    if s.hotspots and s.model != "observed":
        top = s.hotspots[0]
        if top.hole_creating_frees:
            lines.append(
                f"Blocks from '{top.site}' ({top.size_class}) are freed while neighbours in the"
                " same segment stay live, splitting the caching allocator's segments: try"
                " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or max_split_size_mb to keep"
                " large segments whole (`nsysfrag whatif` on this snapshot puts numbers on both)."
            )
    elif s.hotspots:
        top = s.hotspots[0]
        if top.hole_creating_frees and top.size_lo_bytes < SMALL_BLOCK_BYTES:
            lines.append(
                f"Many small blocks from '{top.site}' are freed out of order and leave holes:"
                " pool them (a per-size free list, cudaMallocAsync with a memory pool, or one"
                " arena allocated up-front) instead of cudaMalloc/cudaFree per use."
            )
        elif top.hole_creating_frees:
            pins = ", ".join(f"'{p}'" for p in top.pinned_by[:2]) or "long-lived blocks"
            lines.append(
                f"Blocks from '{top.site}' ({top.size_class}) leave holes when freed because"
                f" {pins} stay live around them: allocate long-lived buffers first (or from a"
                " separate pool) so short-lived ones stack on top and free in order."
            )
    if s.counts.unmatched_frees:
        lines.append(
            f"{s.counts.unmatched_frees} free(s) of blocks allocated before the capture started:"
            " start the capture earlier (or --capture-range) to see the whole layout."
        )
    if s.counts.overlaps:
        lines.append(
            f"{s.counts.overlaps} allocation(s) overlapped live blocks: the trace missed some"
            " frees (dropped events?), so the layout is approximate."
        )
    if s.health is Health.OK and not lines:
        lines.append("No action needed: fragmentation stayed within the healthy range.")
    return lines

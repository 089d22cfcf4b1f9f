"""The layout at the start of a snapshot's window, rebuilt from its end.

A snapshot's history is a ring buffer: it covers a window that ends at the snapshot, and the
snapshot's ``segments`` are the layout at that end. As PyTorch's own viewer does
(``MemoryViz.js``, ``process_alloc_data``/``simulate_memory``), the layout at the *start* of
the window is rebuilt by walking the entries backwards from the final state and undoing every
action.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nsysfrag.models.segments.layout import SegmentSet, _Seg
from nsysfrag.models.segments.rules import K_SMALL_BUFFER, expandable_page
from nsysfrag.models.snapshot_entries import HistoryEntry, Segment


@dataclass(slots=True)
class _Recreated:
    size: int | None  # known only for blocks still live at the snapshot
    requested: int
    pending: bool
    site: str


@dataclass
class WindowStart:
    """The layout at the first history entry, and what the backward walk learnt on the way."""

    segments: SegmentSet
    blocks: dict[int, _Recreated]  # address -> block live at the start of the window
    known_sizes: dict[int, int]  # history index of an alloc -> its block's size, where known
    conflicts: int  # entries the final state contradicts (e.g. an alloc of no live block)


def _final_segments(segments: Sequence[Segment]) -> tuple[SegmentSet, dict[int, _Recreated]]:
    segs = SegmentSet()
    blocks: dict[int, _Recreated] = {}
    for s in segments:
        if s.size <= 0 or segs.overlaps(s.address, s.address + s.size):
            continue
        page = expandable_page(s.small_pool, s.size) if s.expandable else 0
        seg = _Seg(s.address + s.size, s.stream, s.small_pool, s.expandable, page, s.address)
        segs.add(s.address, seg)
        for b in s.blocks:
            blocks[b.address] = _Recreated(b.size, b.requested_bytes, b.pending_free, b.site)
    return segs, blocks


def window_start(segments: Sequence[Segment], entries: Sequence[HistoryEntry]) -> WindowStart:
    """Undo the history ``entries`` (newest first) from the final ``segments`` of one device."""
    segs, blocks = _final_segments(segments)
    known: dict[int, int] = {}
    conflicts = 0
    for j in range(len(entries) - 1, -1, -1):
        e = entries[j]
        a = e.action
        if a == "alloc":
            if e.size == 0:
                continue
            b = blocks.pop(e.address, None)
            if b is None:
                conflicts += 1
            elif b.size is not None:
                known[j] = b.size
        elif a in ("free_completed", "free"):
            if e.address in blocks:
                conflicts += 1
            else:
                blocks[e.address] = _Recreated(None, e.size, a == "free_completed", e.site)
        elif a == "free_requested":
            b = blocks.get(e.address)
            if b is None:
                conflicts += 1
            else:
                b.pending = False
        elif a == "segment_alloc":
            seg = segs.seg.get(e.address)
            if seg is None or seg.end != e.address + e.size:
                conflicts += 1
            else:
                segs.remove(e.address)
        elif a == "segment_free":
            if segs.overlaps(e.address, e.address + e.size) or e.size == 0:
                conflicts += 1
            else:
                small = e.size == K_SMALL_BUFFER
                segs.add(e.address, _Seg(e.address + e.size, e.stream, small, False))
        elif a == "segment_map":
            if not segs.unmap_range(e.address, e.address + e.size):
                conflicts += 1
        elif a == "segment_unmap":
            if segs.overlaps(e.address, e.address + e.size) or e.size == 0:
                conflicts += 1
            else:
                segs.map_range(e.address, e.address + e.size, e.stream)
    return WindowStart(segs, blocks, known, conflicts)

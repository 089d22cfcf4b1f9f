"""The torch model's state at the start of a snapshot's window, for validation: the segments
and blocks :func:`nsysfrag.models.segments.window.window_start` rebuilds, as an
:class:`~nsysfrag.allocators.torch.kernel.InitialLayout`; the blocks live then become requests
of the replayed stream (already placed, so not events)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from nsysfrag.allocators import TorchConfig
from nsysfrag.allocators.torch.kernel import InitialLayout
from nsysfrag.allocators.torch.state import EXPANDABLE
from nsysfrag.models.segments.layout import SegmentSet
from nsysfrag.models.segments.rules import K_LARGE_BUFFER, K_SMALL_BUFFER, round_size, should_split
from nsysfrag.models.segments.window import WindowStart
from nsysfrag.whatif.streams import StreamBuilder, segment_stream, stream_index

ES_VA_VALIDATION = 1 << 46  # an expandable segment's virtual size in a validation replay


class _LiveBlock(Protocol):
    """A block live at the window's start, as segments_model.window_start rebuilds it."""

    size: int | None  # known for blocks still live at the snapshot
    requested: int


class _Columns:
    """The layout as it is built: one list per column of :class:`InitialLayout`, and the
    expandable segments' records."""

    def __init__(self) -> None:
        self.columns: dict[str, list[int]] = {
            name: [] for name in InitialLayout._fields if name != "expandables"
        }
        self.expandables: list[tuple[int, int, int, int]] = []

    def _add(self, table: str, **values: int) -> int:
        for name, value in values.items():
            self.columns[f"{table}_{name}"].append(value)
        return len(self.columns[f"{table}_address"]) - 1

    def segment(self, address: int, size: int, pool: int, expandable: int) -> int:
        return self._add("segment", address=address, size=size, pool=pool, expandable=expandable)

    def block(self, segment: int, address: int, size: int, state: int, request: int = -1) -> None:
        self._add("block", segment=segment, address=address, size=size, state=state,
                  request=request)  # fmt: skip

    def expandable(self, base: int, va: int, page: int, pool: int) -> int:
        self.expandables.append((base, va, page, pool))
        return len(self.expandables) - 1

    def build(self) -> InitialLayout:
        columns = {name: np.asarray(v, dtype=np.int64) for name, v in self.columns.items()}
        return InitialLayout(**columns, expandables=np.array(self.expandables, dtype=EXPANDABLE))


def layout_of(start: WindowStart, config: TorchConfig, names: dict[int, int], b: StreamBuilder
              ) -> tuple[InitialLayout, dict[int, int], int]:  # fmt: skip
    """The torch model's initial state from the rebuilt window start, the live blocks' request
    ids by address, and how many blocks conflicted with their neighbours (skipped)."""
    segs = start.segments
    recreated = sorted(start.blocks.items())
    addrs = [a for a, _ in recreated]
    out = _Columns()
    live: dict[int, int] = {}
    conflicts = 0
    expandable: dict[int, list[int]] = {}  # pool key -> segment starts
    for s_start in segs.starts:
        info = segs.seg[s_start]
        size = info.end - s_start
        small = info.small_pool
        if small is None:
            small = size % K_LARGE_BUFFER != 0 if info.expandable else size == K_SMALL_BUFFER
        pk = 2 * stream_index(names, info.stream) + int(small)
        if info.expandable:
            expandable.setdefault(pk, []).append(s_start)
            continue
        index = out.segment(s_start, size, pk, -1)
        conflicts += _fill(index, s_start, info.end, recreated, addrs, config, False,
                           bool(small), names, segs, b, out, live)  # fmt: skip
    for pk, starts in sorted(expandable.items()):
        page = K_SMALL_BUFFER if pk & 1 else K_LARGE_BUFFER
        base = min(starts)
        top = max(segs.seg[s].end for s in starts)
        va = -(-(top - base) // page) * page + ES_VA_VALIDATION
        e = out.expandable(base, va, page, pk)
        mapped = sum(segs.seg[s].end - s for s in starts)
        index = out.segment(base, mapped, pk, e)
        cursor = base
        for s in sorted(starts):
            if s > cursor:
                out.block(index, cursor, s - cursor, -1)
            conflicts += _fill(index, s, segs.seg[s].end, recreated, addrs, config, True,
                               bool(pk & 1), names, segs, b, out, live)  # fmt: skip
            cursor = segs.seg[s].end
        out.block(index, cursor, base + va - cursor, -1)
    return out.build(), live, conflicts


def _fill(
    index: int, lo: int, hi: int, recreated: Sequence[tuple[int, _LiveBlock]], addrs: list[int],
    config: TorchConfig, expandable: bool, small: bool, names: dict[int, int],
    segs: SegmentSet, b: StreamBuilder, out: _Columns, live: dict[int, int],
) -> int:  # fmt: skip
    """Tile ``[lo, hi)`` with its live blocks and the free blocks between them."""
    conflicts = 0
    cursor = lo
    k = bisect.bisect_left(addrs, lo)
    while k < len(addrs) and addrs[k] < hi:
        address, r = recreated[k]
        k += 1
        nxt = min(addrs[k], hi) if k < len(addrs) else hi
        if address < cursor:
            conflicts += 1
            continue
        size = r.size
        if size is None:
            size = round_size(max(r.requested, 1), config.roundup_power2_divisions)
            gap = nxt - (address + size)
            # A block PyTorch did not split keeps the tail.
            if gap > 0 and not should_split(gap, size, small, expandable, config.max_split_size):
                size += gap
        size = min(size, nxt - address)
        if size <= 0:
            conflicts += 1
            continue
        if address > cursor:
            out.block(index, cursor, address - cursor, 0)
        requested = r.requested or size
        rid = b.new_request(requested, stream_index(names, segment_stream(segs, address)))
        live[address] = rid
        out.block(index, address, size, 1, rid)
        cursor = address + size
    if cursor < hi:
        out.block(index, cursor, hi - cursor, 0)
    return conflicts

"""The torch model's state at the start of a snapshot's window, for validation: the segments
and blocks the compiled backward walk rebuilds (a
:class:`~nsysfrag.models.segments.compiled.WindowLayout`), as an
:class:`~nsysfrag.allocators.torch.kernel.InitialLayout`.

Each cudaMalloc segment is one segment of the model, tiled in address order by its live blocks
and the free blocks between them. The expandable segments' mapped ranges of one pool become
one expandable segment of the model: a virtual range from the lowest range on, the gaps between
the ranges unmapped, and unmapped room after the last. A live block whose size the final state
does not say (it was freed in the window) takes ``round_size`` of its request, or all of the
free space after it where PyTorch would not have split that off. The live blocks become the
replay's first requests (already placed, so not events), in the order the layout lists them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nsysfrag import interpreted, jit
from nsysfrag.allocators import TorchConfig
from nsysfrag.allocators.base import I64
from nsysfrag.allocators.torch.compiled_rules import round_size_kernel, should_split_kernel
from nsysfrag.allocators.torch.kernel import InitialLayout
from nsysfrag.allocators.torch.state import EXPANDABLE
from nsysfrag.models.segments.compiled import WindowLayout
from nsysfrag.models.segments.rules import K_LARGE_BUFFER, K_SMALL_BUFFER

ES_VA_VALIDATION = 1 << 46  # an expandable segment's virtual size in a validation replay
_UNMAPPED = -1  # InitialLayout.block_state of an unmapped range


@dataclass(frozen=True)
class StartLayout:
    """The model's initial state and the window's live blocks it holds."""

    layout: InitialLayout
    placed: I64  # index into the window's blocks of each placed block: request 0, 1, …
    conflicts: int  # live blocks that overlap the block before them or have no room


def start_layout(window: WindowLayout, config: TorchConfig, stream_number: I64) -> StartLayout:
    """The model's state from the rebuilt window start; ``stream_number`` numbers each of the
    window's segments' streams (pool key = 2 × stream number + small pool)."""
    start, end = window.segment_start, window.segment_end
    size = end - start
    expandable = window.segment_expandable
    guessed = np.where(expandable, size % K_LARGE_BUFFER != 0, size == K_SMALL_BUFFER)
    small = np.where(window.segment_small_pool >= 0, window.segment_small_pool == 1, guessed)
    pool = 2 * stream_number + small
    # cudaMalloc segments by address, then the expandable ones by pool and address.
    plain = np.flatnonzero(~expandable)
    ranges = np.flatnonzero(expandable)
    ranges = ranges[np.lexsort((start[ranges], pool[ranges]))]
    n_seg, n_blk = len(start), len(window.block_address)
    segments = np.zeros((4, n_seg), dtype=np.int64)  # address, size, pool, expandable index
    expandables = np.zeros((4, n_seg), dtype=np.int64)  # base, va, page, pool
    blocks = np.zeros((5, 2 * n_blk + 3 * n_seg + 1), dtype=np.int64)  # segment … request
    placed = np.zeros(n_blk, dtype=np.int64)
    divisions = np.asarray(config.roundup_power2_divisions, dtype=np.int64)
    counts = interpreted.chosen(_tile, n_seg + n_blk)(
        plain, ranges, start, end, pool, small, window.block_address, window.block_size,
        window.block_requested, divisions, config.max_split_size, ES_VA_VALIDATION, segments,
        expandables, blocks, placed,
    )  # fmt: skip
    n_segments, n_expandables, n_blocks, n_placed, conflicts = (int(c) for c in counts)
    table = np.zeros(n_expandables, dtype=EXPANDABLE)
    for k, name in enumerate(("base", "va", "page", "pool")):
        table[name] = expandables[k, :n_expandables]
    seg = segments[:, :n_segments].copy()
    blk = blocks[:, :n_blocks].copy()
    layout = InitialLayout(
        segment_address=seg[0], segment_size=seg[1], segment_pool=seg[2],
        segment_expandable=seg[3], block_segment=blk[0], block_address=blk[1],
        block_size=blk[2], block_state=blk[3], block_request=blk[4], expandables=table,
    )  # fmt: skip
    return StartLayout(layout, placed[:n_placed].copy(), conflicts)


@jit.njit(cache=True, nogil=True)
def _tile(  # type: ignore[no-untyped-def]
    plain, ranges, start, end, pool, small, address, size, requested, divisions, max_split,
    extra_va, segments, expandables, blocks, placed,
):  # fmt: skip
    """Fill the layout's tables; returns (segments, expandables, blocks, placed, conflicts)."""
    n = np.zeros(5, dtype=np.int64)  # the same counts, as they grow
    for i in plain:
        s = n[0]
        segments[0, s], segments[1, s], segments[2, s], segments[3, s] = (
            start[i], end[i] - start[i], pool[i], -1,
        )  # fmt: skip
        n[0] += 1
        _fill(s, start[i], end[i], False, small[i], address, size, requested, divisions,
              max_split, blocks, placed, n)  # fmt: skip
    g = 0
    while g < len(ranges):  # one expandable segment per pool: ranges[g:h]
        h = g
        mapped = 0
        while h < len(ranges) and pool[ranges[h]] == pool[ranges[g]]:
            mapped += end[ranges[h]] - start[ranges[h]]
            h += 1
        pk = pool[ranges[g]]
        page = K_SMALL_BUFFER if pk & 1 else K_LARGE_BUFFER
        base = start[ranges[g]]
        top = end[ranges[h - 1]]
        va = -(-(top - base) // page) * page + extra_va
        e = n[1]
        expandables[0, e], expandables[1, e], expandables[2, e], expandables[3, e] = (
            base, va, page, pk,
        )  # fmt: skip
        n[1] += 1
        s = n[0]
        segments[0, s], segments[1, s], segments[2, s], segments[3, s] = base, mapped, pk, e
        n[0] += 1
        cursor = base
        for k in range(g, h):
            i = ranges[k]
            if start[i] > cursor:
                _block(blocks, n, s, cursor, start[i] - cursor, _UNMAPPED, -1)
            _fill(s, start[i], end[i], True, small[i], address, size, requested, divisions,
                  max_split, blocks, placed, n)  # fmt: skip
            cursor = end[i]
        _block(blocks, n, s, cursor, base + va - cursor, _UNMAPPED, -1)
        g = h
    return n


@jit.njit(cache=True, nogil=True)
def _block(blocks, n, segment, address, nbytes, state, request):  # type: ignore[no-untyped-def]
    b = n[2]
    blocks[0, b], blocks[1, b], blocks[2, b], blocks[3, b], blocks[4, b] = (
        segment, address, nbytes, state, request,
    )  # fmt: skip
    n[2] += 1


@jit.njit(cache=True, nogil=True)
def _fill(  # type: ignore[no-untyped-def]
    segment, lo, hi, expandable, small, address, size, requested, divisions, max_split, blocks,
    placed, n,
):  # fmt: skip
    """Tile ``[lo, hi)`` with its live blocks and the free blocks between them."""
    cursor = lo
    k = np.searchsorted(address, lo)
    while k < len(address) and address[k] < hi:
        a = address[k]
        j = k
        k += 1
        nxt = min(address[k], hi) if k < len(address) else hi
        if a < cursor:
            n[4] += 1
            continue
        nbytes = size[j]
        if nbytes < 0:  # freed in the window: the final state does not say
            nbytes = round_size_kernel(max(requested[j], 1), divisions)
            gap = nxt - (a + nbytes)
            # A block PyTorch did not split keeps the tail.
            if gap > 0 and not should_split_kernel(gap, nbytes, small, expandable, max_split):
                nbytes += gap
        nbytes = min(nbytes, nxt - a)
        if nbytes <= 0:
            n[4] += 1
            continue
        if a > cursor:
            _block(blocks, n, segment, cursor, a - cursor, 0, -1)
        _block(blocks, n, segment, a, nbytes, 1, n[3])
        placed[n[3]] = j
        n[3] += 1
        cursor = a + nbytes
    if cursor < hi:
        _block(blocks, n, segment, cursor, hi - cursor, 0, -1)

"""The compiled pytorch-segments layout: segments, placed blocks and free gaps over slots.

Every address the replay can meet is known before it starts — a segment's or a block's start
is an entry's ``addr`` (or ``addr + size`` of a segment entry, where an unmap splits a range),
or the address of a final segment or block — so they are ranked once; a *slot* is that rank.
The layout ``L`` is one tuple of arrays, ``(keys, seg, sfen, blk, bfen, gap, share, tot)``,
unpacked once by each kernel (the helpers below take the arrays they use, as arguments: an
array taken out of a tuple costs a reference count update per call):

* ``keys``: the ranked addresses; ``seg`` / ``blk``: per-slot tables of the segments and of
  the live blocks starting there (columns ``S_*`` / ``B_*``);
* ``sfen`` / ``bfen``: Fenwick trees over the slots holding a segment / a placed block, to find
  the one at or below an address; placed blocks also form a list in address order;
* a free block is the gap between placed blocks inside one segment, *owned* by the block that
  ends where it starts or by the segment it opens: two leaves per slot of the max segment tree
  ``gap`` (leaf 2k: the gap opening segment k, 2k+1: the gap after block k) give the largest
  free block at the root, ``share`` each gap's releasable bytes; every change to the layout
  recomputes the one or two gaps it touches;
* ``tot``: running totals (``T_*``).

All of it O(log n) per operation. ``models.segments.kernel`` replays a trace on it.
"""

from __future__ import annotations

import numpy as np

from nsysfrag import jit
from nsysfrag.models.observed.kernel import _fenwick_add, _fenwick_kth, _fenwick_prefix
from nsysfrag.models.segments.rules import K_LARGE_BUFFER, K_SMALL_BUFFER

# Segment table columns (S_SMALL: 1 small pool, 0 large, -1 not recorded).
S_ON, S_END, S_STREAM, S_SMALL, S_EXP, S_PAGE, S_ORIGIN = range(7)
SEGMENT_COLUMNS = 7
# Live block table columns (B_PREV/B_NEXT: the placed blocks in address order, -1 at the ends;
# B_PENDING: freed by the program, waiting on other streams: active, no longer allocated).
B_LIVE, B_PLACED, B_SIZE, B_REQ, B_POINT, B_PREV, B_NEXT, B_PENDING = range(8)
BLOCK_COLUMNS = 8
# Running totals (T_ALLOCATED: the bytes of every placed live block, PyTorch's active bytes;
# T_PENDING: of them, the blocks whose free waits on other streams).
T_RESERVED, T_ALLOCATED, T_REQUESTED, T_FREE, T_NFREE, T_RELEASABLE, T_CONFLICTS = range(7)
T_NSEG, T_NPLACED, T_HEAD = 7, 8, 9  # T_HEAD: the lowest placed block, -1 if none
T_MAX_RESERVED, T_MAX_ALLOCATED, T_MAX_REQUESTED, T_PEAK_ALLOC, T_PEAK_REQ = 10, 11, 12, 13, 14
T_LOW, T_HIGH, T_POINTS, T_TOP_BIT, T_LEAVES = 15, 16, 17, 18, 19
T_PENDING = 20
TOTALS = 21


def new_layout(keys: np.ndarray) -> tuple[np.ndarray, ...]:
    """An empty layout over the ranked addresses ``keys``."""
    k = len(keys)
    leaves = 1
    while leaves < 2 * k:
        leaves *= 2
    top = 1
    while top * 2 <= k:
        top *= 2
    tot = np.zeros(TOTALS, dtype=np.int64)
    tot[T_LOW] = tot[T_HEAD] = -1
    tot[T_TOP_BIT] = top
    tot[T_LEAVES] = leaves
    return (
        keys,
        np.zeros((k, SEGMENT_COLUMNS), dtype=np.int64),
        np.zeros(k + 1, dtype=np.int64),
        np.zeros((k, BLOCK_COLUMNS), dtype=np.int64),
        np.zeros(k + 1, dtype=np.int64),
        np.zeros(2 * leaves, dtype=np.int64),
        np.zeros(leaves, dtype=np.int64),
        tot,
    )


@jit.njit(cache=True, nogil=True)
def expandable_page(small, mapped):  # type: ignore[no-untyped-def]
    """``rules.expandable_page`` with the pool as 1 (small), 0 (large) or -1 (not named)."""
    if small < 0:
        small = 1 if mapped % K_LARGE_BUFFER != 0 else 0
    return K_SMALL_BUFFER if small == 1 else K_LARGE_BUFFER


# ---------------------------------------------------------------- slots


@jit.njit(cache=True, nogil=True)
def last_at_most(fen, slot, top):  # type: ignore[no-untyped-def]
    """The highest set slot <= ``slot``, or -1."""
    if slot < 0:
        return -1
    c = _fenwick_prefix(fen, slot)
    return -1 if c == 0 else _fenwick_kth(fen, c, top)


@jit.njit(cache=True, nogil=True)
def first_at_least(fen, slot, top, count):  # type: ignore[no-untyped-def]
    """The lowest set slot >= ``slot``, or -1 (``count`` slots are set)."""
    c = _fenwick_prefix(fen, slot - 1) if slot > 0 else 0
    return -1 if c >= count else _fenwick_kth(fen, c + 1, top)


@jit.njit(cache=True, nogil=True)
def floor_slot(keys, x):  # type: ignore[no-untyped-def]
    """The slot of the highest key <= x, or -1."""
    return np.searchsorted(keys, x, side="right") - 1


# ---------------------------------------------------------------- segments


@jit.njit(cache=True, nogil=True)
def seg_find(keys, seg, sfen, tot, x):  # type: ignore[no-untyped-def]
    """The slot of the segment holding address ``x``, or -1."""
    p = last_at_most(sfen, floor_slot(keys, x), tot[T_TOP_BIT])
    if p >= 0 and x < seg[p, S_END]:
        return p
    return -1


@jit.njit(cache=True, nogil=True)
def seg_overlaps(keys, seg, sfen, tot, start, end):  # type: ignore[no-untyped-def]
    if seg_find(keys, seg, sfen, tot, start) >= 0:
        return True
    q = first_at_least(sfen, np.searchsorted(keys, start), tot[T_TOP_BIT], tot[T_NSEG])
    return q >= 0 and keys[q] < end


@jit.njit(cache=True, nogil=True)
def seg_add(seg, sfen, tot, slot, end, stream, small, exp, page, origin):  # type: ignore[no-untyped-def]
    seg[slot, S_ON] = 1
    seg[slot, S_END] = end
    seg[slot, S_STREAM] = stream
    seg[slot, S_SMALL] = small
    seg[slot, S_EXP] = exp
    seg[slot, S_PAGE] = page
    seg[slot, S_ORIGIN] = origin
    _fenwick_add(sfen, slot, 1)
    tot[T_NSEG] += 1


@jit.njit(cache=True, nogil=True)
def seg_add_whole(seg, sfen, tot, slot, start, end, stream):  # type: ignore[no-untyped-def]
    """A segment cudaMalloc'd whole (not expandable), [start, end): of the small pool when it has
    the small pool's buffer size."""
    small = 1 if end - start == K_SMALL_BUFFER else 0
    seg_add(seg, sfen, tot, slot, end, stream, small, 0, 0, start)


@jit.njit(cache=True, nogil=True)
def seg_remove(seg, sfen, tot, slot):  # type: ignore[no-untyped-def]
    seg[slot, S_ON] = 0
    _fenwick_add(sfen, slot, -1)
    tot[T_NSEG] -= 1


@jit.njit(cache=True, nogil=True)
def seg_map(keys, seg, sfen, tot, s_slot, e_slot, start, end, stream):  # type: ignore[no-untyped-def]
    """Map ``[start, end)``, joined with contiguous expandable ranges of the stream; return
    (the range's slot, the slot of the range joined on the right or -1)."""
    left = seg_find(keys, seg, sfen, tot, start - 1)
    joins = left >= 0 and seg[left, S_END] == start
    if joins and seg[left, S_EXP] == 1 and seg[left, S_STREAM] == stream:
        seg[left, S_END] = end
        base = left
    else:
        page = expandable_page(-1, end - start)
        seg_add(seg, sfen, tot, s_slot, end, stream, -1, 1, page, start)
        base = s_slot
    right = -1
    joins = seg[e_slot, S_ON] == 1 and keys[e_slot] == end
    if joins and seg[e_slot, S_EXP] == 1 and seg[e_slot, S_STREAM] == stream:
        right = e_slot
        seg[base, S_END] = seg[right, S_END]
        seg_remove(seg, sfen, tot, right)
    return base, right


@jit.njit(cache=True, nogil=True)
def seg_unmap(keys, seg, sfen, tot, e_slot, start, end):  # type: ignore[no-untyped-def]
    """Cut ``[start, end)`` out of the segment that holds it; return its slot, or -1."""
    base = seg_find(keys, seg, sfen, tot, start)
    if base < 0 or seg[base, S_END] < end:
        return -1
    old_end = seg[base, S_END]
    stream, small, exp = seg[base, S_STREAM], seg[base, S_SMALL], seg[base, S_EXP]
    page, origin = seg[base, S_PAGE], seg[base, S_ORIGIN]
    seg_remove(seg, sfen, tot, base)
    if keys[base] < start:
        seg_add(seg, sfen, tot, base, start, stream, small, exp, page, origin)
    if end < old_end:
        seg_add(seg, sfen, tot, e_slot, old_end, stream, small, exp, page, origin)
    return base


# ---------------------------------------------------------------- free gaps


@jit.njit(cache=True, nogil=True)
def releasable(keys, seg, s, start, end):  # type: ignore[no-untyped-def]
    """The bytes of free block [start, end) in segment ``s`` that could go back to the driver:
    all of a non-expandable segment, or the whole pages of an expandable range's grid."""
    if seg[s, S_EXP] == 0:
        return end - start if start == keys[s] and end == seg[s, S_END] else 0
    page = seg[s, S_PAGE]
    origin = seg[s, S_ORIGIN]
    first = -((origin - start) // page)
    last = (end - origin) // page
    return max(last - first, 0) * page


@jit.njit(cache=True, nogil=True)
def set_gap(gap, share, tot, leaf, length, r):  # type: ignore[no-untyped-def]
    """Gap ``leaf`` is now ``length`` bytes, ``r`` of them releasable."""
    i = tot[T_LEAVES] + leaf
    old = gap[i]
    tot[T_FREE] += length - old
    tot[T_NFREE] += (1 if length > 0 else 0) - (1 if old > 0 else 0)
    tot[T_RELEASABLE] += r - share[leaf]
    share[leaf] = r
    gap[i] = length
    # The max tree over the gaps, as the observed kernel keeps its own (whose helper takes its
    # own gap record): most updates stop low in the tree, where nothing above changes.
    i >>= 1
    while i >= 1:
        best = max(gap[2 * i], gap[2 * i + 1])
        if gap[i] == best:
            break
        gap[i] = best
        i >>= 1


@jit.njit(cache=True, nogil=True)
def refresh(keys, seg, blk, bfen, gap, share, tot, leaf, s):  # type: ignore[no-untyped-def]
    """Recompute the gap ``leaf`` owns, in segment ``s``; return its (start, end)."""
    k = leaf >> 1
    if leaf & 1 == 0:
        start = keys[k]
        nxt = first_at_least(bfen, k, tot[T_TOP_BIT], tot[T_NPLACED])
    else:
        start = keys[k] + blk[k, B_SIZE]
        nxt = blk[k, B_NEXT]
    end = seg[s, S_END]
    if nxt >= 0 and keys[nxt] < end:
        end = keys[nxt]
    length = end - start if end > start else 0
    r = releasable(keys, seg, s, start, end) if length > 0 else 0
    set_gap(gap, share, tot, leaf, length, r)
    return start, end


@jit.njit(cache=True, nogil=True)
def gap_owner(keys, s, p):  # type: ignore[no-untyped-def]
    """The leaf owning a gap of segment ``s`` whose closest placed block below is ``p``."""
    if p >= 0 and keys[p] >= keys[s]:
        return 2 * p + 1
    return 2 * s


@jit.njit(cache=True, nogil=True)
def placed_below(keys, bfen, tot, x):  # type: ignore[no-untyped-def]
    """The placed block starting closest at or below address ``x``, or -1."""
    return last_at_most(bfen, floor_slot(keys, x), tot[T_TOP_BIT])


@jit.njit(cache=True, nogil=True)
def free_span(keys, seg, blk, bfen, tot, s, x):  # type: ignore[no-untyped-def]
    """The free block holding address ``x`` of segment ``s`` (-1: none): (start, end), or
    (-1, -1)."""
    if s < 0:
        return -1, -1
    p = placed_below(keys, bfen, tot, x)
    start = keys[s]
    if p >= 0 and keys[p] >= keys[s]:
        if keys[p] + blk[p, B_SIZE] > x:
            return -1, -1
        start = keys[p] + blk[p, B_SIZE]
    end = seg[s, S_END]
    q = blk[p, B_NEXT] if p >= 0 else tot[T_HEAD]
    if q >= 0 and keys[q] < end:
        end = keys[q]
    return start, end


# ---------------------------------------------------------------- blocks


@jit.njit(cache=True, nogil=True)
def place(keys, seg, blk, bfen, gap, share, tot, k, s):  # type: ignore[no-untyped-def]
    """Carve live block k (its size already in ``blk``) out of the free gap of segment ``s``
    that holds it."""
    p = last_at_most(bfen, k - 1, tot[T_TOP_BIT])
    q = blk[p, B_NEXT] if p >= 0 else tot[T_HEAD]
    blk[k, B_PREV] = p
    blk[k, B_NEXT] = q
    if p >= 0:
        blk[p, B_NEXT] = k
    else:
        tot[T_HEAD] = k
    if q >= 0:
        blk[q, B_PREV] = k
    blk[k, B_PLACED] = 1
    _fenwick_add(bfen, k, 1)
    tot[T_NPLACED] += 1
    tot[T_ALLOCATED] += blk[k, B_SIZE]
    refresh(keys, seg, blk, bfen, gap, share, tot, gap_owner(keys, s, p), s)
    refresh(keys, seg, blk, bfen, gap, share, tot, 2 * k + 1, s)


@jit.njit(cache=True, nogil=True)
def drop(keys, seg, sfen, blk, bfen, gap, share, tot, k, at, removed, record):  # type: ignore[no-untyped-def]
    """Remove live block k (freed, or evicted, at point ``at``): return the free block it
    joined, (start, end), and the placed block right below it, or (-1, -1, -1) when it was not
    placed."""
    if record and blk[k, B_POINT] >= 0:
        removed[blk[k, B_POINT]] = at
    blk[k, B_LIVE] = 0
    tot[T_REQUESTED] -= blk[k, B_REQ]
    if blk[k, B_PENDING] == 1:  # its free completes (or the trace missed it)
        blk[k, B_PENDING] = 0
        tot[T_PENDING] -= blk[k, B_SIZE]
    if blk[k, B_PLACED] == 0:
        return -1, -1, -1
    p = blk[k, B_PREV]
    q = blk[k, B_NEXT]
    if p >= 0:
        blk[p, B_NEXT] = q
    else:
        tot[T_HEAD] = q
    if q >= 0:
        blk[q, B_PREV] = p
    blk[k, B_PLACED] = 0
    _fenwick_add(bfen, k, -1)
    tot[T_NPLACED] -= 1
    tot[T_ALLOCATED] -= blk[k, B_SIZE]
    set_gap(gap, share, tot, 2 * k + 1, 0, 0)
    s = seg_find(keys, seg, sfen, tot, keys[k])
    owner = gap_owner(keys, s, p)
    start, end = refresh(keys, seg, blk, bfen, gap, share, tot, owner, s)
    return start, end, owner >> 1 if owner & 1 == 1 else -1


@jit.njit(cache=True, nogil=True)
def evict(keys, seg, sfen, blk, bfen, gap, share, tot, start, end, scratch, at, removed, record):  # type: ignore[no-untyped-def]
    """Drop every placed block overlapping [start, end) (the trace missed their frees), at
    point ``at``; return how many there were."""
    n = placed_in(keys, blk, bfen, tot, start, end, scratch)
    for i in range(n):
        drop(keys, seg, sfen, blk, bfen, gap, share, tot, scratch[i], at, removed, record)
    return n


@jit.njit(cache=True, nogil=True)
def placed_in(keys, blk, bfen, tot, start, end, out):  # type: ignore[no-untyped-def]
    """The placed blocks overlapping [start, end), by address, into ``out``; how many."""
    n = 0
    k = placed_below(keys, bfen, tot, start)
    if k < 0:
        k = tot[T_HEAD]
    elif keys[k] + blk[k, B_SIZE] <= start:
        k = blk[k, B_NEXT]
    while k >= 0 and keys[k] < end:
        out[n] = k
        n += 1
        k = blk[k, B_NEXT]
    return n

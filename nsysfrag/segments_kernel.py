"""The pytorch-segments replay as compiled array code: the window's start, then the replay.

The same model as ``segments_model`` (its pure-Python reference, checked against this after
every event by the property tests), on the columns of ``snapshot_columns``. Per event O(log n):

* every address the replay can meet is known before it starts — a segment's or a block's start
  is an entry's ``addr`` (or ``addr + size`` of a segment entry, where an unmap splits a
  range), or the address of a final segment or block — so they are ranked once (*slots*);
* segments and placed blocks are flags over the slots with a Fenwick tree each, which finds the
  segment that holds an address and a block's neighbours by address;
* a free block is the gap between placed blocks inside one segment, so it is *owned* by the
  block that ends where it starts, or by the segment it opens: two leaves per slot (the gap
  opening the segment there, the gap after the block there) in a max segment tree give the
  largest free block, and every change to the layout recomputes the one or two gaps it touches.

PyTorch's allocator rules used here (``round_size``, the split rule, the 512 B / 1 MiB / 2 MiB /
20 MiB constants) are the numba twins of ``segments_model``'s.
"""

from __future__ import annotations

import numba
import numpy as np

from nsysfrag.replay import _fenwick_add, _fenwick_kth, _fenwick_prefix

# Actions (snapshot_columns.ACTION_CODES) and timeline codes (replay / segments_model).
A_ALLOC, A_FREE_REQUESTED, A_FREE_COMPLETED, A_FREE = 0, 1, 2, 3
A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_SEGMENT_MAP, A_SEGMENT_UNMAP, A_OOM = 4, 5, 6, 7, 8
E_ALLOCATED, E_FREED, E_UNMATCHED_FREE, E_ZERO_SIZE_ALLOC = 0, 1, 2, 3
E_SEGMENT_ALLOC, E_OOM = 4, 8
NO_BLOCK = -1

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20

# Columns of the per-slot tables.
S_ON, S_END, S_STREAM, S_SMALL, S_EXP, S_PAGE, S_ORIGIN = range(7)  # segments (S_SMALL -1: unknown)
B_LIVE, B_PLACED, B_SIZE, B_REQ, B_POINT, B_PREV, B_NEXT = range(7)  # live blocks
BLOCK_COLUMNS = 7  # B_PREV/B_NEXT: the placed blocks as a list in address order (-1 at the ends)
R_ON, R_SIZE, R_REQ, R_SITE = range(4)  # blocks live at the window's start (R_SIZE -1: unknown)
# The running totals, one int64 array.
T_RESERVED, T_ALLOCATED, T_REQUESTED, T_FREE, T_NFREE, T_RELEASABLE, T_CONFLICTS = range(7)
T_NSEG, T_NPLACED, T_HEAD = 7, 8, 9  # T_HEAD: the lowest placed block, -1 if none
T_MAX_RESERVED, T_MAX_ALLOCATED, T_MAX_REQUESTED, T_PEAK_ALLOC, T_PEAK_REQ = 10, 11, 12, 13, 14
T_LOW, T_HIGH, T_POINTS = 15, 16, 17
N_TOTALS = 18


# ---------------------------------------------------------------- allocator rules


@numba.njit(cache=True, nogil=True)
def bit_length(x):  # type: ignore[no-untyped-def]
    n = 0
    while x > 0:
        x >>= 1
        n += 1
    return n


@numba.njit(cache=True, nogil=True)
def round_size(size, divisions):  # type: ignore[no-untyped-def]
    """PyTorch's round_size; ``divisions[i]`` for sizes in [2**i MiB, 2**(i+1) MiB)."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    bits = bit_length(size)
    d = divisions[min(max(bits - 1 - 20, 0), 15)]
    if d > 1 and size > MIN_BLOCK * d:
        if size & (size - 1) == 0:
            return size
        p = np.int64(1) << (bits - 1)
        step = p // d
        if step == 0:
            return 2 * p
        floor = size & ~(step - 1)
        return size if floor == size else floor + step
    return (size + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


@numba.njit(cache=True, nogil=True)
def expandable_page(small, mapped):  # type: ignore[no-untyped-def]
    if small < 0:
        small = 1 if mapped % LARGE_BUFFER != 0 else 0
    return SMALL_BUFFER if small == 1 else LARGE_BUFFER


# ---------------------------------------------------------------- ordered sets over slots


@numba.njit(cache=True, nogil=True)
def _top_bit(k):  # type: ignore[no-untyped-def]
    top = 1
    while top * 2 <= k:
        top *= 2
    return top


@numba.njit(cache=True, nogil=True)
def _last_at_most(fen, slot, top):  # type: ignore[no-untyped-def]
    """The highest set slot <= ``slot``, or -1."""
    if slot < 0:
        return -1
    c = _fenwick_prefix(fen, slot)
    return -1 if c == 0 else _fenwick_kth(fen, c, top)


@numba.njit(cache=True, nogil=True)
def _first_at_least(fen, slot, top, count):  # type: ignore[no-untyped-def]
    """The lowest set slot >= ``slot``, or -1 (``count`` slots are set)."""
    c = _fenwick_prefix(fen, slot - 1) if slot > 0 else 0
    return -1 if c >= count else _fenwick_kth(fen, c + 1, top)


@numba.njit(cache=True, nogil=True)
def _floor_slot(keys, x):  # type: ignore[no-untyped-def]
    """The slot of the highest key <= x, or -1."""
    return np.searchsorted(keys, x, side="right") - 1


# ---------------------------------------------------------------- segments


@numba.njit(cache=True, nogil=True)
def seg_find(keys, seg, sfen, top, x):  # type: ignore[no-untyped-def]
    """The slot of the segment holding address ``x``, or -1."""
    p = _last_at_most(sfen, _floor_slot(keys, x), top)
    if p >= 0 and x < seg[p, S_END]:
        return p
    return -1


@numba.njit(cache=True, nogil=True)
def seg_overlaps(keys, seg, sfen, top, tot, start, end):  # type: ignore[no-untyped-def]
    if seg_find(keys, seg, sfen, top, start) >= 0:
        return True
    q = _first_at_least(sfen, np.searchsorted(keys, start), top, tot[T_NSEG])
    return q >= 0 and keys[q] < end


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
def seg_remove(seg, sfen, tot, slot):  # type: ignore[no-untyped-def]
    seg[slot, S_ON] = 0
    _fenwick_add(sfen, slot, -1)
    tot[T_NSEG] -= 1


@numba.njit(cache=True, nogil=True)
def seg_map(keys, seg, sfen, top, tot, s_slot, e_slot, start, end, stream):  # type: ignore[no-untyped-def]
    """Map ``[start, end)``, joined with contiguous expandable ranges of the stream; return
    (the range's slot, the slot of the range joined on the right or -1)."""
    left = seg_find(keys, seg, sfen, top, start - 1)
    if left >= 0 and seg[left, S_END] == start and seg[left, S_EXP] == 1 and seg[left, S_STREAM] == stream:
        seg[left, S_END] = end
        base = left
    else:
        seg_add(seg, sfen, tot, s_slot, end, stream, -1, 1, expandable_page(-1, end - start), start)
        base = s_slot
    right = -1
    if seg[e_slot, S_ON] == 1 and keys[e_slot] == end and seg[e_slot, S_EXP] == 1 and seg[e_slot, S_STREAM] == stream:
        right = e_slot
        seg[base, S_END] = seg[right, S_END]
        seg_remove(seg, sfen, tot, right)
    return base, right


@numba.njit(cache=True, nogil=True)
def seg_unmap(keys, seg, sfen, top, tot, e_slot, start, end):  # type: ignore[no-untyped-def]
    """Cut ``[start, end)`` out of the segment that holds it; return its slot, or -1."""
    base = seg_find(keys, seg, sfen, top, start)
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


@numba.njit(cache=True, nogil=True)
def _releasable(keys, seg, s, start, end):  # type: ignore[no-untyped-def]
    """The share of free block [start, end) in segment ``s`` that could go back to the driver."""
    if seg[s, S_EXP] == 0:
        return end - start if start == keys[s] and end == seg[s, S_END] else 0
    page = seg[s, S_PAGE]
    origin = seg[s, S_ORIGIN]
    first = -((origin - start) // page)
    last = (end - origin) // page
    return max(last - first, 0) * page


@numba.njit(cache=True, nogil=True)
def _set_gap(gap, share, leaves, tot, leaf, length, r):  # type: ignore[no-untyped-def]
    i = leaves + leaf
    old = gap[i]
    tot[T_FREE] += length - old
    tot[T_NFREE] += (1 if length > 0 else 0) - (1 if old > 0 else 0)
    tot[T_RELEASABLE] += r - share[leaf]
    share[leaf] = r
    gap[i] = length
    i >>= 1
    while i >= 1:
        best = max(gap[2 * i], gap[2 * i + 1])
        if gap[i] == best:
            break
        gap[i] = best
        i >>= 1


@numba.njit(cache=True, nogil=True)
def _refresh(keys, seg, blk, bfen, top, tot, gap, share, leaves, leaf, s):  # type: ignore[no-untyped-def]
    """Recompute the gap ``leaf`` owns (2k: the one opening segment k, 2k+1: the one after
    block k), in segment ``s``; return its (start, end)."""
    k = leaf >> 1
    if leaf & 1 == 0:
        start = keys[k]
        nxt = _first_at_least(bfen, k, top, tot[T_NPLACED])
    else:
        start = keys[k] + blk[k, B_SIZE]
        nxt = blk[k, B_NEXT]
    end = seg[s, S_END]
    if nxt >= 0 and keys[nxt] < end:
        end = keys[nxt]
    length = end - start if end > start else 0
    r = _releasable(keys, seg, s, start, end) if length > 0 else 0
    _set_gap(gap, share, leaves, tot, leaf, length, r)
    return start, end


@numba.njit(cache=True, nogil=True)
def _gap_owner(keys, s, p):  # type: ignore[no-untyped-def]
    """The leaf owning a gap of segment ``s`` whose closest placed block below is ``p``."""
    if p >= 0 and keys[p] >= keys[s]:
        return 2 * p + 1
    return 2 * s


@numba.njit(cache=True, nogil=True)
def free_span(keys, seg, blk, bfen, top, tot, s, x):  # type: ignore[no-untyped-def]
    """The free block holding address ``x`` of segment ``s`` (-1: none): (start, end), or
    (-1, -1); and the placed block closest below ``x``."""
    if s < 0:
        return -1, -1, -1
    p = _last_at_most(bfen, _floor_slot(keys, x), top)
    start = keys[s]
    if p >= 0 and keys[p] >= keys[s]:
        if keys[p] + blk[p, B_SIZE] > x:
            return -1, -1, p
        start = keys[p] + blk[p, B_SIZE]
    end = seg[s, S_END]
    q = blk[p, B_NEXT] if p >= 0 else tot[T_HEAD]
    if q >= 0 and keys[q] < end:
        end = keys[q]
    return start, end, p


# ---------------------------------------------------------------- the window's start


@numba.njit(cache=True, nogil=True)
def rebuild_window(  # type: ignore[no-untyped-def]
    keys, act, slot_a, slot_e, addr, size, stream, site,
    f_slot, f_end, f_stream, f_small, f_exp, b_seg, b_slot, b_size, b_req, b_site,
    seg, sfen, rb, known, tot,
):  # fmt: skip
    """Lay out the final segments and their blocks, then undo the trace newest first: ``seg``
    and ``rb`` end as the layout at the window's start, ``known`` holds the size of each alloc's
    block where the final state records it. Returns the number of blocks live at the start."""
    top = _top_bit(len(keys))
    accepted = np.zeros(len(f_slot), dtype=np.bool_)
    for i in range(len(f_slot)):
        start = keys[f_slot[i]]
        if f_end[i] <= start or seg_overlaps(keys, seg, sfen, top, tot, start, f_end[i]):
            continue
        page = expandable_page(f_small[i], f_end[i] - start) if f_exp[i] == 1 else 0
        seg_add(seg, sfen, tot, f_slot[i], f_end[i], f_stream[i], f_small[i], f_exp[i], page, start)
        accepted[i] = True
    for i in range(len(b_slot)):
        if accepted[b_seg[i]]:
            k = b_slot[i]
            rb[k, R_ON], rb[k, R_SIZE], rb[k, R_REQ], rb[k, R_SITE] = 1, b_size[i], b_req[i], b_site[i]
    for j in range(len(act) - 1, -1, -1):
        a = act[j]
        k = slot_a[j]
        x = addr[j]
        if a == A_ALLOC:
            if size[j] == 0:
                continue
            if rb[k, R_ON] == 0:
                tot[T_CONFLICTS] += 1
            else:
                rb[k, R_ON] = 0
                if rb[k, R_SIZE] >= 0:
                    known[j] = rb[k, R_SIZE]
        elif a == A_FREE_COMPLETED or a == A_FREE:
            if rb[k, R_ON] == 1:
                tot[T_CONFLICTS] += 1
            else:
                rb[k, R_ON], rb[k, R_SIZE], rb[k, R_REQ], rb[k, R_SITE] = 1, -1, size[j], site[j]
        elif a == A_FREE_REQUESTED:
            if rb[k, R_ON] == 0:
                tot[T_CONFLICTS] += 1
        elif a == A_SEGMENT_ALLOC:
            if seg[k, S_ON] == 0 or keys[k] != x or seg[k, S_END] != x + size[j]:
                tot[T_CONFLICTS] += 1
            else:
                seg_remove(seg, sfen, tot, k)
        elif a == A_SEGMENT_FREE:
            if size[j] == 0 or seg_overlaps(keys, seg, sfen, top, tot, x, x + size[j]):
                tot[T_CONFLICTS] += 1
            else:
                small = 1 if size[j] == SMALL_BUFFER else 0
                seg_add(seg, sfen, tot, k, x + size[j], stream[j], small, 0, 0, x)
        elif a == A_SEGMENT_MAP:
            if seg_unmap(keys, seg, sfen, top, tot, slot_e[j], x, x + size[j]) < 0:
                tot[T_CONFLICTS] += 1
        elif a == A_SEGMENT_UNMAP:
            if size[j] == 0 or seg_overlaps(keys, seg, sfen, top, tot, x, x + size[j]):
                tot[T_CONFLICTS] += 1
            else:
                seg_map(keys, seg, sfen, top, tot, k, slot_e[j], x, x + size[j], stream[j])
    return int(rb[:, R_ON].sum())


# ---------------------------------------------------------------- the replay


@numba.njit(cache=True, nogil=True)
def _place(keys, seg, blk, bfen, top, tot, gap, share, leaves, k, s):  # type: ignore[no-untyped-def]
    """Carve block k (its size already in ``blk``) out of the free gap of segment ``s`` that
    holds it."""
    p = _last_at_most(bfen, k - 1, top)
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
    _refresh(keys, seg, blk, bfen, top, tot, gap, share, leaves, _gap_owner(keys, s, p), s)
    _refresh(keys, seg, blk, bfen, top, tot, gap, share, leaves, 2 * k + 1, s)


@numba.njit(cache=True, nogil=True)
def _drop(keys, seg, sfen, blk, bfen, top, tot, gap, share, leaves, k, at, removed, record):  # type: ignore[no-untyped-def]
    """Remove live block k (freed, or evicted at point ``at``); return the free block it joined,
    (start, end), and the placed block below it (its owner), or (-1, -1, -1) if it was not
    placed."""
    if record and blk[k, B_POINT] >= 0:
        removed[blk[k, B_POINT]] = at
    blk[k, B_LIVE] = 0
    tot[T_REQUESTED] -= blk[k, B_REQ]
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
    _set_gap(gap, share, leaves, tot, 2 * k + 1, 0, 0)
    s = seg_find(keys, seg, sfen, top, keys[k])
    owner = _gap_owner(keys, s, p)
    start, end = _refresh(keys, seg, blk, bfen, top, tot, gap, share, leaves, owner, s)
    return start, end, owner >> 1 if owner & 1 == 1 else -1


@numba.njit(cache=True, nogil=True)
def _placed_in(keys, blk, bfen, top, tot, start, end, out):  # type: ignore[no-untyped-def]
    """Placed blocks overlapping [start, end), by address, into ``out``; return how many."""
    n = 0
    k = _last_at_most(bfen, _floor_slot(keys, start), top)
    if k < 0:
        k = tot[T_HEAD]
    elif keys[k] + blk[k, B_SIZE] <= start:
        k = blk[k, B_NEXT]
    while k >= 0 and keys[k] < end:
        out[n] = k
        n += 1
        k = blk[k, B_NEXT]
    return n


@numba.njit(cache=True, nogil=True)
def _block_size(keys, seg, s, x, fs, fe, requested, divisions, max_split, expandable_all):  # type: ignore[no-untyped-def]
    """The block PyTorch carved from free block [fs, fe) (none: fe <= fs) of segment ``s``:
    rounded, or the whole free block when it would not split."""
    rounded = round_size(requested, divisions)
    if fe <= fs:
        return rounded
    available = fe - x
    if available <= rounded:
        return rounded
    remaining = available - rounded
    small = seg[s, S_SMALL]
    if small < 0:
        small = 1 if seg[s, S_EXP] == 0 and seg[s, S_END] - keys[s] == SMALL_BUFFER else 0
    if small == 1 or seg[s, S_EXP] == 1 or expandable_all:
        split = remaining >= MIN_BLOCK
    else:
        split = (max_split < 0 or rounded < max_split) and remaining > SMALL_SIZE
    return rounded if split else available


@numba.njit(cache=True, nogil=True)
def replay_forward(  # type: ignore[no-untyped-def]
    keys, act, slot_a, slot_e, addr, size, stream, site, known, fold, t_ns, t0, has_points,
    divisions, max_split, expandable_all, seg, sfen, rb, blk, bfen, gap, share, tot,
    stop, record, out_i64, out_flags, out_event, ooms, progress,
):  # fmt: skip
    """Replay the trace from the window's start (``seg``, ``rb``), one point per modelled
    event into the output columns (when ``record``); stop before the entry after point
    ``stop`` when ``stop`` >= 0. ``out_i64`` rows: time, address, bytes, free, largest, free
    blocks, live, reserved, allocated, releasable, site, freed, left, right, removed_at;
    ``out_flags`` rows: overlap, out of order, hole; ``ooms`` rows: entry, largest, free,
    reserved, allocated. Returns the number of blocks live at the start."""
    nk = len(keys)
    top = _top_bit(nk)
    leaves = len(gap) // 2
    removed = out_i64[14]
    scratch = np.empty(nk + 1, dtype=np.int64)
    # The layout at the window's start.
    for k in range(nk):
        if seg[k, S_ON] == 1:
            tot[T_RESERVED] += seg[k, S_END] - keys[k]
            _refresh(keys, seg, blk, bfen, top, tot, gap, share, leaves, 2 * k, k)
            if tot[T_LOW] < 0:
                tot[T_LOW] = keys[k]
            tot[T_HIGH] = max(tot[T_HIGH], seg[k, S_END])
    initial_reserved = tot[T_RESERVED]
    initial = np.flatnonzero(rb[:, R_ON] == 1)
    for i in range(len(initial)):
        k = initial[i]
        x = keys[k]
        sz = rb[k, R_SIZE]
        if sz < 0:
            sz = round_size(max(rb[k, R_REQ], 1), divisions)
        s = seg_find(keys, seg, sfen, top, x)
        if s >= 0:
            limit = seg[s, S_END]
            if i + 1 < len(initial):
                limit = min(limit, max(keys[initial[i + 1]], x))
            sz = max(min(sz, limit - x), 0)
        fs, fe, _ = free_span(keys, seg, blk, bfen, top, tot, s, x)
        placed = s >= 0 and sz > 0 and fe > fs and fe >= x + sz
        if not placed:
            tot[T_CONFLICTS] += 1
        blk[k, B_LIVE], blk[k, B_PLACED], blk[k, B_SIZE], blk[k, B_REQ], blk[k, B_POINT] = 1, 0, sz, rb[k, R_REQ], -1
        tot[T_REQUESTED] += rb[k, R_REQ]
        if placed:
            _place(keys, seg, blk, bfen, top, tot, gap, share, leaves, k, s)
    _track(tot)
    stack_point = np.empty(len(initial) + len(act) + 1, dtype=np.int64)
    stack_slot = np.empty(len(initial) + len(act) + 1, dtype=np.int64)
    depth = 0
    for i in range(len(initial)):
        k = initial[i]
        blk[k, B_POINT] = tot[T_POINTS]
        nbytes = blk[k, B_REQ] if blk[k, B_REQ] != 0 else blk[k, B_SIZE]
        _emit(tot, gap, record, out_i64, out_flags, out_event, t0, E_ALLOCATED, keys[k], nbytes, rb[k, R_SITE], False, False, False, NO_BLOCK, NO_BLOCK, NO_BLOCK)
        stack_point[depth], stack_slot[depth] = blk[k, B_POINT], k
        depth += 1
    if not has_points:  # a state-only snapshot with no live block: its segments, once
        for k in range(nk):
            if seg[k, S_ON] == 1:
                _emit(tot, gap, record, out_i64, out_flags, out_event, t0, E_SEGMENT_ALLOC, keys[k], seg[k, S_END] - keys[k], 0, False, False, False, NO_BLOCK, NO_BLOCK, NO_BLOCK)
    n_oom = 0
    for j in range(len(act)):
        if stop >= 0 and tot[T_POINTS] > stop:
            break
        if j & 0xFFFF == 0:
            progress[0] = j
        a = act[j]
        k = slot_a[j]
        x = addr[j]
        t = t_ns[j]
        if a == A_ALLOC:
            if size[j] == 0:
                _emit(tot, gap, record, out_i64, out_flags, out_event, t, E_ZERO_SIZE_ALLOC, x, 0, 0, False, False, False, NO_BLOCK, NO_BLOCK, NO_BLOCK)
            else:
                point = tot[T_POINTS]
                overlap = False
                if blk[k, B_LIVE] == 1:  # a second alloc of a live block: its free went missing
                    overlap = True
                    _drop(keys, seg, sfen, blk, bfen, top, tot, gap, share, leaves, k, point, removed, record)
                sz = known[j]
                s = seg_find(keys, seg, sfen, top, x)
                placed = False
                if s >= 0:
                    fs, fe, _ = free_span(keys, seg, blk, bfen, top, tot, s, x)
                    if sz < 0:
                        sz = _block_size(keys, seg, s, x, fs, fe, size[j], divisions, max_split, expandable_all)
                    sz = max(min(sz, seg[s, S_END] - x), 1)
                    if fe <= fs or fe < x + sz:
                        overlap = True
                        n = _placed_in(keys, blk, bfen, top, tot, x, x + sz, scratch)
                        for q in range(n):
                            _drop(keys, seg, sfen, blk, bfen, top, tot, gap, share, leaves, scratch[q], point, removed, record)
                        fs, fe, _ = free_span(keys, seg, blk, bfen, top, tot, s, x)
                    placed = fe > fs and fe >= x + sz
                if sz < 0:
                    sz = round_size(size[j], divisions)
                if not placed:
                    overlap = True
                    tot[T_CONFLICTS] += 1
                blk[k, B_LIVE], blk[k, B_PLACED], blk[k, B_SIZE], blk[k, B_REQ], blk[k, B_POINT] = 1, 0, sz, size[j], point
                tot[T_REQUESTED] += size[j]
                if placed:
                    _place(keys, seg, blk, bfen, top, tot, gap, share, leaves, k, s)
                stack_point[depth], stack_slot[depth] = point, k
                depth += 1
                _emit(tot, gap, record, out_i64, out_flags, out_event, t, E_ALLOCATED, x, size[j], site[j], overlap, False, False, NO_BLOCK, NO_BLOCK, NO_BLOCK)
        elif a == A_FREE_COMPLETED or a == A_FREE:
            if blk[k, B_LIVE] == 0:
                tot[T_CONFLICTS] += 1
                _emit(tot, gap, record, out_i64, out_flags, out_event, t, E_UNMATCHED_FREE, x, size[j], 0, False, False, False, NO_BLOCK, NO_BLOCK, NO_BLOCK)
            else:
                point = tot[T_POINTS]
                while depth > 0:
                    q = stack_slot[depth - 1]
                    if blk[q, B_LIVE] == 1 and blk[q, B_POINT] == stack_point[depth - 1]:
                        break
                    depth -= 1
                freed = blk[k, B_POINT]
                in_order = depth > 0 and stack_slot[depth - 1] == k and stack_point[depth - 1] == freed
                gs, ge, p = _drop(keys, seg, sfen, blk, bfen, top, tot, gap, share, leaves, k, point, removed, record)
                hole = False
                left = NO_BLOCK
                right = NO_BLOCK
                if p >= 0 and ge > gs:
                    # A hole: live blocks of the same segment bound the free block on both sides
                    # (p, whose end opens it, and whatever live block starts where it ends).
                    base = seg_find(keys, seg, sfen, top, gs)
                    if ge < seg[base, S_END]:
                        r = np.searchsorted(keys, ge)
                        if r < nk and keys[r] == ge and blk[r, B_LIVE] == 1:
                            hole = True
                            left = blk[p, B_POINT]
                            right = blk[r, B_POINT]
                _emit(tot, gap, record, out_i64, out_flags, out_event, t, E_FREED, x, size[j], 0, False, not in_order, hole, freed, left, right)
        elif a == A_SEGMENT_ALLOC or a == A_SEGMENT_MAP:
            end = x + size[j]
            if size[j] > 0 and not seg_overlaps(keys, seg, sfen, top, tot, x, end):
                tot[T_RESERVED] += size[j]
                if a == A_SEGMENT_ALLOC:
                    seg_add(seg, sfen, tot, k, end, stream[j], 1 if size[j] == SMALL_BUFFER else 0, 0, 0, x)
                    _refresh(keys, seg, blk, bfen, top, tot, gap, share, leaves, 2 * k, k)
                else:
                    base, right = seg_map(keys, seg, sfen, top, tot, k, slot_e[j], x, end, stream[j])
                    if right >= 0:
                        _set_gap(gap, share, leaves, tot, 2 * right, 0, 0)
                    p = _last_at_most(bfen, _floor_slot(keys, x), top)
                    _refresh(keys, seg, blk, bfen, top, tot, gap, share, leaves, _gap_owner(keys, base, p), base)
                tot[T_LOW] = x if tot[T_LOW] < 0 else min(tot[T_LOW], x)
                tot[T_HIGH] = max(tot[T_HIGH], end)
            else:
                tot[T_CONFLICTS] += 1
            if not fold[j]:
                _emit(tot, gap, record, out_i64, out_flags, out_event, t, a, x, size[j], 0, False, False, False, NO_BLOCK, NO_BLOCK, NO_BLOCK)
        elif a == A_SEGMENT_FREE or a == A_SEGMENT_UNMAP:
            end = x + size[j]
            n = _placed_in(keys, blk, bfen, top, tot, x, end, scratch)
            for q in range(n):  # the trace missed their frees
                tot[T_CONFLICTS] += 1
                _drop(keys, seg, sfen, blk, bfen, top, tot, gap, share, leaves, scratch[q], tot[T_POINTS], removed, record)
            base = seg_find(keys, seg, sfen, top, x)
            if base < 0 or seg[base, S_END] < end:
                tot[T_CONFLICTS] += 1
            else:
                old_end = seg[base, S_END]
                if a == A_SEGMENT_FREE and (keys[base] != x or old_end != end):
                    tot[T_CONFLICTS] += 1
                owner = _gap_owner(keys, base, _last_at_most(bfen, _floor_slot(keys, x), top))
                seg_unmap(keys, seg, sfen, top, tot, slot_e[j], x, end)
                if keys[base] == x:
                    _set_gap(gap, share, leaves, tot, 2 * base, 0, 0)
                else:
                    _refresh(keys, seg, blk, bfen, top, tot, gap, share, leaves, owner, base)
                if end < old_end:
                    _refresh(keys, seg, blk, bfen, top, tot, gap, share, leaves, 2 * slot_e[j], slot_e[j])
                tot[T_RESERVED] -= size[j]
            _emit(tot, gap, record, out_i64, out_flags, out_event, t, a, x, size[j], 0, False, False, False, NO_BLOCK, NO_BLOCK, NO_BLOCK)
        elif a == A_OOM:
            if record:
                ooms[0, n_oom], ooms[1, n_oom], ooms[2, n_oom] = j, gap[1], tot[T_FREE]
                ooms[3, n_oom], ooms[4, n_oom] = tot[T_RESERVED], tot[T_ALLOCATED]
            n_oom += 1
            _emit(tot, gap, record, out_i64, out_flags, out_event, t, E_OOM, 0, size[j], 0, False, False, False, NO_BLOCK, NO_BLOCK, NO_BLOCK)
        # free_requested: the block stays allocated until free_completed; snapshot: nothing
        _track(tot)
    progress[0] = len(act)
    return len(initial), initial_reserved


@numba.njit(cache=True, nogil=True)
def _track(tot):  # type: ignore[no-untyped-def]
    tot[T_MAX_RESERVED] = max(tot[T_MAX_RESERVED], tot[T_RESERVED])
    tot[T_MAX_REQUESTED] = max(tot[T_MAX_REQUESTED], tot[T_REQUESTED])
    if tot[T_ALLOCATED] > tot[T_MAX_ALLOCATED]:
        tot[T_MAX_ALLOCATED] = tot[T_ALLOCATED]
        tot[T_PEAK_ALLOC] = tot[T_ALLOCATED]
        tot[T_PEAK_REQ] = tot[T_REQUESTED]


@numba.njit(cache=True, nogil=True)
def _emit(tot, gap, record, out_i64, out_flags, out_event, t, code, x, nbytes, site, overlap, out_of_order, hole, freed, left, right):  # type: ignore[no-untyped-def]
    i = tot[T_POINTS]
    tot[T_POINTS] = i + 1
    if not record:
        return
    out_event[i] = code
    out_i64[0, i] = t
    out_i64[1, i] = x
    out_i64[2, i] = nbytes
    out_i64[3, i] = tot[T_FREE]
    out_i64[4, i] = gap[1]
    out_i64[5, i] = tot[T_NFREE]
    out_i64[6, i] = tot[T_REQUESTED]
    out_i64[7, i] = tot[T_RESERVED]
    out_i64[8, i] = tot[T_ALLOCATED]
    out_i64[9, i] = tot[T_RELEASABLE]
    out_i64[10, i] = site
    out_i64[11, i] = freed
    out_i64[12, i] = left
    out_i64[13, i] = right
    out_flags[0, i] = overlap
    out_flags[1, i] = out_of_order
    out_flags[2, i] = hole

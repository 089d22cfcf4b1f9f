"""The pytorch-segments replay as compiled array code: the window's start, then the replay.

The same model as ``replay`` (its pure-Python reference, checked against this after every event
by the property tests), on a device's events and the layout of ``kernel_layout``; O(log n) per
event, without the GIL. PyTorch's allocator rules are ``rules``' own functions, compiled.
"""

from __future__ import annotations

import numpy as np

from nsysfrag import jit
from nsysfrag.models.segments.kernel_layout import (
    B_LIVE,
    B_PENDING,
    B_PLACED,
    B_POINT,
    B_REQ,
    B_SIZE,
    S_END,
    S_EXP,
    S_ON,
    S_SMALL,
    T_ALLOCATED,
    T_CONFLICTS,
    T_FREE,
    T_HIGH,
    T_LOW,
    T_MAX_ALLOCATED,
    T_MAX_REQUESTED,
    T_MAX_RESERVED,
    T_NFREE,
    T_PEAK_ALLOC,
    T_PEAK_REQ,
    T_PENDING,
    T_POINTS,
    T_RELEASABLE,
    T_REQUESTED,
    T_RESERVED,
    drop,
    evict,
    expandable_page,
    free_span,
    gap_owner,
    place,
    placed_below,
    refresh,
    seg_add,
    seg_add_whole,
    seg_find,
    seg_map,
    seg_overlaps,
    seg_remove,
    seg_unmap,
    set_gap,
)
from nsysfrag.models.segments.rules import K_SMALL_BUFFER, division_interval, rounded, split_rule

# Actions (columns.ACTION_CODES) and timeline codes (models.segments.replay: the
# segment codes and OOM are the action codes).
A_ALLOC, A_FREE_REQUESTED, A_FREE_COMPLETED, A_FREE = 0, 1, 2, 3
A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_SEGMENT_MAP, A_SEGMENT_UNMAP, A_OOM = 4, 5, 6, 7, 8
E_ALLOCATED, E_FREED, E_UNMATCHED_FREE, E_ZERO_SIZE_ALLOC = 0, 1, 2, 3
E_WINDOW_START = 9
NO_BLOCK = -1
# Blocks live at the window's start, per slot (R_SIZE -1: not recorded). R_KNOWN: a size an
# earlier run found for such a block (-1: none); R_FOUND: the size this run found (-1: none);
# R_PENDING: its free was requested and waits on other streams.
R_ON, R_SIZE, R_REQ, R_SITE, R_KNOWN, R_FOUND, R_PENDING = range(7)
START_COLUMNS = 7
# Output rows (O_ALLOCATED: the active bytes, every placed live block; O_PENDING: of them, the
# pending frees: PyTorch's allocated bytes are the difference).
O_TIME, O_ADDRESS, O_BYTES, O_FREE, O_LARGEST, O_BLOCKS, O_LIVE, O_RESERVED = range(8)
O_ALLOCATED, O_RELEASABLE, O_SITE, O_FREED, O_LEFT, O_RIGHT, O_REMOVED, O_PENDING = range(8, 16)
OUTPUT_ROWS = 16
F_OVERLAP, F_OUT_OF_ORDER, F_HOLE = range(3)


# PyTorch's rules (``rules``), compiled from the very functions the Python replay and the
# what-if ``torch`` kernel use (as ``allocators.torch.compiled_rules`` compiles them; not
# imported from there: ``analyze`` does not load the what-if models).
_interval = jit.njit(cache=True)(division_interval)
_rounded = jit.njit(cache=True)(rounded)
_split = jit.njit(cache=True)(split_rule)
UNLIMITED_SPLIT = 1 << 62  # max_split_size when none is set


@jit.njit(cache=True, nogil=True)
def round_size(size, divisions):  # type: ignore[no-untyped-def]
    """PyTorch's round_size; ``divisions[i]`` for sizes in [2**i MiB, 2**(i+1) MiB)."""
    return _rounded(size, divisions[_interval(max(size, 1))])


@jit.njit(cache=True, nogil=True)
def block_size(keys, seg, s, x, fs, fe, requested, divisions, max_split, expandable_all):  # type: ignore[no-untyped-def]
    """The block PyTorch carved from free block [fs, fe) (none: fe <= fs) of segment ``s``:
    rounded, or the whole free block when it would not split."""
    size = round_size(requested, divisions)
    if fe <= fs or fe - x <= size:
        return size
    available = fe - x
    small = seg[s, S_SMALL]
    if small < 0:
        small = 1 if seg[s, S_EXP] == 0 and seg[s, S_END] - keys[s] == K_SMALL_BUFFER else 0
    expandable = seg[s, S_EXP] == 1 or expandable_all != 0
    limit = max_split if max_split >= 0 else UNLIMITED_SPLIT
    return size if _split(available - size, size, small == 1, expandable, limit) else available


# ---------------------------------------------------------------- the window's start


@jit.njit(cache=True, nogil=True)
def rebuild_window(L, entries, final_segments, final_blocks, rb, known):  # type: ignore[no-untyped-def]
    """Lay out the final segments (``final_segments`` rows: slot, end, stream, small pool,
    expandable) and their blocks (``final_blocks`` rows: segment row, slot, size, requested,
    site), then undo the trace newest first (``entries``: action, slot, end slot, address,
    size, stream, site): ``L``'s segments and ``rb`` end as the layout at the window's start,
    ``known`` holds each alloc's block size where the final state records it."""
    keys, seg, sfen, _, _, _, _, tot = L
    act, slot_a, slot_e, addr, size, stream, site = entries
    f_slot, f_end, f_stream, f_small, f_exp = final_segments
    accepted = np.zeros(len(f_slot), dtype=np.bool_)
    for i in range(len(f_slot)):
        start = keys[f_slot[i]]
        if f_end[i] <= start or seg_overlaps(keys, seg, sfen, tot, start, f_end[i]):
            continue
        page = expandable_page(f_small[i], f_end[i] - start) if f_exp[i] == 1 else 0
        seg_add(seg, sfen, tot, f_slot[i], f_end[i], f_stream[i], f_small[i], f_exp[i], page, start)
        accepted[i] = True
    b_seg, b_slot, b_size, b_req, b_site, b_pending = final_blocks
    for i in range(len(b_slot)):
        if accepted[b_seg[i]]:
            k = b_slot[i]
            rb[k, R_ON], rb[k, R_SIZE], rb[k, R_REQ], rb[k, R_SITE] = (
                1,
                b_size[i],
                b_req[i],
                b_site[i],
            )
            rb[k, R_PENDING] = b_pending[i]
    for j in range(len(act) - 1, -1, -1):
        a = act[j]
        k = slot_a[j]
        x = addr[j]
        end = x + size[j]
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
                # free_completed ends a requested free: pending before it
                rb[k, R_PENDING] = 1 if a == A_FREE_COMPLETED else 0
        elif a == A_FREE_REQUESTED:
            if rb[k, R_ON] == 0:
                tot[T_CONFLICTS] += 1
            else:
                rb[k, R_PENDING] = 0
        elif a == A_SEGMENT_ALLOC:
            if seg[k, S_ON] == 0 or seg[k, S_END] != end:
                tot[T_CONFLICTS] += 1
            else:
                seg_remove(seg, sfen, tot, k)
        elif a == A_SEGMENT_FREE or a == A_SEGMENT_UNMAP:
            if size[j] == 0 or seg_overlaps(keys, seg, sfen, tot, x, end):
                tot[T_CONFLICTS] += 1
            elif a == A_SEGMENT_FREE:
                seg_add_whole(seg, sfen, tot, k, x, end, stream[j])
            else:
                seg_map(keys, seg, sfen, tot, k, slot_e[j], x, end, stream[j])
        elif a == A_SEGMENT_MAP and seg_unmap(keys, seg, sfen, tot, slot_e[j], x, end) < 0:
            tot[T_CONFLICTS] += 1
    return int(rb[:, R_ON].sum())


# ---------------------------------------------------------------- the replay


@jit.njit(cache=True, nogil=True)
def replay_forward(L, entries, known, fold, t_ns, rb, rules, out, ooms, progress):  # type: ignore[no-untyped-def]
    """Replay the trace from the window's start (``L``, ``rb``), one timeline point per
    modelled event into ``out``. ``rules``: t0, has_points (the entries make points),
    max_split (-1: none), expandable, stop point (-1: none), record, then the 16 division
    counts. ``out``: the int64 rows
    (``O_*``), the flag rows (``F_*``), the event codes. With a stop point the replay ends
    before the entry after that point and records nothing. Returns (blocks live at the start,
    reserved bytes at the start)."""
    keys, seg, sfen, blk, bfen, gap, share, tot = L
    act, slot_a, slot_e, addr, size, stream, site = entries
    t0, has_points, max_split, expandable_all = rules[0], rules[1] != 0, rules[2], rules[3]
    stop, record = rules[4], rules[5] != 0
    divisions = rules[6:]
    out_i64, out_flags, out_event = out
    removed = out_i64[O_REMOVED]
    scratch = np.empty(len(keys) + 1, dtype=np.int64)
    for k in range(len(keys)):  # the layout at the window's start: every segment empty
        if seg[k, S_ON] == 1:
            tot[T_RESERVED] += seg[k, S_END] - keys[k]
            refresh(keys, seg, blk, bfen, gap, share, tot, 2 * k, k)
            tot[T_LOW] = keys[k] if tot[T_LOW] < 0 else tot[T_LOW]
            tot[T_HIGH] = max(tot[T_HIGH], seg[k, S_END])
    initial_reserved = tot[T_RESERVED]
    initial = np.flatnonzero(rb[:, R_ON] == 1)
    for i in range(len(initial)):  # then the blocks live at the start, by address
        k = initial[i]
        x = keys[k]
        sz = rb[k, R_SIZE]
        s = seg_find(keys, seg, sfen, tot, x)
        if s >= 0:
            limit = seg[s, S_END]
            if i + 1 < len(initial):
                limit = min(limit, max(keys[initial[i + 1]], x))
            if sz < 0:  # carved from the free range up to the next such block
                sz = rb[k, R_KNOWN]
                if sz < 0:
                    req = max(rb[k, R_REQ], 1)
                    sz = block_size(keys, seg, s, x, x, limit, req, divisions, max_split, expandable_all)  # fmt: skip
            if sz > limit - x:  # it would reach into the next block or past its segment's
                tot[T_CONFLICTS] += 1  # end: the trace does not fit its segments
            sz = max(min(sz, limit - x), 0)
        elif sz < 0:
            sz = round_size(max(rb[k, R_REQ], 1), divisions)
        fs, fe = free_span(keys, seg, blk, bfen, tot, s, x)
        placed = s >= 0 and sz > 0 and fe > fs and fe >= x + sz
        tot[T_CONFLICTS] += 0 if placed else 1
        blk[k, B_LIVE], blk[k, B_PLACED], blk[k, B_SIZE] = 1, 0, sz
        blk[k, B_REQ], blk[k, B_POINT], blk[k, B_PENDING] = rb[k, R_REQ], -1, 0
        tot[T_REQUESTED] += rb[k, R_REQ]
        if placed:
            place(keys, seg, blk, bfen, gap, share, tot, k, s)
            if rb[k, R_PENDING] == 1:
                blk[k, B_PENDING] = 1
                tot[T_PENDING] += sz
    track(tot)
    stack_point = np.empty(len(initial) + len(act) + 1, dtype=np.int64)
    stack_slot = np.empty(len(initial) + len(act) + 1, dtype=np.int64)
    depth = 0
    for i in range(len(initial)):
        k = initial[i]
        blk[k, B_POINT] = tot[T_POINTS]
        nbytes = blk[k, B_REQ] if blk[k, B_REQ] != 0 else blk[k, B_SIZE]
        emit(gap, tot, out_i64, out_flags, out_event, record, t0, E_ALLOCATED, keys[k], nbytes, rb[k, R_SITE])  # fmt: skip
        stack_point[depth], stack_slot[depth] = blk[k, B_POINT], k
        depth += 1
    if len(initial) == 0:  # the start of the window is a moment all the same: its segments, ...
        opened = 0
        for k in range(len(keys)):
            if seg[k, S_ON] == 1:
                emit(gap, tot, out_i64, out_flags, out_event, record, t0, A_SEGMENT_ALLOC, keys[k], seg[k, S_END] - keys[k], 0)  # fmt: skip
                opened += 1
        if opened == 0 and has_points:  # ... or the empty device
            emit(gap, tot, out_i64, out_flags, out_event, record, t0, E_WINDOW_START, 0, 0, 0)
    n_start = tot[T_POINTS]  # the start's points: one moment, the layout at the window's start
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
        end = x + size[j]
        if a == A_ALLOC and size[j] == 0:
            emit(gap, tot, out_i64, out_flags, out_event, record, t, E_ZERO_SIZE_ALLOC, x, 0, 0)
        elif a == A_ALLOC:
            point = tot[T_POINTS]
            overlap = False
            if blk[k, B_LIVE] == 1:  # a second alloc of a live block: its free went missing
                overlap = True
                drop(keys, seg, sfen, blk, bfen, gap, share, tot, k, point, removed, record)
            sz = known[j]
            s = seg_find(keys, seg, sfen, tot, x)
            placed = False
            if s >= 0:
                fs, fe = free_span(keys, seg, blk, bfen, tot, s, x)
                if fe > fs and fs < x:  # PyTorch carves from a free block's low end, so ...
                    p = placed_below(keys, bfen, tot, x)
                    if (
                        p >= 0
                        and keys[p] + blk[p, B_SIZE] == fs
                        and blk[p, B_POINT] < len(initial)
                        and rb[p, R_SIZE] < 0
                    ):  # ... the inferred block live at the start below the gap reached x
                        rb[p, R_FOUND] = x - keys[p]
                if sz < 0:
                    sz = block_size(
                        keys, seg, s, x, fs, fe, size[j], divisions, max_split, expandable_all
                    )
                if sz > seg[s, S_END] - x:  # the block would cross its segment's end: the
                    tot[T_CONFLICTS] += 1  # trace does not fit (e.g. its segment_map came later)
                sz = max(min(sz, seg[s, S_END] - x), 1)
                if fe <= fs or fe < x + sz:  # the trace missed the frees of what is there
                    overlap = True
                    evict(keys, seg, sfen, blk, bfen, gap, share, tot, x, x + sz, scratch, point, removed, record)  # fmt: skip
                    fs, fe = free_span(keys, seg, blk, bfen, tot, s, x)
                placed = fe > fs and fe >= x + sz
            if sz < 0:
                sz = round_size(size[j], divisions)
            if not placed:  # outside every segment: counted, live, but not in the layout
                overlap = True
                tot[T_CONFLICTS] += 1
            blk[k, B_LIVE], blk[k, B_PLACED], blk[k, B_SIZE] = 1, 0, sz
            blk[k, B_REQ], blk[k, B_POINT], blk[k, B_PENDING] = size[j], point, 0
            tot[T_REQUESTED] += size[j]
            if placed:
                place(keys, seg, blk, bfen, gap, share, tot, k, s)
            stack_point[depth], stack_slot[depth] = point, k
            depth += 1
            emit(gap, tot, out_i64, out_flags, out_event, record, t, E_ALLOCATED, x, size[j], site[j], overlap)  # fmt: skip
        elif (a == A_FREE_COMPLETED or a == A_FREE) and blk[k, B_LIVE] == 0:
            tot[T_CONFLICTS] += 1
            emit(
                gap, tot, out_i64, out_flags, out_event, record, t, E_UNMATCHED_FREE, x, size[j], 0
            )
        elif a == A_FREE_COMPLETED or a == A_FREE:
            while depth > 0:  # the newest allocation still live
                q = stack_slot[depth - 1]
                if blk[q, B_LIVE] == 1 and blk[q, B_POINT] == stack_point[depth - 1]:
                    break
                depth -= 1
            freed = blk[k, B_POINT]
            in_order = depth > 0 and stack_slot[depth - 1] == k and stack_point[depth - 1] == freed
            gs, ge, p = drop(
                keys, seg, sfen, blk, bfen, gap, share, tot, k, tot[T_POINTS], removed, record
            )
            left = right = NO_BLOCK
            if p >= 0 and ge < seg[seg_find(keys, seg, sfen, tot, gs), S_END]:
                # A hole: live blocks of the segment bound the free block on both sides, p (its
                # start) and whatever live block starts at its end.
                r = np.searchsorted(keys, ge)
                if r < len(keys) and keys[r] == ge and blk[r, B_LIVE] == 1:
                    left, right = blk[p, B_POINT], blk[r, B_POINT]
            hole = left != NO_BLOCK
            ooo = not in_order
            emit(gap, tot, out_i64, out_flags, out_event, record, t, E_FREED, x, size[j], 0, False, ooo, hole, freed, left, right)  # fmt: skip
        elif a == A_SEGMENT_ALLOC or a == A_SEGMENT_MAP:
            if size[j] > 0 and not seg_overlaps(keys, seg, sfen, tot, x, end):
                tot[T_RESERVED] += size[j]
                if a == A_SEGMENT_ALLOC:
                    seg_add_whole(seg, sfen, tot, k, x, end, stream[j])
                    refresh(keys, seg, blk, bfen, gap, share, tot, 2 * k, k)
                else:
                    base, joined = seg_map(keys, seg, sfen, tot, k, slot_e[j], x, end, stream[j])
                    if joined >= 0:
                        set_gap(gap, share, tot, 2 * joined, 0, 0)
                    refresh(
                        keys,
                        seg,
                        blk,
                        bfen,
                        gap,
                        share,
                        tot,
                        gap_owner(keys, base, placed_below(keys, bfen, tot, x)),
                        base,
                    )
                tot[T_LOW] = x if tot[T_LOW] < 0 else min(tot[T_LOW], x)
                tot[T_HIGH] = max(tot[T_HIGH], end)
            else:
                tot[T_CONFLICTS] += 1
            if not fold[j]:
                emit(gap, tot, out_i64, out_flags, out_event, record, t, a, x, size[j], 0)
        elif a == A_SEGMENT_FREE or a == A_SEGMENT_UNMAP:
            at = tot[T_POINTS]  # blocks still there: the trace missed their frees
            tot[T_CONFLICTS] += evict(keys, seg, sfen, blk, bfen, gap, share, tot, x, end, scratch, at, removed, record)  # fmt: skip
            release(keys, seg, sfen, blk, bfen, gap, share, tot, a, slot_e[j], x, end)
            emit(gap, tot, out_i64, out_flags, out_event, record, t, a, x, size[j], 0)
        elif a == A_OOM:
            if record:
                ooms[0, n_oom], ooms[1, n_oom], ooms[2, n_oom] = j, gap[1], tot[T_FREE]
                ooms[3, n_oom], ooms[4, n_oom] = tot[T_RESERVED], tot[T_ALLOCATED] - tot[T_PENDING]
            n_oom += 1
            emit(gap, tot, out_i64, out_flags, out_event, record, t, A_OOM, 0, size[j], 0)
        elif a == A_FREE_REQUESTED and blk[k, B_LIVE] == 1 and blk[k, B_PLACED] == 1 and blk[k, B_PENDING] == 0:  # fmt: skip
            # PyTorch's allocated bytes drop now; the block stays active (not reusable) until
            # free_completed. No point of its own: the next point shows it.
            blk[k, B_PENDING] = 1
            tot[T_PENDING] += blk[k, B_SIZE]
        # snapshot: nothing
        track(tot)
    progress[0] = len(act)
    if record and tot[T_POINTS] > 0:  # the end of the trace is the last point's state: a
        last = tot[T_POINTS] - 1  # free_requested after it counts; where no entry made a point,
        first = 0 if last < n_start else last  # the last is the start, all of its points
        for p in range(first, last + 1):
            out_i64[O_PENDING, p] = tot[T_PENDING]
    return len(initial), initial_reserved


@jit.njit(cache=True, nogil=True)
def release(keys, seg, sfen, blk, bfen, gap, share, tot, a, e_slot, x, end):  # type: ignore[no-untyped-def]
    """segment_free / segment_unmap of [x, end), whose blocks are gone already."""
    base = seg_find(keys, seg, sfen, tot, x)
    if base < 0 or seg[base, S_END] < end:
        tot[T_CONFLICTS] += 1
        return
    old_end = seg[base, S_END]
    if a == A_SEGMENT_FREE and (keys[base] != x or old_end != end):
        tot[T_CONFLICTS] += 1
    owner = gap_owner(keys, base, placed_below(keys, bfen, tot, x))
    seg_unmap(keys, seg, sfen, tot, e_slot, x, end)
    if keys[base] == x:
        set_gap(gap, share, tot, 2 * base, 0, 0)  # the segment that started there is gone
    else:
        refresh(keys, seg, blk, bfen, gap, share, tot, owner, base)
    if end < old_end:
        refresh(keys, seg, blk, bfen, gap, share, tot, 2 * e_slot, e_slot)
    tot[T_RESERVED] -= end - x


@jit.njit(cache=True, nogil=True)
def track(tot):  # type: ignore[no-untyped-def]
    tot[T_MAX_RESERVED] = max(tot[T_MAX_RESERVED], tot[T_RESERVED])
    tot[T_MAX_REQUESTED] = max(tot[T_MAX_REQUESTED], tot[T_REQUESTED])
    if tot[T_ALLOCATED] > tot[T_MAX_ALLOCATED]:
        tot[T_MAX_ALLOCATED] = tot[T_ALLOCATED]
        tot[T_PEAK_ALLOC] = tot[T_ALLOCATED]
        tot[T_PEAK_REQ] = tot[T_REQUESTED]


@jit.njit(cache=True, nogil=True)
def emit(  # type: ignore[no-untyped-def]
    gap, tot, out_i64, out_flags, out_event, record, t, code, x, nbytes, site, overlap=False,
    out_of_order=False, hole=False, freed=NO_BLOCK, left=NO_BLOCK, right=NO_BLOCK,
):  # fmt: skip
    """A timeline point: the event and the state after it."""
    i = tot[T_POINTS]
    tot[T_POINTS] = i + 1
    if not record:
        return
    out_event[i] = code
    out_i64[O_TIME, i] = t
    out_i64[O_ADDRESS, i] = x
    out_i64[O_BYTES, i] = nbytes
    out_i64[O_FREE, i] = tot[T_FREE]
    out_i64[O_LARGEST, i] = gap[1]
    out_i64[O_BLOCKS, i] = tot[T_NFREE]
    out_i64[O_LIVE, i] = tot[T_REQUESTED]
    out_i64[O_RESERVED, i] = tot[T_RESERVED]
    out_i64[O_ALLOCATED, i] = tot[T_ALLOCATED]
    out_i64[O_PENDING, i] = tot[T_PENDING]
    out_i64[O_RELEASABLE, i] = tot[T_RELEASABLE]
    out_i64[O_SITE, i] = site
    out_i64[O_FREED, i] = freed
    out_i64[O_LEFT, i] = left
    out_i64[O_RIGHT, i] = right
    out_flags[F_OVERLAP, i] = overlap
    out_flags[F_OUT_OF_ORDER, i] = out_of_order
    out_flags[F_HOLE, i] = hole

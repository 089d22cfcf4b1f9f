"""The observed replay on the device's pages (docs/metrics.md): the hot path.

One compiled pass over a space's events keeps the live blocks and records the state after every
event. The CUDA driver maps free physical pages wherever they lie, so what matters is which
pages the live footprints touch: a page of P bytes is *resident* while a footprint overlaps it,
and the free bytes inside resident pages are *stranded*. Per-event cost is O(log n):

* live blocks are indexed by *slot*, the rank of their start address among all allocation
  addresses in the trace (known before the replay starts); they form a doubly linked list in
  address order, and a set of live slots as bits (``slot_set``) finds where a new block joins
  that list.
  Blocks from a memory pool form a second list (their pages are the pool's, counted apart);
* live byte ranges never overlap (an allocation over one evicts it), so footprint ends rise with
  start addresses, and every figure is a sum over pairs of neighbours: the pages two neighbours
  share, the footprint bytes they share, and the free runs in the resident pages between them.
  Each neighbour pair is a leaf (the gap after a block, or before the first one), and a max
  segment tree over the leaves gives the largest free run at its root;
* the "most recently allocated live block" (for in-order frees) is a stack whose dead entries
  are popped lazily.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from nsysfrag import interpreted, jit
from nsysfrag.events import I64, BoolArray
from nsysfrag.models.observed.slot_set import level_starts, set_add, set_below, set_remove
from nsysfrag.models.series import (
    ALLOCATED,
    FREED,
    NO_BLOCK,
    UNMATCHED_FREE,
    ZERO_SIZE_ALLOC,
    IndexArray,
)


PAGE_LAYER = 0  # blocks whose pages the driver maps for them
POOL_LAYER = 1  # blocks carved from a memory pool, whose pages the pool holds


class KernelEvents(NamedTuple):
    """One space's replayable events in order; offsets are relative to a page boundary at or
    below the lowest allocation (so page k of the space starts at offset k * page_bytes)."""

    is_free: BoolArray
    offset: I64  # address - base page; meaningless for frees below it (their slot is NO_BLOCK)
    bytes: I64
    footprint: I64  # ceil(bytes / G) * G for allocations, 0 for frees
    slot: I64  # rank of the address among allocation start addresses, or NO_BLOCK
    slot_offset: I64  # start offset of each slot, ascending
    in_pool: BoolArray  # allocations from a memory pool
    page_bytes: int  # P
    capacity_bytes: int  # C
    # Per event: the memory pools' latest recorded sizes and their releasable bytes, summed
    # over the space's pools (empty arrays: no pool).
    pool_reserved: I64
    pool_releasable: I64


class KernelOutput(NamedTuple):
    """The state after every event (arrays of the event count) and what each event did."""

    event: npt.NDArray[np.int8]  # ALLOCATED, FREED, UNMATCHED_FREE or ZERO_SIZE_ALLOC
    overlap: BoolArray
    reserved_bytes: I64  # resident pages x P, plus the pools' sizes
    allocated_bytes: I64  # the bytes of the union of live footprints
    largest_block_bytes: I64  # L: the largest free run inside resident pages
    free_bytes: I64  # F = D + S + R
    largest_free_bytes: I64  # L_eff = max(L, D + R)
    free_blocks: IndexArray  # free runs inside resident pages, + 1 when D >= P
    live_bytes: I64
    peak_footprint: I64  # [footprint, live bytes] at the first maximum of footprint bytes
    out_of_order: BoolArray  # frees only
    hole: BoolArray  # frees that left bytes stranded in pages that stay resident
    hole_bytes: I64  # those bytes
    freed_alloc: IndexArray  # event index of the freed block's allocation, or NO_BLOCK
    pin_left: IndexArray  # the allocation whose pages keep the hole's left part, or NO_BLOCK
    pin_right: IndexArray
    removed_at: IndexArray  # for allocations: the event that freed or evicted the block, or NO_BLOCK


# The replay's state, in a few plain arrays (compiled code then keeps no reference counts in its
# loop). Per slot, ``slots[s, column]``:
PREV, NEXT, END, BYTES, ALLOC, LAYER, LIVE, EPREV, ENEXT = range(9)
# Per leaf (0: before the first page block; s + 1: after slot s), ``leaves[leaf, column]``: the
# free runs inside resident pages, the page bytes and footprint bytes the two neighbours share,
# and (the list of every block) the footprint bytes a block shares with the next.
RUNS, SHARED_PAGES, SHARED_FOOT, EVERY_SHARED = range(4)
# The totals, ``totals[column]``: those of the leaves, the page blocks' pages, every live
# footprint whole, and the first live slot of each list (-1: none).
T_RUNS, T_SHARED_PAGES, T_SHARED_FOOT, T_EVERY_SHARED, T_PAGES, T_FOOT = range(6)
FIRST = 6  # FIRST + PAGE_LAYER, FIRST + POOL_LAYER, FIRST + EVERY
EVERY = 2  # the list of every block (both layers): a third row of live slots


def replay(events: KernelEvents) -> KernelOutput:
    """Replay ``events`` and return the state after each one."""
    out = _allocate_outputs(len(events.is_free))
    interpreted.chosen(_replay_kernel, len(events.is_free))(events, out)
    return out


def empty_events(page_bytes: int = 2 << 20, capacity_bytes: int = 1) -> KernelEvents:
    """A stream of no events (to load the compiled kernel)."""
    empty = np.zeros(0, dtype=np.int64)
    no = empty.astype(np.bool_)
    return KernelEvents(no, empty, empty, empty, empty, empty, no, page_bytes, capacity_bytes,
                        empty, empty)  # fmt: skip


def warm_up() -> None:
    """Load the compiled kernel (from numba's cache) now, e.g. on a thread while a trace is
    read, rather than on the first replay (of more events than are replayed interpreted)."""
    _replay_kernel(empty_events(), _allocate_outputs(0))


def _allocate_outputs(n: int) -> KernelOutput:
    # Event indices fit 32 bits for any trace up to two billion events: half the memory.
    index = np.int32 if n < 2**31 - 1 else np.int64
    return KernelOutput(
        event=np.zeros(n, dtype=np.int8),
        overlap=np.zeros(n, dtype=np.bool_),
        reserved_bytes=np.zeros(n, dtype=np.int64),
        allocated_bytes=np.zeros(n, dtype=np.int64),
        largest_block_bytes=np.zeros(n, dtype=np.int64),
        free_bytes=np.zeros(n, dtype=np.int64),
        largest_free_bytes=np.zeros(n, dtype=np.int64),
        free_blocks=np.zeros(n, dtype=index),
        live_bytes=np.zeros(n, dtype=np.int64),
        peak_footprint=np.zeros(2, dtype=np.int64),
        out_of_order=np.zeros(n, dtype=np.bool_),
        hole=np.zeros(n, dtype=np.bool_),
        # Zeros cost no memory until written: only hole-creating frees write theirs.
        hole_bytes=np.zeros(n, dtype=np.int64),
        freed_alloc=np.full(n, NO_BLOCK, dtype=index),
        pin_left=np.full(n, NO_BLOCK, dtype=index),
        pin_right=np.full(n, NO_BLOCK, dtype=index),
        removed_at=np.full(n, NO_BLOCK, dtype=index),
    )


@jit.njit(cache=True, nogil=True)
def _fenwick_add(tree: np.ndarray, i: int, delta: int) -> None:
    i += 1
    while i < len(tree):
        tree[i] += delta
        i += i & -i


@jit.njit(cache=True, nogil=True)
def _fenwick_prefix(tree: np.ndarray, i: int) -> int:
    """Number of live slots in [0, i]."""
    total = 0
    i += 1
    while i > 0:
        total += tree[i]
        i -= i & -i
    return total


@jit.njit(cache=True, nogil=True)
def _fenwick_kth(tree: np.ndarray, k: int, top_bit: int) -> int:
    """The slot of the k-th live block (1-based k, counted by address)."""
    pos = 0
    bit = top_bit
    while bit > 0:
        nxt = pos + bit
        if nxt < len(tree) and tree[nxt] < k:
            pos = nxt
            k -= tree[nxt]
        bit >>= 1
    return pos  # 0-based slot = (1-based index pos + 1) - 1


@jit.njit(cache=True, nogil=True)
def _page_floor(x, page):  # type: ignore[no-untyped-def]
    # A page of a power of two bytes (every real one) takes a mask, not a division.
    if page & (page - 1) == 0:
        return x & ~(page - 1)
    return (x // page) * page


@jit.njit(cache=True, nogil=True)
def _page_ceil(x, page):  # type: ignore[no-untyped-def]
    return _page_floor(x + page - 1, page)


@jit.njit(cache=True, nogil=True)
def _pair(p_end, q_start, page):  # type: ignore[no-untyped-def]
    """What two page blocks side by side contribute (-1: no block on that side): (largest
    free run, free runs, page bytes both touch, footprint bytes both cover). The free bytes
    between them are one run when no whole page lies between (every page of the gap touches one
    of them), else the tail of the left one's last page and the head of the right one's first."""
    if p_end < 0 and q_start < 0:
        return 0, 0, 0, 0
    if p_end < 0:  # before the first block: the head of its first page
        head = q_start - _page_floor(q_start, page)
        return head, 1 if head > 0 else 0, 0, 0
    if q_start < 0:  # after the last block: the tail of its last page
        tail = _page_ceil(p_end, page) - p_end
        return tail, 1 if tail > 0 else 0, 0, 0
    tail_page = _page_ceil(p_end, page)
    head_page = _page_floor(q_start, page)
    shared_pages = max(0, tail_page - head_page)
    if p_end >= q_start:  # rounding tails meet: no free byte between
        return 0, 0, shared_pages, p_end - q_start
    if tail_page >= head_page:
        return q_start - p_end, 1, shared_pages, 0
    tail = tail_page - p_end
    head = q_start - head_page
    return max(tail, head), (1 if tail > 0 else 0) + (1 if head > 0 else 0), 0, 0


@jit.njit(cache=True, nogil=True, _nrt=False, inline="always")
def _set_leaf(leaves, tree, totals, leaf, largest, runs, shared_pages, shared_foot):  # type: ignore[no-untyped-def]
    """Set one neighbour pair's contribution: its largest free run into the max tree, the rest
    into the totals."""
    totals[T_RUNS] += runs - leaves[leaf, RUNS]
    totals[T_SHARED_PAGES] += shared_pages - leaves[leaf, SHARED_PAGES]
    totals[T_SHARED_FOOT] += shared_foot - leaves[leaf, SHARED_FOOT]
    leaves[leaf, RUNS] = runs
    leaves[leaf, SHARED_PAGES] = shared_pages
    leaves[leaf, SHARED_FOOT] = shared_foot
    i = len(tree) // 2 + leaf
    tree[i] = largest
    i >>= 1
    while i >= 1:
        best = max(tree[2 * i], tree[2 * i + 1])
        if tree[i] == best:  # nothing above changes either: most updates stop low in the tree
            break
        tree[i] = best
        i >>= 1


@jit.njit(cache=True, nogil=True, _nrt=False, inline="always")
def _neighbours(slots, leaves, tree, totals, slot_offset, page, p, q, layer):  # type: ignore[no-untyped-def]
    """Make ``p`` and ``q`` (-1: none) neighbours in ``layer`` (and set their leaf: the pool
    layer has none, the pool holds its blocks' pages)."""
    if layer == PAGE_LAYER:
        largest, runs, pages, foot = _pair(
            slots[p, END] if p >= 0 else -1, slot_offset[q] if q >= 0 else -1, page
        )
        _set_leaf(leaves, tree, totals, p + 1, largest, runs, pages, foot)
    _join(slots, totals, p, q, NEXT, PREV, FIRST + layer)


@jit.njit(cache=True, nogil=True, _nrt=False, inline="always")
def _every_neighbours(slots, leaves, totals, slot_offset, p, q):  # type: ignore[no-untyped-def]
    """Make ``p`` and ``q`` (-1: none) neighbours in the list of every block, counting the
    footprint bytes they share."""
    if p >= 0:
        shared = max(0, slots[p, END] - slot_offset[q]) if q >= 0 else 0
        totals[T_EVERY_SHARED] += shared - leaves[p + 1, EVERY_SHARED]
        leaves[p + 1, EVERY_SHARED] = shared
    _join(slots, totals, p, q, ENEXT, EPREV, FIRST + EVERY)


@jit.njit(cache=True, nogil=True, _nrt=False, inline="always")
def _join(slots, totals, p, q, after, before, first):  # type: ignore[no-untyped-def]
    """Make ``p`` and ``q`` (-1: none) neighbours in one list: ``slots[s, after]`` and
    ``slots[s, before]`` link it, ``totals[first]`` is its first slot."""
    if p >= 0:
        slots[p, after] = q
    else:
        totals[first] = q
    if q >= 0:
        slots[q, before] = p


@jit.njit(cache=True, nogil=True, _nrt=False, inline="always")
def _unlink(slots, leaves, tree, totals, live_set, starts, slot_offset, page, every_on, s):  # type: ignore[no-untyped-def]
    """Remove live block ``s`` from its layer (and from the list of every block)."""
    layer = slots[s, LAYER]
    a = slot_offset[s]
    e = slots[s, END]
    _neighbours(slots, leaves, tree, totals, slot_offset, page, slots[s, PREV], slots[s, NEXT], layer)
    if layer == PAGE_LAYER:
        _set_leaf(leaves, tree, totals, s + 1, 0, 0, 0, 0)
        totals[T_PAGES] -= _page_ceil(e, page) - _page_floor(a, page)
    set_remove(live_set, layer, starts, s)
    if every_on:
        _every_neighbours(slots, leaves, totals, slot_offset, slots[s, EPREV], slots[s, ENEXT])
        totals[T_EVERY_SHARED] -= leaves[s + 1, EVERY_SHARED]
        leaves[s + 1, EVERY_SHARED] = 0
        set_remove(live_set, EVERY, starts, s)
    totals[T_FOOT] -= e - a
    slots[s, LIVE] = 0


@jit.njit(cache=True, nogil=True, _nrt=False, inline="always")
def _link(slots, leaves, tree, totals, live_set, starts, slot_offset, page, every_on, s, e, layer, p):  # type: ignore[no-untyped-def]
    """Insert block ``s`` (footprint end ``e``) into ``layer`` after ``p``, the live block just
    below it there (-1: none), and into the list of every block."""
    q = totals[FIRST + layer] if p < 0 else slots[p, NEXT]
    slots[s, END] = e
    slots[s, LAYER] = layer
    _neighbours(slots, leaves, tree, totals, slot_offset, page, p, s, layer)
    _neighbours(slots, leaves, tree, totals, slot_offset, page, s, q, layer)
    a = slot_offset[s]
    if layer == PAGE_LAYER:
        totals[T_PAGES] += _page_ceil(e, page) - _page_floor(a, page)
    set_add(live_set, layer, starts, s)
    if every_on:
        below = set_below(live_set, EVERY, starts, s)
        above = totals[FIRST + EVERY] if below < 0 else slots[below, ENEXT]
        _every_neighbours(slots, leaves, totals, slot_offset, below, s)
        _every_neighbours(slots, leaves, totals, slot_offset, s, above)
        set_add(live_set, EVERY, starts, s)
    totals[T_FOOT] += e - a
    slots[s, LIVE] = 1


@jit.njit(cache=True, nogil=True)
def _hole(p_end, q_start, a, e, page):  # type: ignore[no-untyped-def]
    """A freed footprint [a, e)'s bytes that lie, once it is gone, in pages its neighbours
    (footprint end ``p_end``, start ``q_start``; -1: none) keep resident: (left part, right
    part, whether both neighbours pin it). Only the part neither neighbour's footprint still
    covers is freed."""
    lo = a if p_end < 0 else max(a, p_end)
    hi = e if q_start < 0 else min(e, q_start)
    if lo >= hi:
        return 0, 0, False
    if p_end >= 0 and q_start >= 0 and _page_ceil(p_end, page) >= _page_floor(q_start, page):
        return hi - lo, 0, True  # every page between them stays resident
    left = 0
    right = 0
    if p_end >= 0:
        left = max(0, min(hi, _page_ceil(p_end, page)) - lo)
    if q_start >= 0:
        right = max(0, hi - max(lo, _page_floor(q_start, page)))
    return left, right, False


@jit.njit(cache=True, nogil=True)
def _replay_kernel(events, out):  # type: ignore[no-untyped-def]
    k = len(events.slot_offset)
    size = 1
    while size < k + 1:
        size *= 2
    every_on = bool(events.in_pool.any())
    slots = np.zeros((k, 9), dtype=np.int64)
    slots[:, PREV] = -1
    slots[:, NEXT] = -1
    slots[:, EPREV] = -1
    slots[:, ENEXT] = -1
    leaves = np.zeros((k + 1, 4), dtype=np.int64)
    tree = np.zeros(2 * size, dtype=np.int64)
    starts = level_starts(k)
    live_set = np.zeros((3 if every_on else 2, starts[-1]), dtype=np.int64)
    totals = np.zeros(FIRST + 3, dtype=np.int64)
    totals[FIRST:] = -1
    # Allocation event indices, oldest first; an entry is stale once its block is gone.
    stack = np.zeros(len(events.is_free) + 1, dtype=out.removed_at.dtype)
    _replay_loop(events, out, slots, leaves, tree, starts, live_set, totals, stack, every_on)


# The loop and the helpers it calls run without numba's reference counts (_nrt=False: they
# allocate nothing, and every array outlives the call), the helpers inlined: with them, each
# helper call took and dropped an atomic reference to every array it was passed, more than half
# of the replay's time (perf: NRT_incref and NRT_decref). The CPU time of the replay alone on
# 2 M churn events fell from 1.00 s to 0.29 s; compiling it takes about 2 s more.
@jit.njit(cache=True, nogil=True, _nrt=False)
def _replay_loop(events, out, slots, leaves, tree, starts, live_set, totals, stack, every_on):  # type: ignore[no-untyped-def]
    is_free = events.is_free
    nbytes = events.bytes
    slot_of = events.slot
    slot_offset = events.slot_offset
    in_pool = events.in_pool
    footprint_of = events.footprint
    page = events.page_bytes
    capacity = events.capacity_bytes
    pool_reserved = events.pool_reserved
    pool_releasable = events.pool_releasable
    pooled = len(pool_reserved) > 0
    n = len(is_free)
    stack_top = 0
    pool_live = 0  # live pool blocks: none, and no allocation need look at their layer
    ubytes = 0
    # The loop reads every array through a local: field access on the tuples in the loop itself
    # costs a fifth of the replay's time.
    event = out.event
    overlap = out.overlap
    reserved_out = out.reserved_bytes
    allocated_out = out.allocated_bytes
    largest_block_out = out.largest_block_bytes
    free_out = out.free_bytes
    largest_out = out.largest_free_bytes
    free_blocks = out.free_blocks
    live_bytes = out.live_bytes
    peak = out.peak_footprint
    out_of_order = out.out_of_order
    hole = out.hole
    hole_bytes = out.hole_bytes
    freed_alloc = out.freed_alloc
    pin_left = out.pin_left
    pin_right = out.pin_right
    removed_at = out.removed_at

    for i in range(n):
        s = slot_of[i]
        if is_free[i]:
            if s < 0 or slots[s, LIVE] == 0:
                event[i] = UNMATCHED_FREE
            else:
                event[i] = FREED
                while stack_top > 0:
                    top = stack[stack_top - 1]
                    t = slot_of[top]
                    if slots[t, LIVE] != 0 and slots[t, ALLOC] == top:
                        break
                    stack_top -= 1
                out_of_order[i] = stack_top == 0 or stack[stack_top - 1] != slots[s, ALLOC]
                layer = slots[s, LAYER]
                p = slots[s, PREV]
                q = slots[s, NEXT]
                a = slot_offset[s]
                e = slots[s, END]
                if layer == POOL_LAYER:
                    pool_live -= 1
                _unlink(slots, leaves, tree, totals, live_set, starts, slot_offset, page, every_on, s)
                ubytes -= slots[s, BYTES]
                removed_at[slots[s, ALLOC]] = i
                freed_alloc[i] = slots[s, ALLOC]
                if layer == PAGE_LAYER:
                    left, right, both = _hole(
                        slots[p, END] if p >= 0 else -1, slot_offset[q] if q >= 0 else -1, a, e, page
                    )
                    if left + right > 0:
                        hole[i] = True
                        hole_bytes[i] = left + right
                        if left > 0:
                            pin_left[i] = slots[p, ALLOC]
                        if right > 0 or both:
                            pin_right[i] = slots[q, ALLOC]
        elif nbytes[i] == 0:
            event[i] = ZERO_SIZE_ALLOC
        else:
            event[i] = ALLOCATED
            a = slot_offset[s]
            stop = a + nbytes[i]
            target = POOL_LAYER if in_pool[i] else PAGE_LAYER
            # Live blocks whose bytes the new block's bytes overlap (the trace missed their
            # frees), in either layer: removed, and not frees. Footprints may overlap. Only the
            # block just below can reach past a (live bytes never overlap), then every one that
            # starts before stop.
            below = -1
            for layer in range(2):
                if layer == POOL_LAYER and pool_live == 0:
                    continue
                p = set_below(live_set, layer, starts, s)
                r = -1
                if p >= 0 and slot_offset[p] + slots[p, BYTES] > a:
                    r = p
                else:
                    q = totals[FIRST + layer] if p < 0 else slots[p, NEXT]
                    if q >= 0 and slot_offset[q] < stop:
                        r = q
                removed = r >= 0
                while r >= 0:
                    overlap[i] = True
                    nxt = slots[r, NEXT]
                    if layer == POOL_LAYER:
                        pool_live -= 1
                    _unlink(slots, leaves, tree, totals, live_set, starts, slot_offset, page, every_on, r)
                    ubytes -= slots[r, BYTES]
                    removed_at[slots[r, ALLOC]] = i
                    r = nxt if nxt >= 0 and slot_offset[nxt] < stop else -1
                if layer == target:
                    below = set_below(live_set, layer, starts, s) if removed else p
            slots[s, BYTES] = nbytes[i]
            slots[s, ALLOC] = i
            _link(slots, leaves, tree, totals, live_set, starts, slot_offset, page, every_on, s,
                  a + footprint_of[i], target, below)  # fmt: skip
            if target == POOL_LAYER:
                pool_live += 1
            stack[stack_top] = i
            stack_top += 1
            ubytes += nbytes[i]

        reserved = totals[T_PAGES] - totals[T_SHARED_PAGES]
        allocated = totals[T_FOOT] - (totals[T_EVERY_SHARED] if every_on else totals[T_SHARED_FOOT])
        releasable = 0
        if pooled:
            reserved += pool_reserved[i]
            releasable = pool_releasable[i]
        device_free = max(0, capacity - reserved)
        stranded = max(0, reserved - allocated - releasable)
        largest_block = tree[1]
        reserved_out[i] = reserved
        allocated_out[i] = allocated
        largest_block_out[i] = largest_block
        free_out[i] = device_free + stranded + releasable
        largest_out[i] = max(largest_block, device_free + releasable)
        free_blocks[i] = totals[T_RUNS] + (1 if device_free >= page else 0)
        live_bytes[i] = ubytes
        # Every live footprint counted whole: what internal fragmentation is measured at.
        if totals[T_FOOT] > peak[0]:
            peak[0] = totals[T_FOOT]
            peak[1] = ubytes

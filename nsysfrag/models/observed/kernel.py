"""The observed replay on the device's pages (docs/metrics.md): the hot path.

One compiled pass over a space's events keeps the live blocks and records the state after every
event. The CUDA driver maps free physical pages wherever they lie, so what matters is which
pages the live footprints touch: a page of P bytes is *resident* while a footprint overlaps it,
and the free bytes inside resident pages are *stranded*. Per-event cost is O(log n):

* live blocks are indexed by *slot*, the rank of their start address among all allocation
  addresses in the trace (known before the replay starts); they form a doubly linked list in
  address order, and a Fenwick tree over the slots finds where a new block joins that list.
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

import numba
import numpy as np
import numpy.typing as npt

from nsysfrag import kernel_cache
from nsysfrag.events import I64, BoolArray
from nsysfrag.models.series import (
    ALLOCATED,
    FREED,
    NO_BLOCK,
    UNMATCHED_FREE,
    ZERO_SIZE_ALLOC,
    IndexArray,
)

kernel_cache.install()  # before any cache=True kernel: compiled code goes to the user's cache

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
    device_free_bytes: I64  # D = max(0, C - reserved)
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


class _Blocks(NamedTuple):
    """The live blocks, by slot: a doubly linked list per layer in address order (-1 at the
    ends), and a Fenwick tree per layer that finds where a new block joins its list."""

    live: BoolArray
    layer: npt.NDArray[np.int8]
    prev: I64
    next: I64
    end: I64  # end offset of the block's footprint
    bytes: I64
    alloc: I64  # event index of its allocation
    fenwick: I64  # layer 0
    pool_fenwick: I64  # layer 1
    first: I64  # [first live slot of layer 0, of layer 1]


class _Every(NamedTuple):
    """Every live block, of both layers, in one list in address order, kept only where the
    stream has pool blocks: a pool block's footprint may share bytes with a page block's, and
    allocated counts such bytes once."""

    on: bool
    prev: I64
    next: I64
    fenwick: I64
    first: I64  # [the lowest live block]
    shared: I64  # per leaf (after slot s: s + 1): footprint bytes a block shares with the next
    total: I64  # [every shared byte]


class _Leaves(NamedTuple):
    """What each pair of neighbours contributes (leaf 0: before the first page block; leaf
    s + 1: after slot s), in a max segment tree of the largest free run, and the totals."""

    tree: I64
    size: int  # leaves
    runs: I64  # free runs inside resident pages
    shared_pages: I64  # bytes of the pages both neighbours touch
    shared_footprint: I64  # bytes both footprints cover
    # [runs, shared pages, shared footprint (page blocks), page bytes, footprint bytes (all)]
    totals: I64


def replay(events: KernelEvents) -> KernelOutput:
    """Replay ``events`` and return the state after each one."""
    out = _allocate_outputs(len(events.is_free))
    _replay_kernel(events, out)
    return out


def assign_slots(offset: I64, is_block: BoolArray, is_free: BoolArray) -> tuple[I64, I64]:
    """Slots for a space's events: the distinct start offsets of placed blocks, ascending, and
    each event's slot — a block's own, a free's when its offset is exactly a block start (and
    >= 0), else NO_BLOCK. A hash table keeps this linear; only the distinct offsets are sorted."""
    distinct = _distinct(offset, is_block)
    slot_offset = np.sort(distinct)
    slot = _slots(offset, is_block, is_free, slot_offset)
    # The replay trusts these slots (a wrong one would corrupt its lists): check the cheap part.
    if not (slot[is_block] >= 0).all():
        raise AssertionError("slot assignment lost a block")
    return slot_offset, slot


@numba.njit(cache=True, nogil=True)
def _table_size(n):  # type: ignore[no-untyped-def]
    size = 16
    while size < 2 * n + 1:
        size *= 2
    return size


@numba.njit(cache=True, nogil=True)
def _hash(key, mask):  # type: ignore[no-untyped-def]
    # splitmix64's finalizer, in unsigned arithmetic (signed overflow is undefined behaviour to
    # LLVM, which then hashes the same key differently in different places): offsets are
    # multiples of 512 or even 2 MiB, so the low bits alone would all collide.
    x = np.uint64(key)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return np.int64((x ^ (x >> np.uint64(31))) & np.uint64(mask))


@numba.njit(cache=True, nogil=True)
def _distinct(offset, is_block):  # type: ignore[no-untyped-def]
    size = _table_size(len(offset))
    keys = np.full(size, -1, dtype=np.int64)  # offsets of blocks are >= 0: -1 marks empty
    out = np.empty(len(offset), dtype=np.int64)
    n = 0
    for i in range(len(offset)):
        if not is_block[i]:
            continue
        key = offset[i]
        h = _hash(key, size - 1)
        while keys[h] != -1 and keys[h] != key:
            h = (h + 1) & (size - 1)
        if keys[h] == -1:
            keys[h] = key
            out[n] = key
            n += 1
    return out[:n].copy()


@numba.njit(cache=True, nogil=True)
def _slots(offset, is_block, is_free, slot_offset):  # type: ignore[no-untyped-def]
    size = _table_size(len(slot_offset))
    keys = np.full(size, -1, dtype=np.int64)
    values = np.zeros(size, dtype=np.int64)
    for rank in range(len(slot_offset)):
        key = slot_offset[rank]
        h = _hash(key, size - 1)
        while keys[h] != -1:
            h = (h + 1) & (size - 1)
        keys[h] = key
        values[h] = rank
    slot = np.full(len(offset), NO_BLOCK, dtype=np.int64)
    for i in range(len(offset)):
        key = offset[i]
        if key < 0 or not (is_block[i] or is_free[i]):
            continue
        h = _hash(key, size - 1)
        while keys[h] != -1:
            if keys[h] == key:
                slot[i] = values[h]
                break
            h = (h + 1) & (size - 1)
    return slot


def empty_events(page_bytes: int = 2 << 20, capacity_bytes: int = 1) -> KernelEvents:
    """A stream of no events (to load the compiled kernel)."""
    empty = np.zeros(0, dtype=np.int64)
    no = empty.astype(np.bool_)
    return KernelEvents(no, empty, empty, empty, empty, empty, no, page_bytes, capacity_bytes,
                        empty, empty)  # fmt: skip


def warm_up() -> None:
    """Load the compiled kernel (from numba's cache) now, e.g. on a thread while a trace is
    read, rather than on the first replay."""
    replay(empty_events())


def _allocate_outputs(n: int) -> KernelOutput:
    # Event indices fit 32 bits for any trace up to two billion events: half the memory.
    index = np.int32 if n < 2**31 - 1 else np.int64
    return KernelOutput(
        event=np.zeros(n, dtype=np.int8),
        overlap=np.zeros(n, dtype=np.bool_),
        reserved_bytes=np.zeros(n, dtype=np.int64),
        allocated_bytes=np.zeros(n, dtype=np.int64),
        device_free_bytes=np.zeros(n, dtype=np.int64),
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


@numba.njit(cache=True, nogil=True)
def _fenwick_add(tree: np.ndarray, i: int, delta: int) -> None:
    i += 1
    while i < len(tree):
        tree[i] += delta
        i += i & -i


@numba.njit(cache=True, nogil=True)
def _fenwick_prefix(tree: np.ndarray, i: int) -> int:
    """Number of live slots in [0, i]."""
    total = 0
    i += 1
    while i > 0:
        total += tree[i]
        i -= i & -i
    return total


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
def _previous_live(tree: np.ndarray, slot: int, top_bit: int) -> int:
    """The live slot just below ``slot`` by address, or -1."""
    below = _fenwick_prefix(tree, slot - 1) if slot > 0 else 0
    if below == 0:
        return -1
    return _fenwick_kth(tree, below, top_bit)


@numba.njit(cache=True, nogil=True)
def _page_floor(x, page):  # type: ignore[no-untyped-def]
    return (x // page) * page


@numba.njit(cache=True, nogil=True)
def _page_ceil(x, page):  # type: ignore[no-untyped-def]
    return ((x + page - 1) // page) * page


@numba.njit(cache=True, nogil=True)
def _set_leaf(leaves, leaf, largest, runs, shared_pages, shared_footprint):  # type: ignore[no-untyped-def]
    """Set one neighbour pair's contribution: its largest free run into the max tree, the rest
    into the totals."""
    totals = leaves.totals
    totals[0] += runs - leaves.runs[leaf]
    totals[1] += shared_pages - leaves.shared_pages[leaf]
    totals[2] += shared_footprint - leaves.shared_footprint[leaf]
    leaves.runs[leaf] = runs
    leaves.shared_pages[leaf] = shared_pages
    leaves.shared_footprint[leaf] = shared_footprint
    tree = leaves.tree
    i = leaves.size + leaf
    tree[i] = largest
    i >>= 1
    while i >= 1:
        best = max(tree[2 * i], tree[2 * i + 1])
        if tree[i] == best:  # nothing above changes either: most updates stop low in the tree
            break
        tree[i] = best
        i >>= 1


@numba.njit(cache=True, nogil=True)
def _pair(leaves, leaf, p_end, q_start, page):  # type: ignore[no-untyped-def]
    """The leaf of two page blocks side by side (-1: no block on that side): the free bytes
    between them are one run when no whole page lies between (every page of the gap touches
    one of them), else the tail of the left one's last page and the head of the right one's
    first page."""
    if p_end < 0 and q_start < 0:
        _set_leaf(leaves, leaf, 0, 0, 0, 0)
    elif p_end < 0:  # before the first block: the head of its first page
        head = q_start - _page_floor(q_start, page)
        _set_leaf(leaves, leaf, head, 1 if head > 0 else 0, 0, 0)
    elif q_start < 0:  # after the last block: the tail of its last page
        tail = _page_ceil(p_end, page) - p_end
        _set_leaf(leaves, leaf, tail, 1 if tail > 0 else 0, 0, 0)
    else:
        tail_page = _page_ceil(p_end, page)
        head_page = _page_floor(q_start, page)
        shared_pages = max(0, tail_page - head_page)
        if p_end >= q_start:  # rounding tails meet: no free byte between
            _set_leaf(leaves, leaf, 0, 0, shared_pages, p_end - q_start)
        elif tail_page >= head_page:
            _set_leaf(leaves, leaf, q_start - p_end, 1, shared_pages, 0)
        else:
            tail = tail_page - p_end
            head = q_start - head_page
            runs = (1 if tail > 0 else 0) + (1 if head > 0 else 0)
            _set_leaf(leaves, leaf, max(tail, head), runs, 0, 0)


@numba.njit(cache=True, nogil=True)
def _relink(blocks, leaves, slot_offset, page, p, q, layer):  # type: ignore[no-untyped-def]
    """Make ``p`` and ``q`` (-1: none) neighbours in ``layer`` and set their leaf (the pool
    layer has none: the pool holds its blocks' pages)."""
    if layer == PAGE_LAYER:
        _pair(
            leaves,
            p + 1,
            blocks.end[p] if p >= 0 else -1,
            slot_offset[q] if q >= 0 else -1,
            page,
        )
    if p >= 0:
        blocks.next[p] = q
    else:
        blocks.first[layer] = q
    if q >= 0:
        blocks.prev[q] = p


@numba.njit(cache=True, nogil=True)
def _every_pair(every, blocks, slot_offset, p, q):  # type: ignore[no-untyped-def]
    """Make ``p`` and ``q`` (-1: none) neighbours in the list of every block, counting the
    footprint bytes they share."""
    if p >= 0:
        shared = max(0, blocks.end[p] - slot_offset[q]) if q >= 0 else 0
        every.total[0] += shared - every.shared[p + 1]
        every.shared[p + 1] = shared
        every.next[p] = q
    else:
        every.first[0] = q
    if q >= 0:
        every.prev[q] = p


@numba.njit(cache=True, nogil=True)
def _unlink(blocks, leaves, every, slot_offset, page, s):  # type: ignore[no-untyped-def]
    """Remove live block ``s`` from its layer (and from the list of every block)."""
    layer = blocks.layer[s]
    a = slot_offset[s]
    e = blocks.end[s]
    _relink(blocks, leaves, slot_offset, page, blocks.prev[s], blocks.next[s], layer)
    if layer == PAGE_LAYER:
        _set_leaf(leaves, s + 1, 0, 0, 0, 0)
        leaves.totals[3] -= _page_ceil(e, page) - _page_floor(a, page)
        _fenwick_add(blocks.fenwick, s, -1)
    else:
        _fenwick_add(blocks.pool_fenwick, s, -1)
    if every.on:
        _every_pair(every, blocks, slot_offset, every.prev[s], every.next[s])
        every.total[0] -= every.shared[s + 1]
        every.shared[s + 1] = 0
        _fenwick_add(every.fenwick, s, -1)
    leaves.totals[4] -= e - a
    blocks.live[s] = False


@numba.njit(cache=True, nogil=True)
def _link(blocks, leaves, every, slot_offset, page, s, e, layer, p, top_bit):  # type: ignore[no-untyped-def]
    """Insert block ``s`` (footprint end ``e``) into ``layer`` after ``p``, the live block
    just below it there (-1: none), and into the list of every block."""
    tree = blocks.fenwick if layer == PAGE_LAYER else blocks.pool_fenwick
    q = blocks.first[layer] if p < 0 else blocks.next[p]
    blocks.end[s] = e
    blocks.layer[s] = layer
    _relink(blocks, leaves, slot_offset, page, p, s, layer)
    _relink(blocks, leaves, slot_offset, page, s, q, layer)
    a = slot_offset[s]
    if layer == PAGE_LAYER:
        leaves.totals[3] += _page_ceil(e, page) - _page_floor(a, page)
    _fenwick_add(tree, s, 1)
    if every.on:
        below = _previous_live(every.fenwick, s, top_bit)
        above = every.first[0] if below < 0 else every.next[below]
        _every_pair(every, blocks, slot_offset, below, s)
        _every_pair(every, blocks, slot_offset, s, above)
        _fenwick_add(every.fenwick, s, 1)
    leaves.totals[4] += e - a
    blocks.live[s] = True


@numba.njit(cache=True, nogil=True)
def _overlapped(blocks, slot_offset, a, stop, p, first):  # type: ignore[no-untyped-def]
    """The first live block of one layer whose byte range meets [a, stop), or -1: the block
    ``p`` below a if its bytes reach past a, else the next one if it starts before stop."""
    if p >= 0 and slot_offset[p] + blocks.bytes[p] > a:
        return p
    q = first if p < 0 else blocks.next[p]
    if q >= 0 and slot_offset[q] < stop:
        return q
    return -1


@numba.njit(cache=True, nogil=True)
def _hole(p_end, q_start, a, e, page):  # type: ignore[no-untyped-def]
    """A freed footprint [a, e)'s bytes that lie, once it is gone, in pages its neighbours
    (footprint end ``p_end``, start ``q_start``; -1: none) keep resident: (left part, right
    part). Only the part neither neighbour's footprint still covers is freed."""
    lo = a if p_end < 0 else max(a, p_end)
    hi = e if q_start < 0 else min(e, q_start)
    if lo >= hi:
        return 0, 0
    if p_end >= 0 and q_start >= 0 and _page_ceil(p_end, page) >= _page_floor(q_start, page):
        return hi - lo, 0  # every page between them stays resident
    left = 0
    right = 0
    if p_end >= 0:
        left = max(0, min(hi, _page_ceil(p_end, page)) - lo)
    if q_start >= 0:
        right = max(0, hi - max(lo, _page_floor(q_start, page)))
    return left, right


@numba.njit(cache=True, nogil=True)
def _replay_kernel(events, out):  # type: ignore[no-untyped-def]
    is_free = events.is_free
    nbytes = events.bytes
    slot_of = events.slot
    slot_offset = events.slot_offset
    in_pool = events.in_pool
    page = events.page_bytes
    capacity = events.capacity_bytes
    pooled = len(events.pool_reserved) > 0
    n = len(is_free)
    k = len(slot_offset)
    top_bit = 1
    while top_bit * 2 <= k:
        top_bit *= 2
    size = 1
    while size < k + 1:
        size *= 2
    leaves = _Leaves(
        np.zeros(2 * size, dtype=np.int64),
        size,
        np.zeros(k + 1, dtype=np.int64),
        np.zeros(k + 1, dtype=np.int64),
        np.zeros(k + 1, dtype=np.int64),
        np.zeros(5, dtype=np.int64),
    )
    pooled_blocks = bool(in_pool.any())
    m = k if pooled_blocks else 0
    every = _Every(
        pooled_blocks,
        np.full(m, -1, dtype=np.int64),
        np.full(m, -1, dtype=np.int64),
        np.zeros(m + 1, dtype=np.int64),
        np.full(1, -1, dtype=np.int64),
        np.zeros(m + 1, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
    )
    blocks = _Blocks(
        np.zeros(k, dtype=np.bool_),
        np.zeros(k, dtype=np.int8),
        np.full(k, -1, dtype=np.int64),
        np.full(k, -1, dtype=np.int64),
        np.zeros(k, dtype=np.int64),
        np.zeros(k, dtype=np.int64),
        np.zeros(k, dtype=np.int64),
        np.zeros(k + 1, dtype=np.int64),
        np.zeros(k + 1, dtype=np.int64),
        np.full(2, -1, dtype=np.int64),
    )
    live = blocks.live
    block_end = blocks.end
    block_alloc = blocks.alloc
    block_bytes = blocks.bytes
    layer_of = blocks.layer
    totals = leaves.totals
    tree = leaves.tree
    # Allocation event indices, oldest first; an entry is stale once its block is gone.
    stack = np.zeros(n + 1, dtype=out.removed_at.dtype)
    stack_top = 0
    pool_live = 0  # live pool blocks: none, and no allocation need look at their layer
    ubytes = 0
    # The loop reads every array through a local: field access on the tuples in the loop itself
    # costs a fifth of the replay's time.
    event = out.event
    overlap = out.overlap
    reserved_out = out.reserved_bytes
    allocated_out = out.allocated_bytes
    device_free_out = out.device_free_bytes
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
    footprint_of = events.footprint

    for i in range(n):
        s = slot_of[i]
        if is_free[i]:
            if s < 0 or not live[s]:
                event[i] = UNMATCHED_FREE
            else:
                event[i] = FREED
                while stack_top > 0 and (
                    not live[slot_of[stack[stack_top - 1]]]
                    or block_alloc[slot_of[stack[stack_top - 1]]] != stack[stack_top - 1]
                ):
                    stack_top -= 1
                out_of_order[i] = stack_top == 0 or stack[stack_top - 1] != block_alloc[s]
                layer = layer_of[s]
                p = blocks.prev[s]
                q = blocks.next[s]
                a = slot_offset[s]
                e = block_end[s]
                if layer == POOL_LAYER:
                    pool_live -= 1
                _unlink(blocks, leaves, every, slot_offset, page, s)
                ubytes -= block_bytes[s]
                removed_at[block_alloc[s]] = i
                freed_alloc[i] = block_alloc[s]
                if layer == PAGE_LAYER:
                    left, right = _hole(
                        block_end[p] if p >= 0 else -1,
                        slot_offset[q] if q >= 0 else -1,
                        a,
                        e,
                        page,
                    )
                    if left + right > 0:
                        hole[i] = True
                        hole_bytes[i] = left + right
                        if left > 0:
                            pin_left[i] = block_alloc[p]
                        if right > 0 or (left > 0 and q >= 0 and _page_ceil(block_end[p], page)
                                         >= _page_floor(slot_offset[q], page)):  # fmt: skip
                            pin_right[i] = block_alloc[q]
        elif nbytes[i] == 0:
            event[i] = ZERO_SIZE_ALLOC
        else:
            event[i] = ALLOCATED
            a = slot_offset[s]
            stop = a + nbytes[i]
            # Live blocks whose bytes the new block's bytes overlap (the trace missed their
            # frees), in either layer: removed, and not frees. Footprints may overlap.
            target = POOL_LAYER if in_pool[i] else PAGE_LAYER
            below = -1
            for layer in range(2):
                if layer == POOL_LAYER and pool_live == 0:
                    continue
                tree_of_layer = blocks.fenwick if layer == PAGE_LAYER else blocks.pool_fenwick
                p = _previous_live(tree_of_layer, s, top_bit)
                r = _overlapped(blocks, slot_offset, a, stop, p, blocks.first[layer])
                removed = r >= 0
                while r >= 0:
                    overlap[i] = True
                    nxt = blocks.next[r]
                    if layer == POOL_LAYER:
                        pool_live -= 1
                    _unlink(blocks, leaves, every, slot_offset, page, r)
                    ubytes -= block_bytes[r]
                    removed_at[block_alloc[r]] = i
                    r = nxt if nxt >= 0 and slot_offset[nxt] < stop else -1
                if layer == target:
                    below = _previous_live(tree_of_layer, s, top_bit) if removed else p
            e = a + footprint_of[i]
            block_bytes[s] = nbytes[i]
            block_alloc[s] = i
            _link(blocks, leaves, every, slot_offset, page, s, e, target, below, top_bit)
            if target == POOL_LAYER:
                pool_live += 1
            stack[stack_top] = i
            stack_top += 1
            ubytes += nbytes[i]

        reserved = totals[3] - totals[1]
        allocated = totals[4] - (every.total[0] if pooled_blocks else totals[2])
        releasable = 0
        if pooled:
            reserved += events.pool_reserved[i]
            releasable = events.pool_releasable[i]
        device_free = max(0, capacity - reserved)
        stranded = max(0, reserved - allocated - releasable)
        largest_block = tree[1]
        reserved_out[i] = reserved
        allocated_out[i] = allocated
        device_free_out[i] = device_free
        largest_block_out[i] = largest_block
        free_out[i] = device_free + stranded + releasable
        largest_out[i] = max(largest_block, device_free + releasable)
        free_blocks[i] = totals[0] + (1 if device_free >= page else 0)
        live_bytes[i] = ubytes
        # Every live footprint counted whole: what internal fragmentation is measured at.
        if totals[4] > peak[0]:
            peak[0] = totals[4]
            peak[1] = ubytes

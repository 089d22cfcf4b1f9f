"""The observed address-space replay (docs/metrics.md): the hot path.

One compiled pass over a space's events keeps the live blocks and the free blocks between them
and records the state after every event. Per-event cost is O(log n):

* live blocks are indexed by *slot*, the rank of their start address among all allocation
  addresses in the trace (known before the replay starts); they form a doubly linked list in
  address order, and a Fenwick tree over the slots finds where a new block joins that list;
* every free block is the gap after a live block (or after the arena base), stored in a max
  segment tree indexed by that block's slot, so the largest free block is the root;
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


class KernelEvents(NamedTuple):
    """One space's replayable events in order; offsets are relative to the arena base B."""

    is_free: BoolArray
    offset: I64  # address - B; meaningless for frees below B (their slot is NO_BLOCK)
    bytes: I64
    footprint: I64  # ceil(bytes / G) * G for allocations, 0 for frees
    slot: I64  # rank of the address among allocation start addresses, or NO_BLOCK
    slot_offset: I64  # start offset of each slot, ascending
    arena_bytes: int  # E - B


class KernelOutput(NamedTuple):
    """The state after every event (arrays of the event count) and what each event did."""

    event: npt.NDArray[np.int8]  # ALLOCATED, FREED, UNMATCHED_FREE or ZERO_SIZE_ALLOC
    overlap: BoolArray
    free_bytes: I64
    largest_free_bytes: I64
    free_blocks: IndexArray
    live_bytes: I64
    peak_footprint: I64  # [footprint, live bytes] at the first maximum of footprint bytes
    out_of_order: BoolArray  # frees only
    hole: BoolArray  # frees only
    freed_alloc: IndexArray  # event index of the freed block's allocation, or NO_BLOCK
    pin_left: IndexArray  # event index of the allocation bounding the hole on the left, or NO_BLOCK
    pin_right: IndexArray
    removed_at: IndexArray  # for allocations: the event that freed or evicted the block, or NO_BLOCK


class _Blocks(NamedTuple):
    """The live blocks, by slot: a doubly linked list in address order (-1 at the ends), and a
    Fenwick tree over the slots that finds where a new block joins that list."""

    live: BoolArray
    prev: I64
    next: I64
    end: I64  # end offset of the block's footprint
    bytes: I64
    alloc: I64  # event index of its allocation
    fenwick: I64


class _Gaps(NamedTuple):
    """Every free block is the gap after a live block (leaf s + 1) or after the arena base
    (leaf 0), in a max segment tree whose root is the largest free block."""

    tree: I64
    size: int  # leaves


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


def warm_up() -> None:
    """Load the compiled kernel (from numba's cache) now, e.g. on a thread while a trace is
    read, rather than on the first replay."""
    empty = np.zeros(0, dtype=np.int64)
    replay(KernelEvents(empty.astype(np.bool_), empty, empty, empty, empty, empty, 1))


def _allocate_outputs(n: int) -> KernelOutput:
    # Event indices fit 32 bits for any trace up to two billion events: half the memory.
    index = np.int32 if n < 2**31 - 1 else np.int64
    return KernelOutput(
        event=np.zeros(n, dtype=np.int8),
        overlap=np.zeros(n, dtype=np.bool_),
        free_bytes=np.zeros(n, dtype=np.int64),
        largest_free_bytes=np.zeros(n, dtype=np.int64),
        free_blocks=np.zeros(n, dtype=index),
        live_bytes=np.zeros(n, dtype=np.int64),
        peak_footprint=np.zeros(2, dtype=np.int64),
        out_of_order=np.zeros(n, dtype=np.bool_),
        hole=np.zeros(n, dtype=np.bool_),
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
def _set_gap(gaps: _Gaps, leaf: int, value: int) -> int:
    """Set free block ``leaf`` (0: after the base, s + 1: after slot s); return the change in
    the number of non-empty free blocks."""
    tree = gaps.tree
    i = gaps.size + leaf
    old = tree[i]
    tree[i] = value
    i >>= 1
    while i >= 1:
        best = max(tree[2 * i], tree[2 * i + 1])
        if tree[i] == best:  # nothing above changes either: most updates stop low in the tree
            break
        tree[i] = best
        i >>= 1
    return (1 if value > 0 else 0) - (1 if old > 0 else 0)


@numba.njit(cache=True, nogil=True)
def _unlink(blocks, gaps, s, slot_offset, arena):  # type: ignore[no-untyped-def]
    """Remove live block ``s``; return the change in the number of non-empty free blocks."""
    p = blocks.prev[s]
    q = blocks.next[s]
    left_end = 0 if p < 0 else blocks.end[p]
    right_start = arena if q < 0 else slot_offset[q]
    change = _set_gap(gaps, p + 1, right_start - left_end)
    change += _set_gap(gaps, s + 1, 0)
    if p >= 0:
        blocks.next[p] = q
    if q >= 0:
        blocks.prev[q] = p
    _fenwick_add(blocks.fenwick, s, -1)
    blocks.live[s] = False
    return change


@numba.njit(cache=True, nogil=True)
def _replay_kernel(events, out):  # type: ignore[no-untyped-def]
    is_free = events.is_free
    nbytes = events.bytes
    slot_of = events.slot
    slot_offset = events.slot_offset
    arena = events.arena_bytes
    n = len(is_free)
    k = len(slot_offset)
    top_bit = 1
    while top_bit * 2 <= k:
        top_bit *= 2
    size = 1
    while size < k + 1:
        size *= 2
    gaps = _Gaps(np.zeros(2 * size, dtype=np.int64), size)
    blocks = _Blocks(
        np.zeros(k, dtype=np.bool_),
        np.full(k, -1, dtype=np.int64),
        np.full(k, -1, dtype=np.int64),
        np.zeros(k, dtype=np.int64),
        np.zeros(k, dtype=np.int64),
        np.zeros(k, dtype=np.int64),
        np.zeros(k + 1, dtype=np.int64),
    )
    live = blocks.live
    prev_live = blocks.prev
    next_live = blocks.next
    block_end = blocks.end
    block_alloc = blocks.alloc
    # Allocation event indices, oldest first; an entry is stale once its block is gone.
    stack = np.zeros(n + 1, dtype=out.removed_at.dtype)
    stack_top = 0
    n_free = _set_gap(gaps, 0, arena)
    used = 0
    ubytes = 0
    # The loop reads every array through a local: field access on the tuples in the loop itself
    # costs a fifth of the replay's time.
    event = out.event
    overlap = out.overlap
    free_bytes = out.free_bytes
    largest = out.largest_free_bytes
    free_blocks = out.free_blocks
    live_bytes = out.live_bytes
    peak = out.peak_footprint
    out_of_order = out.out_of_order
    hole = out.hole
    freed_alloc = out.freed_alloc
    pin_left = out.pin_left
    pin_right = out.pin_right
    removed_at = out.removed_at
    footprint_of = events.footprint
    block_bytes = blocks.bytes
    fenwick = blocks.fenwick
    tree = gaps.tree
    first_live = -1  # lowest live slot

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
                p = prev_live[s]
                q = next_live[s]
                if first_live == s:
                    first_live = q
                n_free += _unlink(blocks, gaps, s, slot_offset, arena)
                used -= block_end[s] - slot_offset[s]
                ubytes -= block_bytes[s]
                removed_at[block_alloc[s]] = i
                freed_alloc[i] = block_alloc[s]
                if p >= 0 and q >= 0:
                    hole[i] = True
                    pin_left[i] = block_alloc[p]
                    pin_right[i] = block_alloc[q]
        elif nbytes[i] == 0:
            event[i] = ZERO_SIZE_ALLOC
        else:
            event[i] = ALLOCATED
            a = slot_offset[s]
            e = a + footprint_of[i]
            p = _previous_live(fenwick, s, top_bit)
            q = first_live if p < 0 else next_live[p]
            # Live blocks the new footprint overlaps (the trace missed their frees): the one
            # below if it reaches past a, and those starting in [a, e), slot s itself included.
            if (p >= 0 and block_end[p] > a) or (q >= 0 and slot_offset[q] < e):
                overlap[i] = True
                r = p if p >= 0 and block_end[p] > a else q
                while r >= 0 and slot_offset[r] < e:
                    nxt = next_live[r]
                    if first_live == r:
                        first_live = nxt
                    n_free += _unlink(blocks, gaps, r, slot_offset, arena)
                    used -= block_end[r] - slot_offset[r]
                    ubytes -= block_bytes[r]
                    removed_at[block_alloc[r]] = i
                    r = nxt
                p = _previous_live(fenwick, s, top_bit)
                q = first_live if p < 0 else next_live[p]
            left_end = 0 if p < 0 else block_end[p]
            right_start = arena if q < 0 else slot_offset[q]
            n_free += _set_gap(gaps, p + 1, a - left_end)
            n_free += _set_gap(gaps, s + 1, right_start - e)
            _fenwick_add(fenwick, s, 1)
            live[s] = True
            prev_live[s] = p
            next_live[s] = q
            if p >= 0:
                next_live[p] = s
            else:
                first_live = s
            if q >= 0:
                prev_live[q] = s
            block_end[s] = e
            block_bytes[s] = nbytes[i]
            block_alloc[s] = i
            stack[stack_top] = i
            stack_top += 1
            used += e - a
            ubytes += nbytes[i]

        free_bytes[i] = arena - used
        largest[i] = tree[1]
        free_blocks[i] = n_free
        live_bytes[i] = ubytes
        if used > peak[0]:
            peak[0] = used
            peak[1] = ubytes

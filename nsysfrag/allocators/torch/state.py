"""The ``torch`` kernel's state and its block bookkeeping: the block table, the cached free
blocks, the unmapped ranges of expandable segments, the release candidates and the log of
segment calls.

Blocks live in a table (an array of :data:`BLOCK` records, indexed by block id; id 0 is
"no block"). A block is a range of one segment: ``prev``/``next`` link the blocks of a segment
in address order, ``segment`` names the expandable segment it belongs to (-1 for a cudaMalloc
segment) and ``pool`` is the pool key ``2 * stream + small``. The free blocks of all pools sit
in one ordered set keyed by ``(pool << 48 | size, address)`` (PyTorch's per-pool
``(stream, size, address)`` order), a second set orders them by size alone (the largest free
block), a third keeps the unmapped ranges by ``(pool, address)``. Release candidates — whole
free segments and free expandable blocks of at least a page — are a linked list, so
``release_cached_blocks`` never scans every block.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from nsysfrag.allocators.base import I64, kernel_step, kernel_step_inline
from nsysfrag.allocators.treap import (
    K1,
    VAL,
    give_id,
    new_treap,
    t_erase,
    t_insert,
    t_last,
    take_id,
)

SIZE_SHIFT = 48  # free-set key: pool key << 48 | size
ADDRESS_BASE = 1 << 48  # where simulated segments start: above every user-space GPU address
IN_FREE, IN_UNMAPPED, IN_CANDIDATES = 1, 2, 4  # Blocks.flags
LOG_ALLOC, LOG_FREE, LOG_MAP, LOG_UNMAP = 1, 2, 3, 4  # SegmentLog.kind

TORCH_COUNTERS = np.dtype([
    ("reserved", np.int64),
    ("free_bytes", np.int64),  # F: the cached free (mapped) blocks
    ("free_blocks", np.int64),  # N
    ("next_address", np.int64),  # where the next segment goes
    ("next_id", np.int64),  # the highest block id used so far
    ("recycled", np.int64),  # block ids waiting in free_ids
    ("candidates", np.int64),  # head of the release-candidate list
    ("expandable_count", np.int64),  # expandable segments made so far
    ("log_length", np.int64),
    ("event", np.int64),  # the event being replayed, for the log
    ("overflow", np.int64),  # 1 when a table ran out of room: the run is retried bigger
    ("pending", np.int64),  # head of the list of blocks whose free waits on another stream
    ("releasable", np.int64),  # R: the cached bytes release_cached_blocks would return
])  # fmt: skip


BLOCK = np.dtype([
    ("address", np.int64),
    ("size", np.int64),
    ("requested", np.int64),  # the request's bytes, while allocated
    ("prev", np.int64),  # the block below in the same segment, 0 for none
    ("next", np.int64),
    ("allocated", np.int64),
    ("mapped", np.int64),  # 0: an unmapped range of an expandable segment
    ("pool", np.int64),  # 2 * stream + small
    ("segment", np.int64),  # expandable segment index, -1 for a cudaMalloc segment
    ("gc_base", np.int64),  # the pool's get_free_block count when cached (GC age)
    ("cand_prev", np.int64),  # release-candidate list links
    ("cand_next", np.int64),
    ("flags", np.int64),  # IN_FREE | IN_UNMAPPED | IN_CANDIDATES
    ("pending_next", np.int64),  # the next block of the pending-free list
    ("releasable", np.int64),  # while cached: its bytes release_cached_blocks would return
])  # fmt: skip


EXPANDABLE = np.dtype([  # an expandable segment: a virtual range mapped page by page
    ("base", np.int64),
    ("va", np.int64),  # virtual size
    ("page", np.int64),  # 2 MiB (small pool) or 20 MiB (large pool)
    ("pool", np.int64),
])  # fmt: skip

LOG_ENTRY = np.dtype([  # one of the model's cudaMalloc / cudaFree / map / unmap calls
    ("kind", np.int64),  # LOG_ALLOC …
    ("address", np.int64),
    ("size", np.int64),
    ("event", np.int64),  # the event during which the call happened
])  # fmt: skip

REQUEST = np.dtype([
    ("block", np.int64),  # the block it holds, 0 for none
    ("stream", np.int64),
    ("pending_free", np.int64),  # 1: its free completes only in the next malloc (see kernel)
])  # fmt: skip


class TorchState(NamedTuple):
    blocks: Any  # the block table: one BLOCK record per block id
    counters: Any  # one TORCH_COUNTERS record
    free_ids: I64  # recycled block ids
    by_pool: I64  # treap: cached free blocks by (pool << 48 | size, address)
    by_size: I64  # treap: cached free blocks by size
    unmapped: I64  # treap: unmapped ranges by (pool, address)
    expandables: Any  # EXPANDABLE records
    # get_free_block calls so far (the garbage collector's clock), per BlockPool: PyTorch keeps
    # one small and one large pool for every stream, so the index is the pool key's small bit.
    gc_clock: I64
    log: Any  # LOG_ENTRY records, in call order
    requests: Any  # REQUEST records, per request of the stream
    scratch: I64  # room for one list of block ids (the release candidates, as they are released)
    blank: Any  # one BLOCK record: every field of a new block (mapped, not expandable)


def _zeros(n: int) -> I64:
    return np.zeros(n, dtype=np.int64)


def new_state(
    max_blocks: int, max_expandables: int, max_log: int,
    request_stream: I64, pending_free: I64,
) -> TorchState:  # fmt: skip
    requests = np.zeros(len(request_stream), dtype=REQUEST)
    requests["stream"] = request_stream
    requests["pending_free"] = pending_free
    counters = np.zeros(1, dtype=TORCH_COUNTERS)
    counters[0]["next_address"] = ADDRESS_BASE
    blocks = np.zeros(max_blocks, dtype=BLOCK)
    blank = np.zeros(1, dtype=BLOCK)
    blank["mapped"] = 1
    blank["segment"] = -1
    return TorchState(
        blocks, counters, _zeros(max_blocks),
        new_treap(max_blocks, 11), new_treap(max_blocks, 12), new_treap(max_blocks, 13),
        np.zeros(max_expandables, dtype=EXPANDABLE), _zeros(2),
        np.zeros(max_log, dtype=LOG_ENTRY), requests, _zeros(max_blocks), blank,
    )  # fmt: skip


@kernel_step_inline
def new_block(st: TorchState) -> int:
    """A fresh block id with every field cleared (mapped, not expandable), 0 on overflow."""
    c = st.counters[0]
    n = take_id(st.free_ids, c)
    if n >= len(st.free_ids):
        c.overflow = 1
        return 0
    st.blocks[n] = st.blank[0]
    return int(n)


@kernel_step_inline
def delete_block(st: TorchState, n: int) -> None:
    give_id(st.free_ids, st.counters[0], n)


@kernel_step_inline
def log_call(st: TorchState, kind: int, address: int, size: int) -> None:
    c = st.counters[0]
    k = c.log_length
    if k < len(st.log):
        entry = st.log[k]
        entry.kind = kind
        entry.address = address
        entry.size = size
        entry.event = c.event
        c.log_length = k + 1
    else:
        c.overflow = 1


@kernel_step_inline
def _is_candidate(st: TorchState, n: int) -> bool:
    """Could release_cached_blocks return (part of) this free block to CUDA?"""
    b = st.blocks
    if b[n].segment < 0:
        return bool(b[n].prev == 0 and b[n].next == 0)
    return bool(b[n].size >= st.expandables[b[n].segment].page)


@kernel_step_inline
def _releasable(st: TorchState, n: int) -> int:
    """The bytes of free block ``n`` that release_cached_blocks would return to CUDA: the whole
    segment it is (cudaFree), or the whole pages inside it (an expandable segment's unmap,
    pages counted from the segment's base, as ``_unmap_block`` cuts them)."""
    b = st.blocks
    if b[n].segment < 0:
        return int(b[n].size) if b[n].prev == 0 and b[n].next == 0 else 0
    e = st.expandables[b[n].segment]
    lo = b[n].address - e.base
    first = -(-lo // e.page)
    last = (lo + b[n].size) // e.page
    return int(max(last - first, 0) * e.page)


@kernel_step_inline
def _candidate_add(st: TorchState, n: int) -> None:
    b = st.blocks
    c = st.counters[0]
    head = c.candidates
    b[n].cand_prev = 0
    b[n].cand_next = head
    if head != 0:
        b[head].cand_prev = n
    c.candidates = n
    b[n].flags |= IN_CANDIDATES


@kernel_step_inline
def _candidate_remove(st: TorchState, n: int) -> None:
    b = st.blocks
    p = b[n].cand_prev
    q = b[n].cand_next
    if p != 0:
        b[p].cand_next = q
    else:
        st.counters[0].candidates = q
    if q != 0:
        b[q].cand_prev = p
    b[n].flags &= ~IN_CANDIDATES


@kernel_step
def candidates(st: TorchState) -> int:
    """The release candidates now, most recently cached first, written to ``st.scratch``
    (releasing them changes the list); returns how many."""
    b = st.blocks
    out = st.scratch
    count = 0
    n = st.counters[0].candidates
    while n != 0:
        out[count] = n
        count += 1
        n = b[n].cand_next
    return count


@kernel_step_inline
def cache_block(st: TorchState, n: int) -> None:
    """Put a free mapped block into its pool's cached set (insert_into_blocks)."""
    b = st.blocks
    c = st.counters[0]
    size = b[n].size
    t_insert(st.by_pool, n, (b[n].pool << SIZE_SHIFT) | size, b[n].address, size)
    t_insert(st.by_size, n, size, 0, size)
    b[n].flags |= IN_FREE
    b[n].gc_base = st.gc_clock[b[n].pool & 1]
    c.free_bytes += size
    c.free_blocks += 1
    # Kept with the block: its neighbours or mapping may change before it leaves the cache.
    b[n].releasable = _releasable(st, n)
    c.releasable += b[n].releasable
    if _is_candidate(st, n):
        _candidate_add(st, n)


@kernel_step_inline
def uncache_block(st: TorchState, n: int) -> None:
    b = st.blocks
    c = st.counters[0]
    t_erase(st.by_pool, n)
    t_erase(st.by_size, n)
    b[n].flags &= ~IN_FREE
    c.free_bytes -= b[n].size
    c.free_blocks -= 1
    c.releasable -= b[n].releasable
    b[n].releasable = 0
    if b[n].flags & IN_CANDIDATES:
        _candidate_remove(st, n)


@kernel_step_inline
def add_unmapped(st: TorchState, n: int) -> None:
    b = st.blocks
    t_insert(st.unmapped, n, b[n].pool, b[n].address, b[n].size)
    b[n].flags |= IN_UNMAPPED


@kernel_step_inline
def remove_unmapped(st: TorchState, n: int) -> None:
    t_erase(st.unmapped, n)
    st.blocks[n].flags &= ~IN_UNMAPPED


@kernel_step
def try_merge(st: TorchState, dst: int, src: int) -> int:
    """try_merge_blocks: absorb a free neighbour of the same mapping state into ``dst``."""
    b = st.blocks
    if src == 0 or b[src].allocated != 0 or b[src].mapped != b[dst].mapped:
        return 0
    if b[src].flags & IN_FREE:
        uncache_block(st, src)
    if b[src].flags & IN_UNMAPPED:
        remove_unmapped(st, src)
    if b[dst].prev == src:
        b[dst].address = b[src].address
        b[dst].prev = b[src].prev
        if b[dst].prev != 0:
            b[b[dst].prev].next = dst
    else:
        b[dst].next = b[src].next
        if b[dst].next != 0:
            b[b[dst].next].prev = dst
    size = b[src].size
    b[dst].size += size
    delete_block(st, src)
    return int(size)


@kernel_step
def splice_before(st: TorchState, n: int, after: int) -> None:
    """Link new block ``n`` right before ``after`` in its segment."""
    b = st.blocks
    p = b[after].prev
    b[n].prev = p
    b[n].next = after
    if p != 0:
        b[p].next = n
    b[after].prev = n


@kernel_step
def splice_after(st: TorchState, n: int, before: int) -> None:
    """Link new block ``n`` right after ``before`` in its segment."""
    b = st.blocks
    following = b[before].next
    if following != 0:
        splice_before(st, n, following)
        return
    b[n].prev = before
    b[n].next = 0
    b[before].next = n


@kernel_step_inline
def pool_of(st: TorchState, n: int) -> int:
    """The pool of a cached block, from its key in the free set."""
    return int(st.by_pool[n, K1] >> SIZE_SHIFT)


@kernel_step_inline
def largest_cached(st: TorchState) -> int:
    last = t_last(st.by_size)
    return int(st.by_size[last, VAL]) if last != 0 else 0

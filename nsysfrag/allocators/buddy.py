"""``buddy``: a binary buddy allocator over the device (Knuth TAOCP 2.5).

* The arena is ``[0, 2**K)`` with ``2**K >= C``; only ``[0, C)`` is usable, so it starts as the
  aligned power-of-two blocks that tile ``[0, C)``.
* A request takes a block of order ``k = max(9, ceil(log2(size)))`` (512 B minimum): the
  lowest-addressed free block of the smallest order ``>= k``, split in halves (keeping the low
  half) down to order ``k``. No such block is a simulated OOM.
* A free merges the block with its buddy (``address XOR 2**k``) while the buddy is free and
  whole, order by order.

Power-of-two blocks keep merging cheap and waste up to half of each block (internal
fragmentation, reported as allocated − requested). Physical memory is taken to be mapped in
2 MiB pages on demand: reserved memory is the pages that hold a live block (a block of 2 MiB or
more is whole pages, aligned; a smaller one never crosses a page boundary). A page with no live
block is free of all but one merged block, so the free memory inside reserved pages is exactly
the free buddy blocks smaller than a page: ``F`` = reserved − allocated, ``L`` the largest of
those blocks and ``N`` their number. For that to hold the arena is whole pages (``C`` rounded
down to 2 MiB, where ``C`` is a page or more): a tail smaller than a page would start as free
blocks in a page nothing reserved. A page goes back to the device as soon as its last block is
freed, so nothing reserved is releasable (``R`` = 0). Adjacent free blocks that are not buddies
stay separate blocks, as the allocator sees them. Arenas beyond 32 TiB are modelled as 32 TiB.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

from nsysfrag import interpreted, jit
from nsysfrag.allocators.base import I64, Outputs, RequestStream, SimResult, kernel_step
from nsysfrag.allocators.event_loop import FAILED, OVERFLOW, replay
from nsysfrag.allocators.family import PolicyFamily
from nsysfrag.allocators.treap import (
    K1,
    VAL,
    ceil_log2,
    give_id,
    new_treap,
    t_erase,
    t_insert,
    t_lower_bound,
    t_prefix,
    take_id,
)

# The kernel names this module's compiled functions through the module object: numba caches a
# compiled function that hands other compiled functions on only when it reaches them that way.
this = sys.modules[__name__]

MIN_ORDER = 9  # 512 B
PAGE_ORDER = 21  # 2 MiB: the unit memory is mapped in
MAX_ORDER = 45  # 32 TiB: the largest arena modelled (a page table of 16 M entries)

BUDDY_COUNTERS = np.dtype([
    ("next_id", np.int64),  # the highest free-block id used so far
    ("recycled", np.int64),  # free-block ids waiting in free_ids
    ("reserved", np.int64),  # bytes of the pages that hold a live block
])  # fmt: skip


class Buddy(NamedTuple):
    by_order: I64  # treap: free blocks keyed by (order, address)
    by_address: I64  # treap: free blocks keyed by address, value = size
    free_ids: I64  # recycled free-block ids
    counters: Any  # one BUDDY_COUNTERS record
    page_users: I64  # per 2 MiB page: live blocks smaller than a page in it
    address: I64  # per request: its block's address, -1 when it holds none
    order: I64  # per request: its block's order
    top_order: int


@kernel_step
def _add_free(m: Buddy, b: int, address: int, order: int) -> bool:
    """File free block ``b``; False when the id space ran out."""
    if b >= len(m.free_ids):
        return False
    t_insert(m.by_order, b, order, address, 1 << order)
    t_insert(m.by_address, b, address, 0, 1 << order)
    return True


@kernel_step
def _drop_free(m: Buddy, b: int) -> None:
    t_erase(m.by_order, b)
    t_erase(m.by_address, b)
    give_id(m.free_ids, m.counters[0], b)


@kernel_step
def _empty_cache(m: Buddy, event: int) -> int:
    """torch.cuda.empty_cache(): this model caches nothing, so nothing changes."""
    return 0


@kernel_step
def _measure(m: Buddy, allocated: int) -> tuple[int, int, int, int, int]:
    """(F, L, N, reserved, R): the free blocks smaller than a page lie in pages that hold live
    blocks (on a device under a page, the one page, while it is reserved)."""
    reserved = m.counters[0].reserved
    if reserved == 0:
        return 0, 0, 0, 0, 0
    count, largest = t_prefix(m.by_order, PAGE_ORDER)
    return reserved - allocated, max(0, largest), count, reserved, 0


@kernel_step
def _tile(m: Buddy, usable: int) -> bool:
    """The free blocks at the start: the aligned power-of-two blocks that tile [0, usable)."""
    a = 0
    while a + (1 << MIN_ORDER) <= usable:
        k = m.top_order
        while k > MIN_ORDER and (a % (1 << k) != 0 or a + (1 << k) > usable):
            k -= 1
        if not _add_free(m, take_id(m.free_ids, m.counters[0]), a, k):
            return False
        a += 1 << k
    return True


@kernel_step
def _place(m: Buddy, event: int, r: int, nbytes: int) -> int:
    k = max(MIN_ORDER, ceil_log2(nbytes))
    b = t_lower_bound(m.by_order, k, 0)
    if b == 0:
        return FAILED
    j = m.by_order[b, K1]
    a = m.by_address[b, K1]
    _drop_free(m, b)
    while j > k:
        j -= 1
        if not _add_free(m, take_id(m.free_ids, m.counters[0]), a + (1 << j), j):
            return OVERFLOW
    m.address[r] = a
    m.order[r] = k
    c = m.counters[0]
    if k >= PAGE_ORDER:
        c.reserved += 1 << k
    else:
        m.page_users[a >> PAGE_ORDER] += 1
        if m.page_users[a >> PAGE_ORDER] == 1:
            c.reserved += 1 << PAGE_ORDER
    return 1 << k


@kernel_step
def _release(m: Buddy, r: int) -> int:
    a = m.address[r]
    if a < 0:
        return 0
    k = m.order[r]
    c = m.counters[0]
    if k >= PAGE_ORDER:
        c.reserved -= 1 << k
    else:
        m.page_users[a >> PAGE_ORDER] -= 1
        if m.page_users[a >> PAGE_ORDER] == 0:
            c.reserved -= 1 << PAGE_ORDER
    m.address[r] = -1
    freed = int(1 << k)
    while k < m.top_order:
        buddy = a ^ (1 << k)
        b = t_lower_bound(m.by_address, buddy, 0)
        if b == 0 or m.by_address[b, K1] != buddy or m.by_address[b, VAL] != (1 << k):
            break
        _drop_free(m, b)
        a = min(a, buddy)
        k += 1
    if not _add_free(m, take_id(m.free_ids, m.counters[0]), a, k):
        return OVERFLOW
    return freed


@jit.njit(cache=True)
def _buddy_kernel(kind: I64, request: I64, size: I64, m: Buddy, usable: int, out: Outputs) -> int:
    """Returns the OOM count, or -1 when the free-block id space ran out (retry bigger)."""
    if not _tile(m, usable):
        return -1
    return replay(kind, request, size, m, this._place, this._release, this._empty_cache,
                  this._measure, out, 0, 0)


def simulate_buddy(stream: RequestStream, capacity_bytes: int, options: object = None) -> SimResult:
    n_req = stream.n_requests
    arena = min(capacity_bytes, 1 << MAX_ORDER)
    # Whole pages, so every free block under a page lies in a reserved page (see the module).
    unit = 1 << (PAGE_ORDER if arena >= 1 << PAGE_ORDER else MIN_ORDER)
    usable = arena // unit * unit
    top_order = max(MIN_ORDER, int(usable - 1).bit_length())
    max_free = 4 * (n_req + 1) + 4 * top_order + 64
    while True:
        model = Buddy(
            new_treap(max_free, 1), new_treap(max_free, 2), np.zeros(max_free, dtype=np.int64),
            np.zeros(1, dtype=BUDDY_COUNTERS), np.zeros((usable >> PAGE_ORDER) + 1, np.int64),
            np.full(n_req, -1, dtype=np.int64), np.zeros(n_req, dtype=np.int64), top_order,
        )  # fmt: skip
        out = Outputs.empty(stream.n_events, n_req)
        ooms = interpreted.chosen(_buddy_kernel, stream.n_events)(
            stream.kind.astype(np.int64), stream.request, stream.size, model, usable, out
        )
        if ooms >= 0:
            return SimResult.of(out, ooms)
        max_free *= 4


FAMILY = PolicyFamily("buddy", (), "binary buddy (reference)", simulate_buddy)

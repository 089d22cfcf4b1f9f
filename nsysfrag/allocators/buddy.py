"""``buddy``: a binary buddy allocator over the device (Knuth TAOCP 2.5; ALLOCATORS.md §5.1).

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
those blocks and ``N`` their number. Adjacent free blocks that are not buddies stay separate
blocks, as the allocator sees them. Arenas beyond 32 TiB are modelled as 32 TiB.
"""

from __future__ import annotations

import numba
import numpy as np

from nsysfrag.allocators.base import (
    ALLOC,
    FREE,
    I64,
    K1,
    VAL,
    RequestStream,
    SimResult,
    ceil_log2,
    empty_outputs,
    new_treap,
    t_erase,
    t_insert,
    t_lower_bound,
    t_prefix,
)

MIN_ORDER = 9  # 512 B
PAGE_ORDER = 21  # 2 MiB: the unit memory is mapped in
MAX_ORDER = 45  # 32 TiB: the largest arena modelled (a page table of 16 M entries)


@numba.njit(cache=True)
def _take_id(ids: I64, state: I64) -> int:
    # state[0]: next never-used id, state[1]: free ids on the stack
    if state[1] > 0:
        state[1] -= 1
        return int(ids[state[1]])
    state[0] += 1
    return int(state[0])


@numba.njit(cache=True)
def _add_free(fo: I64, fa: I64, b: int, address: int, order: int) -> None:
    t_insert(fo, b, order, address, 1 << order)
    t_insert(fa, b, address, 0, 1 << order)


@numba.njit(cache=True)
def _drop_free(fo: I64, fa: I64, ids: I64, state: I64, b: int) -> None:
    t_erase(fo, b)
    t_erase(fa, b)
    ids[state[1]] = b
    state[1] += 1


@numba.njit(cache=True)
def _state(fo: I64, reserved: int, allocated: int) -> tuple[int, int, int]:
    """(F, L, N): the free blocks smaller than a page lie in pages that hold live blocks."""
    count, largest = t_prefix(fo, PAGE_ORDER)
    return reserved - allocated, max(0, largest), count


@numba.njit(cache=True)
def _buddy_kernel(
    kind: I64, request: I64, size: I64, usable: int, top_order: int,
    fo: I64, fa: I64, ids: I64,
    out_f: I64, out_l: I64, out_n: I64, out_r: I64, out_a: I64, out_u: I64,
    oom_event: I64, oom_largest: I64,
) -> int:  # fmt: skip
    """Returns the OOM count, or -1 when the free-block id space ran out (retry bigger)."""
    state = np.zeros(2, dtype=np.int64)
    page_users = np.zeros((usable >> PAGE_ORDER) + 1, dtype=np.int64)
    reserved = 0
    cap = len(ids) - 1
    a = 0
    while a + (1 << MIN_ORDER) <= usable:
        k = top_order
        while k > MIN_ORDER and (a % (1 << k) != 0 or a + (1 << k) > usable):
            k -= 1
        b = _take_id(ids, state)
        if b > cap:
            return -1
        _add_free(fo, fa, b, a, k)
        a += 1 << k
    n_req = len(size)
    address = np.full(n_req, -1, dtype=np.int64)
    order = np.zeros(n_req, dtype=np.int64)
    allocated = 0
    live = 0
    ooms = 0
    for i in range(len(kind)):
        r = request[i]
        if kind[i] == ALLOC:
            k = max(MIN_ORDER, ceil_log2(size[r]))
            b = t_lower_bound(fo, k, 0)
            if b == 0:
                f, lg, nb = _state(fo, reserved, allocated)
                oom_event[ooms] = i
                oom_largest[ooms] = lg
                ooms += 1
            else:
                j = fo[b, K1]
                a = fa[b, K1]
                _drop_free(fo, fa, ids, state, b)
                while j > k:
                    j -= 1
                    h = _take_id(ids, state)
                    if h > cap:
                        return -1
                    _add_free(fo, fa, h, a + (1 << j), j)
                address[r] = a
                order[r] = k
                if k >= PAGE_ORDER:
                    reserved += 1 << k
                else:
                    page_users[a >> PAGE_ORDER] += 1
                    if page_users[a >> PAGE_ORDER] == 1:
                        reserved += 1 << PAGE_ORDER
                allocated += 1 << k
                live += size[r]
        elif kind[i] == FREE and address[r] >= 0:
            a = address[r]
            k = order[r]
            if k >= PAGE_ORDER:
                reserved -= 1 << k
            else:
                page_users[a >> PAGE_ORDER] -= 1
                if page_users[a >> PAGE_ORDER] == 0:
                    reserved -= 1 << PAGE_ORDER
            address[r] = -1
            allocated -= 1 << k
            live -= size[r]
            while k < top_order:
                buddy = a ^ (1 << k)
                b = t_lower_bound(fa, buddy, 0)
                if b == 0 or fa[b, K1] != buddy or fa[b, VAL] != (1 << k):
                    break
                _drop_free(fo, fa, ids, state, b)
                a = min(a, buddy)
                k += 1
            h = _take_id(ids, state)
            if h > cap:
                return -1
            _add_free(fo, fa, h, a, k)
        f, lg, nb = _state(fo, reserved, allocated)
        out_f[i] = f
        out_l[i] = lg
        out_n[i] = nb
        out_r[i] = reserved
        out_a[i] = allocated
        out_u[i] = live
    return ooms


def simulate_buddy(stream: RequestStream, capacity_bytes: int) -> SimResult:
    n = stream.n_events
    usable = min(capacity_bytes, 1 << MAX_ORDER) // (1 << MIN_ORDER) * (1 << MIN_ORDER)
    top_order = max(MIN_ORDER, int(usable - 1).bit_length())
    max_free = 4 * (stream.n_requests + 1) + 4 * top_order + 64
    while True:
        outs = empty_outputs(n)
        oom_event = np.zeros(stream.n_requests + 1, dtype=np.int64)
        oom_largest = np.zeros_like(oom_event)
        ooms = _buddy_kernel(
            stream.kind.astype(np.int64), stream.request, stream.size, usable, top_order,
            new_treap(max_free, 1), new_treap(max_free, 2),
            np.zeros(max_free, dtype=np.int64), *outs, oom_event, oom_largest,
        )  # fmt: skip
        if ooms >= 0:
            return SimResult.of(outs, oom_event[:ooms], oom_largest[:ooms])
        max_free *= 4

"""``best-fit`` and ``first-fit``: one growable heap of capacity C, address-ordered, coalescing.

The textbook policies (Wilson et al. 1995, ALLOCATORS.md §5.2–5.3) as a reference for what
placement alone costs. The heap is one contiguous range ``[0, top)``:

* a request (rounded up to 512 B) takes a free block (a *hole* below ``top``): best fit takes
  the smallest hole that fits, ties to the lowest address; first fit the lowest-addressed hole
  that fits. The request is carved from the hole's low end; the rest stays a hole;
* with no hole that fits, the request goes at ``top`` and the heap grows; it is a simulated OOM
  when ``top + size > C``;
* a free coalesces with the holes on both sides at once; a free range that reaches ``top``
  shrinks the heap (its pages are returned), so there is never a hole at the top.

Reserved memory is ``top`` rounded up to whole 2 MiB pages. Free memory ``F`` is the holes plus
the slack between ``top`` and that page boundary, which is one more free block; ``L`` is the
largest of them and ``N`` their number.

The heap core (:func:`heap_take`, :func:`heap_give`) is shared with ``cuda-async`` and ``slab``.
"""

from __future__ import annotations

import numba
import numpy as np

from nsysfrag.allocators.base import (
    ALLOC,
    FREE,
    I64,
    K1,
    PAGE_BYTES,
    VAL,
    RequestStream,
    SimResult,
    empty_outputs,
    new_treap,
    t_before,
    t_count,
    t_erase,
    t_first_value_at_least,
    t_insert,
    t_lower_bound,
    t_max_value,
)

GRANULARITY = 512

# Heap scalars.
H_TOP, H_HOLES, H_CAP, H_MODE, H_NEXT_ID, H_FREE_IDS = range(6)
BEST_FIT = 0
FIRST_FIT = 1


def new_heap(capacity_bytes: int, max_holes: int, mode: int) -> tuple[I64, I64, I64, I64]:
    """(address treap, size treap, scalars, free-id stack) of an empty heap."""
    hs = np.zeros(6, dtype=np.int64)
    hs[H_CAP] = capacity_bytes
    hs[H_MODE] = mode
    size_tree = new_treap(max_holes if mode == BEST_FIT else 1, seed=2)
    return new_treap(max_holes, seed=1), size_tree, hs, np.zeros(max_holes, dtype=np.int64)


@numba.njit(cache=True)
def _new_hole(hs: I64, ids: I64) -> int:
    if hs[H_FREE_IDS] > 0:
        hs[H_FREE_IDS] -= 1
        return int(ids[hs[H_FREE_IDS]])
    hs[H_NEXT_ID] += 1
    return int(hs[H_NEXT_ID])


@numba.njit(cache=True)
def _add_hole(at: I64, st: I64, hs: I64, h: int, address: int, size: int) -> None:
    t_insert(at, h, address, 0, size)
    if hs[H_MODE] == BEST_FIT:
        t_insert(st, h, size, address, size)
    hs[H_HOLES] += size


@numba.njit(cache=True)
def _drop_hole(at: I64, st: I64, hs: I64, ids: I64, h: int) -> None:
    t_erase(at, h)
    if hs[H_MODE] == BEST_FIT:
        t_erase(st, h)
    hs[H_HOLES] -= at[h, VAL]
    ids[hs[H_FREE_IDS]] = h
    hs[H_FREE_IDS] += 1


@numba.njit(cache=True)
def heap_take(at: I64, st: I64, hs: I64, ids: I64, n: int) -> int:
    """Place ``n`` bytes; return the address, or -1 when the heap cannot grow that far."""
    if hs[H_MODE] == BEST_FIT:
        h = t_lower_bound(st, n, 0)
    else:
        h = t_first_value_at_least(at, n)
    if h != 0:
        address = at[h, K1]
        size = at[h, VAL]
        _drop_hole(at, st, hs, ids, h)
        if size > n:
            _add_hole(at, st, hs, _new_hole(hs, ids), address + n, size - n)
        return int(address)
    top = hs[H_TOP]
    if top + n > hs[H_CAP]:
        return -1
    hs[H_TOP] = top + n
    return int(top)


@numba.njit(cache=True)
def heap_give(at: I64, st: I64, hs: I64, ids: I64, address: int, n: int) -> None:
    """Free ``[address, address + n)``, coalescing with the holes beside it."""
    start = address
    end = address + n
    p = t_before(at, address, 0, 0)
    if p != 0 and at[p, K1] + at[p, VAL] == address:
        start = at[p, K1]
        _drop_hole(at, st, hs, ids, p)
    s = t_lower_bound(at, end, 0)
    if s != 0 and at[s, K1] == end:
        end += at[s, VAL]
        _drop_hole(at, st, hs, ids, s)
    if end == hs[H_TOP]:
        hs[H_TOP] = start
    else:
        _add_hole(at, st, hs, _new_hole(hs, ids), start, end - start)


@numba.njit(cache=True)
def heap_state(at: I64, hs: I64, reserved: int) -> tuple[int, int, int]:
    """(F, L, N) of the heap when ``reserved`` bytes (>= top) back it."""
    slack = reserved - hs[H_TOP]
    slack = max(slack, 0)
    largest = t_max_value(at)
    largest = max(largest, slack)
    return hs[H_HOLES] + slack, largest, t_count(at) + (1 if slack > 0 else 0)


@numba.njit(cache=True)
def pages(n: int) -> int:
    """``n`` rounded up to whole 2 MiB pages."""
    return -(-n // PAGE_BYTES) * PAGE_BYTES


@numba.njit(cache=True)
def _heap_kernel(
    kind: I64, request: I64, size: I64, at: I64, st: I64, hs: I64, ids: I64,
    out_f: I64, out_l: I64, out_n: I64, out_r: I64, out_a: I64, out_u: I64,
    oom_event: I64, oom_largest: I64, retain: bool,
) -> int:  # fmt: skip
    """The heap replay; ``retain`` keeps the high-water reservation (cuda-async's pool) and
    trims it back to the top only when a request fails."""
    n_req = len(size)
    address = np.full(n_req, -1, dtype=np.int64)
    block = np.zeros(n_req, dtype=np.int64)
    allocated = 0
    live = 0
    reserved = 0
    ooms = 0
    for i in range(len(kind)):
        r = request[i]
        if kind[i] == ALLOC:
            nbytes = -(-size[r] // GRANULARITY) * GRANULARITY
            a = heap_take(at, st, hs, ids, nbytes)
            if a < 0:
                reserved = pages(hs[H_TOP])
                f, lg, nb = heap_state(at, hs, reserved)
                oom_event[ooms] = i
                oom_largest[ooms] = lg
                ooms += 1
            else:
                address[r] = a
                block[r] = nbytes
                allocated += nbytes
                live += size[r]
        elif kind[i] == FREE and address[r] >= 0:
            heap_give(at, st, hs, ids, address[r], block[r])
            address[r] = -1
            allocated -= block[r]
            live -= size[r]
        reserved = max(reserved, pages(hs[H_TOP])) if retain else pages(hs[H_TOP])
        f, lg, nb = heap_state(at, hs, reserved)
        out_f[i] = f
        out_l[i] = lg
        out_n[i] = nb
        out_r[i] = reserved
        out_a[i] = allocated
        out_u[i] = live
    return ooms


def simulate_heap(
    stream: RequestStream, capacity_bytes: int, mode: int, retain: bool = False
) -> SimResult:
    """Replay ``stream`` through a best-fit (``mode=BEST_FIT``) or first-fit heap; ``retain``
    keeps the high-water reservation (see ``cuda_async``)."""
    n = stream.n_events
    at, st, hs, ids = new_heap(capacity_bytes, stream.n_requests + 2, mode)
    outs = empty_outputs(n)
    oom_event = np.zeros(stream.n_requests + 1, dtype=np.int64)
    oom_largest = np.zeros_like(oom_event)
    ooms = _heap_kernel(
        stream.kind.astype(np.int64), stream.request, stream.size, at, st, hs, ids,
        *outs, oom_event, oom_largest, retain,
    )  # fmt: skip
    return SimResult.of(outs, oom_event[:ooms], oom_largest[:ooms])

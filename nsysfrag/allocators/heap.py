"""``best-fit`` and ``first-fit``: one growable heap of capacity C, address-ordered, coalescing.

The textbook policies (Wilson et al. 1995) as a reference for what
placement alone costs. The heap is one contiguous range ``[0, top)``:

* a request (rounded up to 512 B) takes a free block (a *hole* below ``top``): best fit takes
  the smallest hole that fits, ties to the lowest address; first fit the lowest-addressed hole
  that fits. The request is carved from the hole's low end; the rest stays a hole;
* with no hole that fits, the request goes at ``top`` and the heap grows; it is a simulated OOM
  when ``top + size > C``;
* a free coalesces with the holes on both sides at once; a free range that reaches ``top``
  shrinks the heap (its pages are returned), so there is never a hole at the top.

Reserved memory is ``top`` rounded up to whole 2 MiB pages (at most C). Free memory ``F`` is the holes plus
the slack between ``top`` and that page boundary, which is one more free block; ``L`` is the
largest of them and ``N`` their number. The heap returns pages as its top falls, so none of
``F`` is releasable (``R`` = 0: the holes lie under live blocks, the slack in the top page).

The heap core (:func:`heap_take`, :func:`heap_give`) is shared with ``cuda-async`` and ``slab``;
the events run through the shared loop of :mod:`nsysfrag.allocators.event_loop`.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

from nsysfrag import jit
from nsysfrag.allocators.base import I64, PAGE_BYTES, Outputs, RequestStream, SimResult, kernel_step
from nsysfrag.allocators.event_loop import FAILED, replay, run_kernel
from nsysfrag.allocators.family import PolicyFamily
from nsysfrag.allocators.treap import (
    K1,
    VAL,
    give_id,
    new_treap,
    t_before,
    t_count,
    t_erase,
    t_first_value_at_least,
    t_insert,
    t_lower_bound,
    t_max_value,
    take_id,
)

# The kernel names this module's compiled functions through the module object: numba caches a
# compiled function that hands other compiled functions on only when it reaches them that way.
this = sys.modules[__name__]

GRANULARITY = 512
BEST_FIT = 0
FIRST_FIT = 1

HEAP_COUNTERS = np.dtype([
    ("top", np.int64),  # the heap is [0, top)
    ("hole_bytes", np.int64),  # free bytes below top
    ("capacity", np.int64),
    ("mode", np.int64),  # BEST_FIT or FIRST_FIT
    ("next_id", np.int64),  # the highest hole id used so far
    ("recycled", np.int64),  # hole ids waiting in free_ids
])  # fmt: skip


class Heap(NamedTuple):
    """One growable heap: its holes by address (and by size for best fit)."""

    by_address: I64  # treap: holes keyed by address, value = size
    by_size: I64  # treap: holes keyed by (size, address); best fit only
    counters: Any  # one HEAP_COUNTERS record
    free_ids: I64  # recycled hole ids


def new_heap(capacity_bytes: int, max_holes: int, mode: int) -> Heap:
    counters = np.zeros(1, dtype=HEAP_COUNTERS)
    counters[0]["capacity"] = capacity_bytes
    counters[0]["mode"] = mode
    size_tree = new_treap(max_holes if mode == BEST_FIT else 1, seed=2)
    return Heap(new_treap(max_holes, seed=1), size_tree, counters, np.zeros(max_holes, np.int64))


@kernel_step
def _add_hole(h: Heap, hole: int, address: int, size: int) -> None:
    c = h.counters[0]
    t_insert(h.by_address, hole, address, 0, size)
    if c.mode == BEST_FIT:
        t_insert(h.by_size, hole, size, address, size)
    c.hole_bytes += size


@kernel_step
def _drop_hole(h: Heap, hole: int) -> None:
    c = h.counters[0]
    t_erase(h.by_address, hole)
    if c.mode == BEST_FIT:
        t_erase(h.by_size, hole)
    c.hole_bytes -= h.by_address[hole, VAL]
    give_id(h.free_ids, c, hole)


@kernel_step
def heap_take(h: Heap, n: int) -> int:
    """Place ``n`` bytes; return the address, or -1 when the heap cannot grow that far."""
    c = h.counters[0]
    if c.mode == BEST_FIT:
        hole = t_lower_bound(h.by_size, n, 0)
    else:
        hole = t_first_value_at_least(h.by_address, n)
    if hole != 0:
        address = h.by_address[hole, K1]
        size = h.by_address[hole, VAL]
        _drop_hole(h, hole)
        if size > n:
            _add_hole(h, take_id(h.free_ids, h.counters[0]), address + n, size - n)
        return int(address)
    top = c.top
    if top + n > c.capacity:
        return -1
    c.top = top + n
    return int(top)


@kernel_step
def heap_give(h: Heap, address: int, n: int) -> None:
    """Free ``[address, address + n)``, coalescing with the holes beside it."""
    at = h.by_address
    start = address
    end = address + n
    p = t_before(at, address, 0, 0)
    if p != 0 and at[p, K1] + at[p, VAL] == address:
        start = at[p, K1]
        _drop_hole(h, p)
    s = t_lower_bound(at, end, 0)
    if s != 0 and at[s, K1] == end:
        end += at[s, VAL]
        _drop_hole(h, s)
    c = h.counters[0]
    if end == c.top:
        c.top = start
    else:
        _add_hole(h, take_id(h.free_ids, h.counters[0]), start, end - start)


@kernel_step
def take_request(h: Heap, address: I64, block: I64, r: int, nbytes: int) -> int:
    """Place request ``r`` (``nbytes`` rounded up to 512 B) in the heap and note where
    (``address[r]``) and how many bytes it took (``block[r]``): those bytes, or FAILED."""
    rounded = -(-nbytes // GRANULARITY) * GRANULARITY
    a = heap_take(h, rounded)
    if a < 0:
        return FAILED
    address[r] = a
    block[r] = rounded
    return rounded


@kernel_step
def give_request(h: Heap, address: I64, block: I64, r: int) -> int:
    """Free what request ``r`` took with :func:`take_request`: its bytes, 0 when it holds
    nothing (it failed, or was freed)."""
    if address[r] < 0:
        return 0
    heap_give(h, address[r], block[r])
    address[r] = -1
    return int(block[r])


@kernel_step
def heap_top(h: Heap) -> int:
    return int(h.counters[0].top)


@kernel_step
def heap_state(h: Heap, reserved: int) -> tuple[int, int, int]:
    """(F, L, N) of the heap when ``reserved`` bytes (>= top) back it."""
    c = h.counters[0]
    slack = reserved - c.top
    slack = max(slack, 0)
    largest = t_max_value(h.by_address)
    largest = max(largest, slack)
    return c.hole_bytes + slack, largest, t_count(h.by_address) + (1 if slack > 0 else 0)


@kernel_step
def pages(n: int) -> int:
    """``n`` rounded up to whole 2 MiB pages."""
    return -(-n // PAGE_BYTES) * PAGE_BYTES


@kernel_step
def heap_pages(h: Heap) -> int:
    """The bytes backing the heap: its top in whole pages, but never more than the device
    (whose last page may be partial: its memory need not be whole pages)."""
    return min(pages(h.counters[0].top), int(h.counters[0].capacity))


# ------------------------------------------------------------------------------ the model


class HeapModel(NamedTuple):
    heap: Heap
    address: I64  # per request: where it lives, -1 when it holds nothing
    block: I64  # per request: the bytes it took
    reserved: I64  # [0]: reserved bytes now
    retain: bool  # keep the high-water reservation (cuda-async's pool)


@kernel_step
def _settle(m: HeapModel) -> None:
    """Reserved after an event: the pages under the top, or the high-water mark kept."""
    top = heap_pages(m.heap)
    m.reserved[0] = max(m.reserved[0], top) if m.retain else top


@kernel_step
def _place(m: HeapModel, event: int, r: int, nbytes: int) -> int:
    got = take_request(m.heap, m.address, m.block, r, nbytes)
    if got == FAILED:
        m.reserved[0] = heap_pages(m.heap)  # the pool trims before it gives up
        return FAILED
    _settle(m)
    return got


@kernel_step
def _release(m: HeapModel, r: int) -> int:
    got = give_request(m.heap, m.address, m.block, r)
    if got > 0:
        _settle(m)
    return got


@kernel_step
def _empty_cache(m: HeapModel, event: int) -> int:
    """torch.cuda.empty_cache(): a pool that keeps its reservation trims it to the pages under
    its top (cudaMemPoolTrimTo); a plain heap holds nothing to give back."""
    m.reserved[0] = heap_pages(m.heap)
    return 0


@kernel_step
def _measure(m: HeapModel, allocated: int) -> tuple[int, int, int, int, int]:
    """(F, L, N, reserved, R): a heap gives back only what lies above its top's page, which a
    plain heap never holds; a pool that keeps its high-water mark can trim those pages."""
    f, lg, nb = heap_state(m.heap, m.reserved[0])
    return f, lg, nb, m.reserved[0], m.reserved[0] - heap_pages(m.heap)


@jit.njit(cache=True)
def _heap_kernel(kind: I64, request: I64, size: I64, m: HeapModel, out: Outputs) -> int:
    return replay(kind, request, size, m, this._place, this._release, this._empty_cache,
                  this._measure, out, 0, 0)


def simulate_heap(
    stream: RequestStream, capacity_bytes: int, mode: int, retain: bool = False
) -> SimResult:
    """Replay ``stream`` through a best-fit (``mode=BEST_FIT``) or first-fit heap; ``retain``
    keeps the high-water reservation (see ``cuda_async``)."""
    n_req = stream.n_requests
    model = HeapModel(
        new_heap(capacity_bytes, n_req + 2, mode), np.full(n_req, -1, dtype=np.int64),
        np.zeros(n_req, dtype=np.int64), np.zeros(1, dtype=np.int64), retain,
    )  # fmt: skip
    return run_kernel(_heap_kernel, stream, model)


def _simulate_best_fit(stream: RequestStream, capacity_bytes: int, options: object) -> SimResult:
    return simulate_heap(stream, capacity_bytes, BEST_FIT)


def _simulate_first_fit(stream: RequestStream, capacity_bytes: int, options: object) -> SimResult:
    return simulate_heap(stream, capacity_bytes, FIRST_FIT)


BEST_FIT_FAMILY = PolicyFamily(
    "best-fit", ("best_fit", "bestfit"), "best-fit heap (reference)", _simulate_best_fit
)
FIRST_FIT_FAMILY = PolicyFamily(
    "first-fit", ("first_fit", "firstfit"), "first-fit heap (reference)", _simulate_first_fit
)

"""``small-pool``: the buffers under a page in a pool of their own, the rest ``cudaMalloc``'d.

What ``analyze`` advises a program whose small, short-lived buffers strand the driver's pages:
give them a pool of their own, so that they stop sharing pages with long-lived blocks, and keep
calling ``cudaMalloc`` for the rest.

* **Small requests** (under 2 MiB, the driver's page: the requests the driver packs into shared
  chunks) go to one pool: the ``best-fit`` heap (smallest hole that fits, ties to the lowest
  address, coalescing frees, 512 B granularity) that grows and shrinks at its top in whole
  pages, like a stream-ordered pool with release threshold 0.
* **Large requests** take whole pages of their own, mapped wherever the driver has free pages
  (as the driver does: a page-sized request needs free pages, not a free range of addresses).
* Both draw on one device of capacity C: a request that would take reserved memory past C is a
  simulated OOM (the pool may not grow past what the large requests leave).

Reserved memory is the pool's pages plus the large requests' pages. ``F`` is the pool's holes
and the slack above its top (the large requests' pages hold no free memory: each is its
request, rounded up to a page), ``L`` the largest of them, ``N`` their number.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numpy as np

from nsysfrag import jit
from nsysfrag.allocators.base import I64, PAGE_BYTES, Outputs, RequestStream, SimResult, kernel_step
from nsysfrag.allocators.event_loop import FAILED, replay, run_kernel
from nsysfrag.allocators.family import PolicyFamily
from nsysfrag.allocators.heap import (
    BEST_FIT,
    Heap,
    heap_give,
    heap_state,
    heap_top,
    new_heap,
    pages,
    take_request,
)

# The kernel names this module's compiled functions through the module object: numba caches a
# compiled function that hands other compiled functions on only when it reaches them that way.
this = sys.modules[__name__]

SMALL_BELOW = PAGE_BYTES  # a request under this goes to the pool


class SmallPool(NamedTuple):
    pool: Heap  # the small requests' pool; its capacity follows what the large ones leave
    address: I64  # per request: where it lives in the pool, -1 when it holds nothing there
    block: I64  # per request: the bytes it took (a large one: its whole pages)
    large: I64  # [0]: the large requests' pages; [1]: the device's capacity C


@kernel_step
def _place(m: SmallPool, event: int, r: int, nbytes: int) -> int:
    capacity = m.large[1]
    if nbytes < SMALL_BELOW:
        # The pool grows in whole pages, into what the large requests leave of the device.
        m.pool.counters[0].capacity = (capacity - m.large[0]) // PAGE_BYTES * PAGE_BYTES
        return take_request(m.pool, m.address, m.block, r, nbytes)
    whole = pages(nbytes)
    if pages(heap_top(m.pool)) + m.large[0] + whole > capacity:
        return FAILED
    m.large[0] += whole
    m.block[r] = whole
    return whole


@kernel_step
def _release(m: SmallPool, r: int) -> int:
    if m.block[r] == 0:
        return 0  # it failed: it holds nothing
    if m.address[r] >= 0:
        heap_give(m.pool, m.address[r], m.block[r])
        m.address[r] = -1
    else:
        m.large[0] -= m.block[r]
    got = m.block[r]
    m.block[r] = 0
    return int(got)


@kernel_step
def _empty_cache(m: SmallPool, event: int) -> int:
    return 0  # the pool gives its free pages back at once: nothing is cached


@kernel_step
def _measure(m: SmallPool, allocated: int) -> tuple[int, int, int, int, int]:
    """(F, L, N, reserved, R): free pages go back at once, so nothing free is releasable."""
    held = pages(heap_top(m.pool))
    f, lg, nb = heap_state(m.pool, held)
    return f, lg, nb, held + m.large[0], 0


@jit.njit(cache=True)
def _small_pool_kernel(kind: I64, request: I64, size: I64, m: SmallPool, out: Outputs) -> int:
    return replay(kind, request, size, m, this._place, this._release, this._empty_cache,
                  this._measure, out, 0, 0)  # fmt: skip


def simulate_small_pool(
    stream: RequestStream, capacity_bytes: int, options: object = None
) -> SimResult:
    n_req = stream.n_requests
    model = SmallPool(
        new_heap(capacity_bytes, n_req + 2, BEST_FIT), np.full(n_req, -1, dtype=np.int64),
        np.zeros(n_req, dtype=np.int64), np.array([0, capacity_bytes], dtype=np.int64),
    )  # fmt: skip
    return run_kernel(_small_pool_kernel, stream, model)


FAMILY = PolicyFamily(
    "small-pool",
    ("small_pool", "smallpool"),
    "buffers under 2 MiB in a pool of their own, the rest cudaMalloc on whole pages",
    simulate_small_pool,
)

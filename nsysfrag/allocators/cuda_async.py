"""``cuda-async``: a stream-ordered pool in the style of ``cudaMallocAsync``
(PyTorch's ``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``).

NVIDIA documents the pool's interface but not its placement policy (ALLOCATORS.md §3.2, §3.4),
so this model rests on assumptions, each chosen to be what the documentation implies:

* **One pool per device, one contiguous virtual range.** The pool reserves virtual address
  space and backs it with physical memory in 2 MiB pages (the VMM granularity), so free ranges
  coalesce across what were separate growth steps — unlike PyTorch's segments.
* **Best fit.** A request (rounded up to 512 B; PyTorch passes the unrounded size) takes the
  smallest free range that fits, ties to the lowest address; otherwise the pool grows at its
  top. The pool cannot grow past the capacity C: that request is a simulated OOM.
* **Stream-ordered reuse across streams.** PyTorch's backend enables
  ``cudaMemPoolReuseFollowEventDependencies``, ``ReuseAllowOpportunistic`` and
  ``ReuseAllowInternalDependencies``; the replay has no GPU timing, so a free is taken to be
  complete by the next request on any stream, and streams do not partition the pool.
* **Release threshold ∞.** PyTorch sets ``cudaMemPoolAttrReleaseThreshold = UINT64_MAX``, so
  the pool keeps its high-water reservation (reserved never shrinks on its own); only when a
  request cannot be placed does the pool trim back to the pages under its top (as
  ``cudaMemPoolTrimTo`` would) before the request fails.

So placement equals ``best-fit``'s; what differs is that reserved memory holds its high-water
mark, which shows up in free memory (``F`` includes the retained pages above the top) and in
the final reserved bytes.
"""

from __future__ import annotations

import numba
import numpy as np

from nsysfrag.allocators.base import ALLOC, FREE, I64, RequestStream, SimResult, empty_outputs
from nsysfrag.allocators.heap import (
    BEST_FIT,
    GRANULARITY,
    H_TOP,
    heap_give,
    heap_state,
    heap_take,
    new_heap,
    pages,
)


@numba.njit(cache=True)
def _pool_kernel(
    kind: I64, request: I64, size: I64, at: I64, st: I64, hs: I64, ids: I64,
    out_f: I64, out_l: I64, out_n: I64, out_r: I64, out_a: I64, out_u: I64,
    oom_event: I64, oom_largest: I64,
) -> int:  # fmt: skip
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
                reserved = pages(hs[H_TOP])  # trim the retained pages, then give up
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
        grown = pages(hs[H_TOP])
        reserved = max(reserved, grown)
        f, lg, nb = heap_state(at, hs, reserved)
        out_f[i] = f
        out_l[i] = lg
        out_n[i] = nb
        out_r[i] = reserved
        out_a[i] = allocated
        out_u[i] = live
    return ooms


def simulate_cuda_async(stream: RequestStream, capacity_bytes: int) -> SimResult:
    n = stream.n_events
    at, st, hs, ids = new_heap(capacity_bytes, stream.n_requests + 2, BEST_FIT)
    outs = empty_outputs(n)
    oom_event = np.zeros(stream.n_requests + 1, dtype=np.int64)
    oom_largest = np.zeros_like(oom_event)
    ooms = _pool_kernel(
        stream.kind.astype(np.int64), stream.request, stream.size, at, st, hs, ids,
        *outs, oom_event, oom_largest,
    )  # fmt: skip
    return SimResult.of(outs, oom_event[:ooms], oom_largest[:ooms])

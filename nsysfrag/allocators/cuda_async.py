"""``cuda-async``: a stream-ordered pool in the style of ``cudaMallocAsync``
(PyTorch's ``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``).

NVIDIA documents the pool's interface but not its placement policy,
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
  ``cudaMemPoolTrimTo`` would) before the request fails, and when the program calls
  ``torch.cuda.empty_cache()`` (PyTorch's backend calls ``cudaMemPoolTrimTo(pool, 0)``).

So placement equals ``best-fit``'s; what differs is that reserved memory holds its high-water
mark, which shows up in free memory (``F`` includes the retained pages above the top), in the
releasable bytes (those pages: a trim returns them at once) and in the final reserved bytes.
"""

from __future__ import annotations

from nsysfrag.allocators.base import RequestStream, SimResult
from nsysfrag.allocators.family import PolicyFamily, PolicyOptions
from nsysfrag.allocators.heap import BEST_FIT, simulate_heap


def simulate_cuda_async(stream: RequestStream, capacity_bytes: int, options: object = None) -> SimResult:
    return simulate_heap(stream, capacity_bytes, BEST_FIT, retain=True)


def _alloc_conf(options: PolicyOptions | None) -> str:
    return "backend:cudaMallocAsync"


FAMILY = PolicyFamily(
    "cuda-async",
    ("cuda_async", "cudamallocasync"),
    "stream-ordered pool (cudaMallocAsync)",
    simulate_cuda_async,
    alloc_conf=_alloc_conf,
)

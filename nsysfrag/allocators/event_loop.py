"""The replay loop every allocator model runs: one event at a time, the model places or
releases, and the loop keeps the per-event figures and the simulated OOMs.

A model is a state (any tuple of arrays numba can compile) and four compiled functions:

* ``place(state, event, request, nbytes) -> int``: the bytes of the block it handed out,
  :data:`FAILED` when it cannot place the request (a simulated OOM), or :data:`OVERFLOW` when
  its tables ran out of room (the caller retries with bigger ones);
* ``release(state, request) -> int``: the bytes of the block freed, 0 when the request holds
  none (it failed), or :data:`OVERFLOW`;
* ``empty_cache(state, event) -> int``: ``torch.cuda.empty_cache()``; 0 or :data:`OVERFLOW`;
* ``measure(state, allocated) -> (F, L, N, reserved, R)``: the model's free memory now
  (:class:`~nsysfrag.allocators.base.Outputs` says what each figure is).

The loop adds up allocated (block) and live (requested) bytes itself. Each model calls
:func:`replay` from its own compiled kernel, which names the four functions: numba compiles one
loop per model and caches it with the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from nsysfrag import interpreted
from nsysfrag.allocators.base import (
    ALLOC,
    EMPTY_CACHE,
    FREE,
    I64,
    Outputs,
    RequestStream,
    SimResult,
    kernel_step,
)

FAILED = -1
OVERFLOW = -2


@kernel_step
def replay(
    kind: I64, request: I64, size: I64, state: Any, place: Any, release: Any, empty_cache: Any,
    measure: Any, out: Outputs, allocated: int, live: int,
) -> int:  # fmt: skip
    """Replay the events; ``allocated`` and ``live`` are what the model holds before the first.
    Returns the number of simulated OOMs, or -1 when the model's tables overflowed."""
    ooms = 0
    for i in range(len(kind)):
        r = request[i]
        k = kind[i]
        if k == ALLOC:
            got = place(state, i, r, size[r])
            if got == OVERFLOW:
                return -1
            if got == FAILED:
                f, lg, nb, res, rel = measure(state, allocated)
                out.oom_event[ooms] = i
                out.oom_largest_free_bytes[ooms] = lg
                ooms += 1
            else:
                allocated += got
                live += size[r]
        elif k == FREE:
            got = release(state, r)
            if got == OVERFLOW:
                return -1
            if got > 0:
                allocated -= got
                live -= size[r]
        elif k == EMPTY_CACHE and empty_cache(state, i) == OVERFLOW:
            return -1
        f, lg, nb, res, rel = measure(state, allocated)
        out.free_bytes[i] = f
        out.largest_free_bytes[i] = lg
        out.free_blocks[i] = nb
        out.reserved_bytes[i] = res
        out.allocated_bytes[i] = allocated
        out.live_bytes[i] = live
        out.releasable_bytes[i] = rel
    return ooms


def run_kernel(kernel: Callable[..., int], stream: RequestStream, model: Any) -> SimResult:
    """Replay ``stream`` through a model whose kernel takes ``(kind, request, size, model,
    out)`` (compiled, or its interpreted twin for a small stream) and collect its figures."""
    out = Outputs.empty(stream.n_events, stream.n_requests)
    run = interpreted.chosen(kernel, stream.n_events)
    ooms = run(stream.kind.astype(np.int64), stream.request, stream.size, model, out)
    return SimResult.of(out, ooms)

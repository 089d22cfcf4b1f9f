"""The ``torch`` kernel: ``malloc`` and ``free`` of PyTorch's caching allocator over the state
of :mod:`~nsysfrag.allocators.torch.state`, replayed by the shared event loop, and
:func:`simulate_torch`, which sizes the tables and runs it.

``malloc`` (CUDACachingAllocator.cpp's): round the request, pick the pool, take the best cached block;
failing that, run the garbage collector (with ``garbage_collection_threshold``), ask the device
for a new segment, and on refusal release oversize blocks (``max_split_size``) and retry, then
release every cached segment and retry once more; the request is a simulated OOM when that
fails too. The block is split when ``should_split`` says so, carving the request from the low
end. ``free`` merges the block with its free neighbours in the same segment and caches it.

A free the program asked for while another stream still used the block (``record_stream``)
completes later: PyTorch polls the stream's event at each malloc and waits on all of them in
``release_cached_blocks``. Where a replay marks a request's free as pending, its block stays
out of the cache until the next malloc: its OOM path completes it first thing in
``release_cached_blocks``, or its end does (the record showed the free complete before the
next allocation).
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

from nsysfrag import interpreted, jit
from nsysfrag.allocators.base import I64, Outputs, RequestStream, SimResult, kernel_step
from nsysfrag.allocators.event_loop import FAILED, OVERFLOW, replay
from nsysfrag.allocators.torch.compiled_rules import (
    allocation_size_kernel,
    round_size_kernel,
    should_split_kernel,
)
from nsysfrag.allocators.torch.config import KernelConfig, TorchConfig
from nsysfrag.allocators.torch.segments import (
    alloc_block,
    garbage_collect,
    get_free_block,
    release_available_cached_blocks,
    release_cached_blocks,
    synchronize_and_free_events,
)
from nsysfrag.allocators.torch.state import (
    EXPANDABLE,
    TorchState,
    add_unmapped,
    cache_block,
    largest_cached,
    new_block,
    new_state,
    splice_before,
    try_merge,
)
from nsysfrag.models.segments.rules import K_SMALL_SIZE

# The kernel names this module's compiled functions through the module object: numba caches a
# compiled function that hands other compiled functions on only when it reaches them that way.
this = sys.modules[__name__]


class Model(NamedTuple):
    """What the event loop hands the torch kernel: its state and its configuration."""

    state: TorchState
    config: KernelConfig


@kernel_step
def _malloc(st: TorchState, cfg: KernelConfig, r: int, orig: int) -> int:
    """The block for request ``r`` (``orig`` bytes), or 0 when even the OOM path fails."""
    size = round_size_kernel(orig, cfg.divisions)
    small = size <= K_SMALL_SIZE
    pool = 2 * st.requests[r].stream + (1 if small else 0)
    alloc_size = allocation_size_kernel(size)
    n = get_free_block(st, cfg, pool, size)
    if n == 0:
        if cfg.gc_limit >= 0:
            garbage_collect(st, cfg)
        n = alloc_block(st, cfg, pool, size, alloc_size)
        if n == 0 and release_available_cached_blocks(st, cfg, pool, size):
            n = alloc_block(st, cfg, pool, size, alloc_size)
        if n == 0:
            release_cached_blocks(st)
            n = alloc_block(st, cfg, pool, size, alloc_size)
    if n == 0:
        return 0
    b = st.blocks
    if should_split_kernel(b[n].size - size, size, small, cfg.expandable_segments,
                           cfg.max_split_size):  # fmt: skip
        m = new_block(st)
        if m == 0:
            return 0
        b[m].address = b[n].address
        b[m].size = size
        b[m].pool = b[n].pool
        b[m].segment = b[n].segment
        splice_before(st, m, n)
        b[n].address += size
        b[n].size -= size
        cache_block(st, n)
        n = m
    b[n].allocated = 1
    b[n].requested = orig
    st.requests[r].block = n
    return n


@kernel_step
def _place(m: Model, event: int, r: int, nbytes: int) -> int:
    st = m.state
    st.counters[0].event = event
    n = _malloc(st, m.config, r, nbytes)
    if st.counters[0].pending != 0:  # the malloc's OOM path did not complete them: its end does
        synchronize_and_free_events(st)
    if st.counters[0].overflow != 0:
        return OVERFLOW
    if n == 0:
        return FAILED
    return int(st.blocks[n].size)


@kernel_step
def _release(m: Model, r: int) -> int:
    st = m.state
    n = st.requests[r].block
    if n == 0:
        return 0
    st.requests[r].block = 0
    b = st.blocks
    freed = b[n].size
    if st.requests[r].pending_free != 0:  # cached only by the next malloc (see the module)
        c = st.counters[0]
        b[n].pending_next = c.pending
        c.pending = n
        return int(freed)
    b[n].allocated = 0
    try_merge(st, n, b[n].prev)
    try_merge(st, n, b[n].next)
    cache_block(st, n)
    return OVERFLOW if st.counters[0].overflow != 0 else int(freed)


@kernel_step
def _empty_cache(m: Model, event: int) -> int:
    m.state.counters[0].event = event
    release_cached_blocks(m.state)
    return OVERFLOW if m.state.counters[0].overflow != 0 else 0


@kernel_step
def _measure(m: Model, allocated: int) -> tuple[int, int, int, int, int]:
    c = m.state.counters[0]
    return c.free_bytes, largest_cached(m.state), c.free_blocks, c.reserved, c.releasable


# --------------------------------------------------------------------- the initial layout


class InitialLayout(NamedTuple):
    """Segments and blocks the allocator holds before the stream starts (validation replays).

    Per segment: address, size, pool key and expandable segment index (-1 for a cudaMalloc
    segment). Per block, tiling its segment in address order: the segment index, address, size,
    state (1 allocated, 0 free, -1 an unmapped range of an expandable segment) and the request
    it holds (-1 for none). Per expandable segment: its virtual range.
    """

    segment_address: I64
    segment_size: I64
    segment_pool: I64
    segment_expandable: I64
    block_segment: I64
    block_address: I64
    block_size: I64
    block_state: I64
    block_request: I64
    expandables: Any  # EXPANDABLE records

    @classmethod
    def empty(cls) -> InitialLayout:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, z, z, z, z, z, z, z, np.zeros(0, dtype=EXPANDABLE))

    @property
    def reserved_bytes(self) -> int:
        return int(self.segment_size.sum())


@jit.njit(cache=True)
def _setup(layout: InitialLayout, request_size: I64, st: TorchState) -> tuple[int, int]:
    """Rebuild ``layout`` in the state; returns the allocated and live bytes it holds."""
    c = st.counters[0]
    es = st.expandables
    for e in range(len(layout.expandables)):
        es[e] = layout.expandables[e]
    c.expandable_count = len(layout.expandables)
    b = st.blocks
    prev = 0
    prev_seg = -1
    for k in range(len(layout.block_segment)):
        seg = layout.block_segment[k]
        n = new_block(st)
        b[n].address = layout.block_address[k]
        b[n].size = layout.block_size[k]
        b[n].pool = layout.segment_pool[seg]
        b[n].segment = layout.segment_expandable[seg]
        if seg == prev_seg:
            b[n].prev = prev
            b[prev].next = n
        prev = n
        prev_seg = seg
    allocated = 0
    live = 0
    for n in range(1, c.next_id + 1):
        k = n - 1
        state = layout.block_state[k]
        if state == 1:
            b[n].allocated = 1
            r = layout.block_request[k]
            if r >= 0:
                st.requests[r].block = n
                b[n].requested = request_size[r]
                live += request_size[r]
            allocated += b[n].size
        elif state == -1:
            b[n].mapped = 0
            add_unmapped(st, n)
        else:
            cache_block(st, n)
    for k in range(len(layout.segment_size)):
        c.reserved += layout.segment_size[k]
    return allocated, live


@jit.njit(cache=True)
def _torch_kernel(kind: I64, request: I64, size: I64, m: Model, layout: InitialLayout,
                  out: Outputs) -> int:  # fmt: skip
    """Returns the OOM count, or -1 when the tables overflowed (retry bigger)."""
    allocated, live = _setup(layout, size, m.state)
    return replay(kind, request, size, m, this._place, this._release, this._empty_cache,
                  this._measure, out, allocated, live)


def simulate_torch(
    stream: RequestStream,
    capacity_bytes: int,
    config: TorchConfig,
    initial: InitialLayout | None = None,
    es_va_bytes: int | None = None,
    pending_frees: I64 | None = None,
) -> SimResult:
    """Replay ``stream`` through the caching allocator with ``config`` on ``capacity_bytes``.
    ``pending_frees``: per request, 1 where its free waits on another stream until the next
    malloc (default: none)."""
    initial = initial or InitialLayout.empty()
    if pending_frees is None:
        pending_frees = np.zeros(stream.n_requests, dtype=np.int64)
    n = stream.n_events
    top_stream = max(int(stream.stream.max()) if stream.n_requests else 0,
                     int(initial.segment_pool.max() // 2) if len(initial.segment_pool) else 0)  # fmt: skip
    n_pools = 2 * (top_stream + 1)
    n_blocks = len(initial.block_segment)
    max_blocks = 2 * stream.n_requests + 2 * n_blocks + 4 * n_pools + 1024
    max_es = 4 * n_pools + len(initial.expandables) + 16
    max_log = 4 * n + 4 * n_blocks + 64
    cfg = config.kernel_config(capacity_bytes, es_va_bytes)
    kind = stream.kind.astype(np.int64)
    while True:
        st = new_state(max_blocks, max_es, max_log, stream.stream, pending_frees)
        out = Outputs.empty(n, stream.n_requests)
        kernel = interpreted.chosen(_torch_kernel, n)
        ooms = kernel(kind, stream.request, stream.size, Model(st, cfg), initial, out)
        if ooms >= 0:
            break
        max_blocks *= 4
        max_es *= 4
        max_log *= 4
    k = int(st.counters[0]["log_length"])
    segment_log = {name: st.log[name][:k].copy() for name in ("kind", "address", "size", "event")}
    return SimResult.of(out, ooms, segment_log)

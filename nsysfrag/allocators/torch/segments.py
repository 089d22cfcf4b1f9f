"""Getting memory for the ``torch`` kernel and giving it back: the cached-block search
(``get_free_block``), new segments (``alloc_block``: cudaMalloc, or mapping pages of an
expandable segment), and the three ways memory returns to CUDA — ``release_cached_blocks``
(the OOM path and ``empty_cache``; it first completes the frees that wait on other streams), ``release_available_cached_blocks`` (oversize blocks, only
with ``max_split_size``) and the garbage collector (``garbage_collection_threshold``).
"""

from __future__ import annotations

from nsysfrag.allocators.base import UNLIMITED, kernel_step
from nsysfrag.allocators.torch.config import KernelConfig
from nsysfrag.allocators.torch.state import (
    LOG_ALLOC,
    LOG_FREE,
    LOG_MAP,
    LOG_UNMAP,
    SIZE_SHIFT,
    TorchState,
    add_unmapped,
    cache_block,
    candidates,
    delete_block,
    log_call,
    new_block,
    pool_of,
    remove_unmapped,
    splice_after,
    splice_before,
    try_merge,
    uncache_block,
)
from nsysfrag.allocators.treap import K1, t_before, t_lower_bound, t_next, t_prev
from nsysfrag.models.segments.rules import K_LARGE_BUFFER, K_ROUND_LARGE, K_SMALL_BUFFER


@kernel_step
def _expandable_size(st: TorchState, n: int) -> int:
    """A block's size counting the unmapped range right after it."""
    b = st.blocks
    nx = b[n].next
    return int(b[n].size + (b[nx].size if nx != 0 and b[nx].mapped == 0 else 0))


@kernel_step
def get_free_block(st: TorchState, cfg: KernelConfig, pool: int, size: int) -> int:
    """Best fit in the pool (smallest size, then lowest address), or 0; the oversize rules of
    max_split_size refuse without trying the next candidate."""
    b = st.blocks
    if cfg.gc_limit >= 0:
        st.gc_clock[pool & 1] += 1
    tf = st.by_pool
    n = t_lower_bound(tf, (pool << SIZE_SHIFT) | size, 0)
    if n == 0 or pool_of(st, n) != pool:
        return 0
    if b[n].segment >= 0:
        if cfg.expandable_segments:
            nx = t_next(tf, n)
            while (b[n].segment >= 0 and nx != 0 and pool_of(st, nx) == pool
                   and _expandable_size(st, nx) < _expandable_size(st, n)):  # fmt: skip
                n = nx
                nx = t_next(tf, n)
        else:
            while n != 0 and pool_of(st, n) == pool and b[n].segment >= 0:
                n = t_next(tf, n)
            if n == 0 or pool_of(st, n) != pool:
                return 0
    mss = cfg.max_split_size
    if size < mss and b[n].size >= mss:
        return 0
    if size >= mss and b[n].size >= size + cfg.max_non_split_rounding:
        return 0
    uncache_block(st, n)
    return n


@kernel_step
def _release_block(st: TorchState, n: int) -> bool:
    """cudaFree a whole free segment."""
    b = st.blocks
    if b[n].segment >= 0 or b[n].prev != 0 or b[n].next != 0:
        return False
    log_call(st, LOG_FREE, b[n].address, b[n].size)
    st.counters[0].reserved -= b[n].size
    uncache_block(st, n)
    delete_block(st, n)
    return True


@kernel_step
def _unmap_block(st: TorchState, n: int) -> None:
    """Unmap the whole free pages of a free expandable block."""
    b = st.blocks
    e = b[n].segment
    base = st.expandables[e].base
    page = st.expandables[e].page
    lo = b[n].address - base
    hi = lo + b[n].size
    begin = -(-lo // page)
    end = hi // page
    if begin >= end:
        return
    uncache_block(st, n)
    ustart = base + begin * page
    usize = (end - begin) * page
    before = ustart - b[n].address
    after = b[n].size - before - usize
    if before > 0:
        m = new_block(st)
        if m == 0:
            return
        b[m].address = b[n].address
        b[m].size = before
        b[m].pool = b[n].pool
        b[m].segment = e
        splice_before(st, m, n)
        cache_block(st, m)
    if after > 0:
        m = new_block(st)
        if m == 0:
            return
        b[m].address = ustart + usize
        b[m].size = after
        b[m].pool = b[n].pool
        b[m].segment = e
        splice_after(st, m, n)
        cache_block(st, m)
    b[n].address = ustart
    b[n].size = usize
    b[n].mapped = 0
    try_merge(st, n, b[n].prev)
    try_merge(st, n, b[n].next)
    add_unmapped(st, n)
    st.counters[0].reserved -= usize
    log_call(st, LOG_UNMAP, ustart, usize)
    if b[n].prev == 0 and b[n].next == 0:  # the whole segment is unmapped: release it
        remove_unmapped(st, n)
        delete_block(st, n)


@kernel_step
def synchronize_and_free_events(st: TorchState) -> None:
    """Complete every free still waiting on another stream: merge and cache its block."""
    b = st.blocks
    c = st.counters[0]
    while c.pending != 0:
        n = c.pending
        c.pending = b[n].pending_next
        b[n].pending_next = 0
        b[n].allocated = 0
        try_merge(st, n, b[n].prev)
        try_merge(st, n, b[n].next)
        cache_block(st, n)


@kernel_step
def release_cached_blocks(st: TorchState) -> None:
    """Complete the pending frees, then free every whole free segment and unmap the free
    pages of expandable segments."""
    synchronize_and_free_events(st)
    for k in range(candidates(st)):
        n = st.scratch[k]
        if st.blocks[n].segment < 0:
            _release_block(st, n)
        else:
            _unmap_block(st, n)


@kernel_step
def release_available_cached_blocks(st: TorchState, cfg: KernelConfig, pool: int, size: int
                                    ) -> bool:  # fmt: skip
    """Free oversize blocks (only with max_split_size): one that is large enough, else the
    largest ones down to max_split_size until enough is released."""
    b = st.blocks
    mss = cfg.max_split_size
    if mss >= UNLIMITED:
        return False
    key = max(mss, size)
    tf = st.by_pool
    n = t_lower_bound(tf, (pool << SIZE_SHIFT) | key, 0)
    # Newer PyTorch never releases an expandable block here: it looks below it instead.
    if n == 0 or pool_of(st, n) != pool or b[n].segment >= 0:
        it = t_before(tf, (pool << SIZE_SHIFT) | key, 0, 0)
        if it == 0:
            return False
        released = 0
        while released < key and it != 0 and b[it].size >= mss and pool_of(st, it) == pool:
            cur = it
            it = t_prev(tf, cur)
            freed = b[cur].size
            if _release_block(st, cur):
                released += freed
        return bool(released >= key)
    return _release_block(st, n)


@kernel_step
def garbage_collect(st: TorchState, cfg: KernelConfig) -> None:
    """garbage_collect_cached_blocks: free whole large-pool segments of at least mean age."""
    b = st.blocks
    reserved = st.counters[0].reserved
    if reserved <= cfg.gc_limit:
        return
    target = reserved - cfg.gc_limit
    blocks = st.scratch  # the candidates, then (in place) the freeable ones; 0 once freed
    k = 0
    total_age = 0
    for j in range(candidates(st)):
        n = blocks[j]
        if b[n].segment < 0 and (b[n].pool & 1) == 0:
            blocks[k] = n
            total_age += st.gc_clock[b[n].pool & 1] - b[n].gc_base
            k += 1
    freeable = k
    if freeable == 0:
        return
    reclaimed = 0
    freed = True
    while reclaimed < target and freed and freeable > 0:
        threshold = total_age / freeable
        freed = False
        for j in range(k):
            n = blocks[j]
            if n == 0:
                continue
            age = st.gc_clock[b[n].pool & 1] - b[n].gc_base
            if age >= threshold:
                freed = True
                reclaimed += b[n].size
                total_age -= age
                freeable -= 1
                blocks[j] = 0
                _release_block(st, n)


@kernel_step
def _map_block(st: TorchState, cfg: KernelConfig, n: int, size: int) -> bool:
    """Map the pages under the first ``size`` bytes of unmapped range ``n``."""
    b = st.blocks
    c = st.counters[0]
    e = b[n].segment
    base = st.expandables[e].base
    page = st.expandables[e].page
    begin = (b[n].address - base) // page
    end = -(-(b[n].address + size - base) // page)
    msize = (end - begin) * page
    if c.reserved + msize > cfg.capacity:
        return False
    start = b[n].address
    remove_unmapped(st, n)
    b[n].mapped = 1
    if msize < b[n].size:
        m = new_block(st)
        if m == 0:
            return False
        b[m].address = start + msize
        b[m].size = b[n].size - msize
        b[m].mapped = 0
        b[m].pool = b[n].pool
        b[m].segment = e
        splice_after(st, m, n)
        add_unmapped(st, m)
        b[n].size = msize
    try_merge(st, n, b[n].prev)
    try_merge(st, n, b[n].next)
    cache_block(st, n)
    c.reserved += msize
    log_call(st, LOG_MAP, start, msize)
    return True


@kernel_step
def _new_expandable_segment(st: TorchState, cfg: KernelConfig, pool: int) -> int:
    """Reserve a new expandable segment's virtual range: one unmapped block."""
    c = st.counters[0]
    es = st.expandables
    e = c.expandable_count
    if e >= len(es):
        c.overflow = 1
        return 0
    page = K_SMALL_BUFFER if pool & 1 else K_LARGE_BUFFER
    va = -(-cfg.expandable_va // page) * page
    base = -(-c.next_address // K_LARGE_BUFFER) * K_LARGE_BUFFER
    c.next_address = base + va
    c.expandable_count = e + 1
    es[e].base = base
    es[e].va = va
    es[e].page = page
    es[e].pool = pool
    n = new_block(st)
    if n == 0:
        return 0
    b = st.blocks
    b[n].address = base
    b[n].size = va
    b[n].mapped = 0
    b[n].pool = pool
    b[n].segment = e
    add_unmapped(st, n)
    return n


@kernel_step
def _find_expandable_block(st: TorchState, cfg: KernelConfig, pool: int, size: int) -> int:
    """The lowest unmapped range that, with the free mapped block below it, holds ``size``."""
    b = st.blocks
    tu = st.unmapped
    it = t_lower_bound(tu, pool, 0)
    while it != 0 and tu[it, K1] == pool:
        c = it
        p = b[c].prev
        if p != 0 and b[p].allocated == 0:
            c = p
        nbytes = 0
        x = c
        while nbytes < size and x != 0 and b[x].allocated == 0:
            nbytes += b[x].size
            x = b[x].next
        if nbytes >= size:
            return c
        it = t_next(tu, it)
    return _new_expandable_segment(st, cfg, pool)


@kernel_step
def _try_allocate_expandable_block(st: TorchState, cfg: KernelConfig, pool: int, size: int
                                   ) -> int:  # fmt: skip
    b = st.blocks
    c = _find_expandable_block(st, cfg, pool, size)
    if c == 0:
        return 0
    if b[c].mapped == 0 and not _map_block(st, cfg, c, min(b[c].size, size)):
        return 0
    while b[c].size < size:
        remaining = size - b[c].size
        nc = b[c].next
        if nc == 0 or not _map_block(st, cfg, nc, min(remaining, b[nc].size)):
            return 0
        c = nc
    uncache_block(st, c)
    return c


@kernel_step
def alloc_block(st: TorchState, cfg: KernelConfig, pool: int, size: int, alloc_size: int) -> int:
    """A new segment (cudaMalloc) or newly mapped pages holding ``size``; 0 when the device
    refuses (the capacity would be exceeded)."""
    c = st.counters[0]
    if cfg.gc_limit >= 0 and c.reserved + alloc_size > cfg.capacity:
        return 0  # set_fraction: the allowed maximum is the capacity
    if cfg.expandable_segments:
        return _try_allocate_expandable_block(st, cfg, pool, size)
    if c.reserved + alloc_size > cfg.capacity:
        return 0
    n = new_block(st)
    if n == 0:
        return 0
    b = st.blocks
    b[n].address = c.next_address
    c.next_address += -(-alloc_size // K_ROUND_LARGE) * K_ROUND_LARGE
    b[n].size = alloc_size
    b[n].pool = pool
    c.reserved += alloc_size
    log_call(st, LOG_ALLOC, b[n].address, alloc_size)
    return n

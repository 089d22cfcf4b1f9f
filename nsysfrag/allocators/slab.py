"""``slab``: segregated size classes over 2 MiB slabs, large objects best fit
(simple segregated storage; ALLOCATORS.md §5.4).

* **Classes.** 512 B, 1 KiB, 1.5 KiB, 2 KiB, then four classes per doubling (jemalloc's
  spacing: ``b + b/4, b + b/2, b + 3b/4, 2b``) up to 1 MiB. A request of at most 1 MiB takes a
  slot of the smallest class that holds it.
* **Slabs.** A class owns 2 MiB slabs (``kSmallBuffer``), each cut into ``2 MiB // class``
  equal slots; a request takes a slot of the class's lowest-addressed slab with a free slot
  (the most recently freed slot first), or a new slab. Slots never split or merge; a slab goes
  back to the heap only when it is completely empty.
* **Large objects** (over 1 MiB, rounded up to 512 B) and slabs share one best-fit heap (the
  ``best-fit`` model's), which grows up to the capacity C; a slab or large object that does not
  fit is a simulated OOM.

Reserved memory is the heap's top rounded up to 2 MiB pages. ``F`` = the heap's free blocks
plus the free slots of all slabs; ``N`` counts the heap's free blocks plus each slab with a free
slot once (its free slots serve only its class, so a run of them is not one larger block);
``L`` is the largest heap free block, or the largest class with a free slot if that is larger.
The unusable tail of a slab (``2 MiB mod class``) is internal fragmentation, not free memory.
"""

from __future__ import annotations

import numba
import numpy as np

from nsysfrag.allocators.base import (
    ALLOC,
    FREE,
    I64,
    K1,
    MiB,
    RequestStream,
    SimResult,
    empty_outputs,
    new_treap,
    t_count,
    t_erase,
    t_insert,
    t_last,
    t_lower_bound,
)
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

SLAB_BYTES = 2 * MiB
LARGEST_CLASS = 1 * MiB


def size_classes() -> I64:
    """512, 1024, 1536, 2048, then 4 per doubling up to 1 MiB."""
    classes = [512, 1024, 1536, 2048]
    base = 2048
    while base < LARGEST_CLASS:
        classes += [base + base // 4 * i for i in range(1, 5)]
        base *= 2
    return np.array(classes, dtype=np.int64)


def class_of(sizes: I64, classes: I64) -> I64:
    """Index of the smallest class holding each size, -1 above the largest class."""
    idx = np.searchsorted(classes, sizes, side="left").astype(np.int64)
    idx[sizes > classes[-1]] = -1
    return idx


@numba.njit(cache=True)
def _slab_state(at: I64, hs: I64, nf: I64, classes: I64, free_slot_bytes: int) -> tuple[int, int, int, int]:
    reserved = pages(hs[H_TOP])
    f, largest, n = heap_state(at, hs, reserved)
    last = t_last(nf)
    if last != 0 and classes[nf[last, K1]] > largest:
        largest = classes[nf[last, K1]]
    return f + free_slot_bytes, largest, n + t_count(nf), reserved


@numba.njit(cache=True)
def _slab_kernel(
    kind: I64, request: I64, size: I64, klass: I64, classes: I64,
    at: I64, st: I64, hs: I64, ids: I64, nf: I64,
    out_f: I64, out_l: I64, out_n: I64, out_r: I64, out_a: I64, out_u: I64,
    oom_event: I64, oom_largest: I64,
) -> int:  # fmt: skip
    n_req = len(size)
    max_slabs = len(nf)
    s_addr = np.zeros(max_slabs, dtype=np.int64)
    s_class = np.zeros(max_slabs, dtype=np.int64)
    s_live = np.zeros(max_slabs, dtype=np.int64)
    s_bump = np.zeros(max_slabs, dtype=np.int64)
    s_head = np.zeros(max_slabs, dtype=np.int64)
    slab_ids = np.zeros(max_slabs, dtype=np.int64)
    next_slab = 0
    free_slabs = 0
    r_slab = np.zeros(n_req, dtype=np.int64)
    r_slot = np.zeros(n_req, dtype=np.int64)
    r_addr = np.full(n_req, -1, dtype=np.int64)
    r_block = np.zeros(n_req, dtype=np.int64)
    free_next = np.zeros(n_req, dtype=np.int64)
    free_slot_bytes = 0
    allocated = 0
    live = 0
    ooms = 0
    for i in range(len(kind)):
        r = request[i]
        if kind[i] == ALLOC:
            c = klass[r]
            placed = True
            if c < 0:
                nbytes = -(-size[r] // GRANULARITY) * GRANULARITY
                a = heap_take(at, st, hs, ids, nbytes)
                if a < 0:
                    placed = False
                else:
                    r_addr[r] = a
                    r_block[r] = nbytes
            else:
                slot_bytes = classes[c]
                slots = SLAB_BYTES // slot_bytes
                s = t_lower_bound(nf, c, 0)
                if s == 0 or nf[s, K1] != c:
                    a = heap_take(at, st, hs, ids, SLAB_BYTES)
                    if a < 0:
                        placed = False
                    else:
                        if free_slabs > 0:
                            free_slabs -= 1
                            s = slab_ids[free_slabs]
                        else:
                            next_slab += 1
                            s = next_slab
                        s_addr[s] = a
                        s_class[s] = c
                        s_live[s] = 0
                        s_bump[s] = 0
                        s_head[s] = -1
                        t_insert(nf, s, c, a, 0)
                        free_slot_bytes += slots * slot_bytes
                if placed:
                    if s_head[s] >= 0:
                        q = s_head[s]
                        r_slot[r] = r_slot[q]
                        s_head[s] = free_next[q]
                    else:
                        r_slot[r] = s_bump[s]
                        s_bump[s] += 1
                    s_live[s] += 1
                    free_slot_bytes -= slot_bytes
                    if s_live[s] == slots:
                        t_erase(nf, s)
                    r_slab[r] = s
                    r_addr[r] = s_addr[s] + r_slot[r] * slot_bytes
                    r_block[r] = slot_bytes
            if placed:
                allocated += r_block[r]
                live += size[r]
            else:
                f, lg, nb, res = _slab_state(at, hs, nf, classes, free_slot_bytes)
                oom_event[ooms] = i
                oom_largest[ooms] = lg
                ooms += 1
        elif kind[i] == FREE and r_addr[r] >= 0:
            allocated -= r_block[r]
            live -= size[r]
            c = klass[r]
            if c < 0:
                heap_give(at, st, hs, ids, r_addr[r], r_block[r])
            else:
                s = r_slab[r]
                slot_bytes = classes[c]
                slots = SLAB_BYTES // slot_bytes
                if s_live[s] == slots:
                    t_insert(nf, s, c, s_addr[s], 0)
                free_next[r] = s_head[s]
                s_head[s] = r
                s_live[s] -= 1
                free_slot_bytes += slot_bytes
                if s_live[s] == 0:
                    t_erase(nf, s)
                    heap_give(at, st, hs, ids, s_addr[s], SLAB_BYTES)
                    free_slot_bytes -= slots * slot_bytes
                    slab_ids[free_slabs] = s
                    free_slabs += 1
            r_addr[r] = -1
        f, lg, nb, res = _slab_state(at, hs, nf, classes, free_slot_bytes)
        out_f[i] = f
        out_l[i] = lg
        out_n[i] = nb
        out_r[i] = res
        out_a[i] = allocated
        out_u[i] = live
    return ooms


def simulate_slab(stream: RequestStream, capacity_bytes: int) -> SimResult:
    n = stream.n_events
    classes = size_classes()
    klass = class_of(stream.size, classes)
    max_slabs = int(min(stream.n_requests, capacity_bytes // SLAB_BYTES)) + 2
    at, st, hs, ids = new_heap(capacity_bytes, stream.n_requests + 2, BEST_FIT)
    outs = empty_outputs(n)
    oom_event = np.zeros(stream.n_requests + 1, dtype=np.int64)
    oom_largest = np.zeros_like(oom_event)
    ooms = _slab_kernel(
        stream.kind.astype(np.int64), stream.request, stream.size, klass, classes,
        at, st, hs, ids, new_treap(max_slabs, 4), *outs, oom_event, oom_largest,
    )  # fmt: skip
    return SimResult.of(outs, oom_event[:ooms], oom_largest[:ooms])

"""``slab``: segregated size classes over 2 MiB slabs, large objects best fit
(simple segregated storage; Wilson et al. 1995).

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

Reserved memory is the heap's top rounded up to 2 MiB pages (at most C). ``F`` = the heap's
free blocks plus the free slots of all slabs; ``N`` counts the heap's free blocks plus each slab
with a free slot once (its free slots serve only its class, so a run of them is not one larger
block); ``L`` is the largest heap free block, or the largest class with a free slot if that is
larger.
The unusable tail of a slab (``2 MiB mod class``) is internal fragmentation, not free memory.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

from nsysfrag import jit
from nsysfrag.allocators.base import I64, MiB, Outputs, RequestStream, SimResult, kernel_step
from nsysfrag.allocators.event_loop import FAILED, replay, run_kernel
from nsysfrag.allocators.family import PolicyFamily
from nsysfrag.allocators.heap import (
    BEST_FIT,
    Heap,
    heap_give,
    heap_pages,
    heap_state,
    heap_take,
    new_heap,
    take_request,
)
from nsysfrag.allocators.treap import (
    K1,
    give_id,
    new_treap,
    t_count,
    t_erase,
    t_insert,
    t_last,
    t_lower_bound,
    take_id,
)

# The kernel names this module's compiled functions through the module object: numba caches a
# compiled function that hands other compiled functions on only when it reaches them that way.
this = sys.modules[__name__]

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


SLAB_COUNTERS = np.dtype([
    ("next_id", np.int64),  # the highest slab id used so far
    ("recycled", np.int64),  # slab ids waiting in slab_ids
    ("free_slot_bytes", np.int64),  # free slots of all slabs
])  # fmt: skip


class Slabs(NamedTuple):
    """The slabs (one row per slab id; id 0 unused) and what each request holds."""

    heap: Heap  # large objects and the slabs themselves
    with_free_slots: I64  # treap: slabs with a free slot, keyed by (class, address)
    classes: I64  # slot bytes per class
    klass: I64  # per request: its class, -1 for a large object
    slab_address: I64
    slab_class: I64
    slab_live: I64  # slots in use
    slab_bump: I64  # slots ever handed out (the next never-used slot)
    slab_head: I64  # the most recently freed slot's request, -1 for none
    slab_ids: I64  # recycled slab ids
    request_slab: I64
    request_slot: I64
    request_address: I64  # -1 when the request holds nothing
    request_bytes: I64
    free_next: I64  # per request: the next freed slot's request in its slab's free list
    counters: Any  # one SLAB_COUNTERS record


@kernel_step
def _empty_cache(m: Slabs, event: int) -> int:
    """torch.cuda.empty_cache(): this model caches nothing, so nothing changes."""
    return 0


@kernel_step
def _measure(m: Slabs, allocated: int) -> tuple[int, int, int, int, int]:
    """(F, L, N, reserved, R): an empty slab goes back to the heap at once and the heap's top
    falls with it, so nothing free is releasable (R = 0)."""
    reserved = heap_pages(m.heap)
    f, largest, n = heap_state(m.heap, reserved)
    nf = m.with_free_slots
    last = t_last(nf)
    if last != 0 and m.classes[nf[last, K1]] > largest:
        largest = m.classes[nf[last, K1]]
    return f + m.counters[0].free_slot_bytes, largest, n + t_count(nf), reserved, 0


@kernel_step
def _new_slab(m: Slabs, c: int) -> int:
    """A fresh slab of class ``c`` from the heap, or 0 when the heap is full."""
    a = heap_take(m.heap, SLAB_BYTES)
    if a < 0:
        return 0
    k = m.counters[0]
    s = take_id(m.slab_ids, k)
    m.slab_address[s] = a
    m.slab_class[s] = c
    m.slab_live[s] = 0
    m.slab_bump[s] = 0
    m.slab_head[s] = -1
    t_insert(m.with_free_slots, s, c, a, 0)
    k.free_slot_bytes += (SLAB_BYTES // m.classes[c]) * m.classes[c]
    return int(s)


@kernel_step
def _place(m: Slabs, event: int, r: int, nbytes: int) -> int:
    c = m.klass[r]
    if c < 0:
        return take_request(m.heap, m.request_address, m.request_bytes, r, nbytes)
    slot_bytes = m.classes[c]
    slots = SLAB_BYTES // slot_bytes
    s = t_lower_bound(m.with_free_slots, c, 0)
    if s == 0 or m.with_free_slots[s, K1] != c:
        s = _new_slab(m, c)
        if s == 0:
            return FAILED
    if m.slab_head[s] >= 0:
        q = m.slab_head[s]
        m.request_slot[r] = m.request_slot[q]
        m.slab_head[s] = m.free_next[q]
    else:
        m.request_slot[r] = m.slab_bump[s]
        m.slab_bump[s] += 1
    m.slab_live[s] += 1
    m.counters[0].free_slot_bytes -= slot_bytes
    if m.slab_live[s] == slots:
        t_erase(m.with_free_slots, s)
    m.request_slab[r] = s
    m.request_address[r] = m.slab_address[s] + m.request_slot[r] * slot_bytes
    m.request_bytes[r] = slot_bytes
    return int(slot_bytes)


@kernel_step
def _release(m: Slabs, r: int) -> int:
    if m.request_address[r] < 0:
        return 0
    c = m.klass[r]
    if c < 0:
        heap_give(m.heap, m.request_address[r], m.request_bytes[r])
    else:
        s = m.request_slab[r]
        slot_bytes = m.classes[c]
        slots = SLAB_BYTES // slot_bytes
        if m.slab_live[s] == slots:
            t_insert(m.with_free_slots, s, c, m.slab_address[s], 0)
        m.free_next[r] = m.slab_head[s]
        m.slab_head[s] = r
        m.slab_live[s] -= 1
        k = m.counters[0]
        k.free_slot_bytes += slot_bytes
        if m.slab_live[s] == 0:
            t_erase(m.with_free_slots, s)
            heap_give(m.heap, m.slab_address[s], SLAB_BYTES)
            k.free_slot_bytes -= slots * slot_bytes
            give_id(m.slab_ids, k, s)
    m.request_address[r] = -1
    return int(m.request_bytes[r])


@jit.njit(cache=True)
def _slab_kernel(kind: I64, request: I64, size: I64, m: Slabs, out: Outputs) -> int:
    return replay(kind, request, size, m, this._place, this._release, this._empty_cache,
                  this._measure, out, 0, 0)


def simulate_slab(stream: RequestStream, capacity_bytes: int, options: object = None) -> SimResult:
    n_req = stream.n_requests
    classes = size_classes()
    max_slabs = int(min(n_req, capacity_bytes // SLAB_BYTES)) + 2

    def zeros(n: int) -> I64:
        return np.zeros(n, dtype=np.int64)

    model = Slabs(
        new_heap(capacity_bytes, n_req + 2, BEST_FIT), new_treap(max_slabs, 4), classes,
        class_of(stream.size, classes), zeros(max_slabs), zeros(max_slabs), zeros(max_slabs),
        zeros(max_slabs), zeros(max_slabs), zeros(max_slabs), zeros(n_req), zeros(n_req),
        np.full(n_req, -1, dtype=np.int64), zeros(n_req), zeros(n_req), np.zeros(1, dtype=SLAB_COUNTERS),
    )  # fmt: skip
    return run_kernel(_slab_kernel, stream, model)


FAMILY = PolicyFamily("slab", (), "size-class slabs (reference)", simulate_slab)

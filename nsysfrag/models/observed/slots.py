"""Slots for the observed replay: each placed block's start offset ranked among all of them.

The replay (``kernel``) indexes live blocks by slot, so the ranks must be known before it
starts. A hash table keeps the assignment linear in the events; only the distinct offsets are
sorted.
"""

from __future__ import annotations

import numpy as np

from nsysfrag import interpreted, jit
from nsysfrag.events import I64, BoolArray
from nsysfrag.models.series import NO_BLOCK



def assign_slots(offset: I64, is_block: BoolArray, is_free: BoolArray) -> tuple[I64, I64]:
    """Slots for a space's events: the distinct start offsets of placed blocks, ascending, and
    each event's slot — a block's own, a free's when its offset is exactly a block start (and
    >= 0), else NO_BLOCK. A hash table keeps this linear; only the distinct offsets are sorted."""
    distinct = interpreted.chosen(_distinct, len(offset))(offset, is_block)
    slot_offset = np.sort(distinct)
    slot = interpreted.chosen(_slots, len(offset))(offset, is_block, is_free, slot_offset)
    # The replay trusts these slots (a wrong one would corrupt its lists): check the cheap part.
    if not (slot[is_block] >= 0).all():
        raise AssertionError("slot assignment lost a block")
    return slot_offset, slot


@jit.njit(cache=True, nogil=True)
def _table_size(n):  # type: ignore[no-untyped-def]
    size = 16
    while size < 2 * n + 1:
        size *= 2
    return size


@jit.njit(cache=True, nogil=True)
def _hash(key, mask):  # type: ignore[no-untyped-def]
    # splitmix64's finalizer, in unsigned arithmetic (signed overflow is undefined behaviour to
    # LLVM, which then hashes the same key differently in different places): offsets are
    # multiples of 512 or even 2 MiB, so the low bits alone would all collide.
    x = np.uint64(key)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return np.int64((x ^ (x >> np.uint64(31))) & np.uint64(mask))


@jit.njit(cache=True, nogil=True)
def _distinct(offset, is_block):  # type: ignore[no-untyped-def]
    size = _table_size(len(offset))
    keys = np.full(size, -1, dtype=np.int64)  # offsets of blocks are >= 0: -1 marks empty
    out = np.empty(len(offset), dtype=np.int64)
    n = 0
    for i in range(len(offset)):
        if not is_block[i]:
            continue
        key = offset[i]
        h = _hash(key, size - 1)
        while keys[h] != -1 and keys[h] != key:
            h = (h + 1) & (size - 1)
        if keys[h] == -1:
            keys[h] = key
            out[n] = key
            n += 1
    return out[:n].copy()


@jit.njit(cache=True, nogil=True)
def _slots(offset, is_block, is_free, slot_offset):  # type: ignore[no-untyped-def]
    size = _table_size(len(slot_offset))
    keys = np.full(size, -1, dtype=np.int64)
    values = np.zeros(size, dtype=np.int64)
    for rank in range(len(slot_offset)):
        key = slot_offset[rank]
        h = _hash(key, size - 1)
        while keys[h] != -1:
            h = (h + 1) & (size - 1)
        keys[h] = key
        values[h] = rank
    slot = np.full(len(offset), NO_BLOCK, dtype=np.int64)
    for i in range(len(offset)):
        key = offset[i]
        if key < 0 or not (is_block[i] or is_free[i]):
            continue
        h = _hash(key, size - 1)
        while keys[h] != -1:
            if keys[h] == key:
                slot[i] = values[h]
                break
            h = (h + 1) & (size - 1)
    return slot

"""Whose release a burst of segment frees or unmaps was, and what the cache says about it.

PyTorch's caching allocator gives memory back to the device in three places (docs/whatif.md,
"Programs that give memory back"): the program's
``torch.cuda.empty_cache()``; a malloc's out-of-memory path (``release_cached_blocks`` before
the retry, or before the ``oom`` it then records); and the garbage collector
(``garbage_collection_threshold`` under a memory fraction) before a cudaMalloc. The allocator's
own two run only after its cache search failed: ``get_free_block`` found no free block of the
request's stream and pool that its size rules accept. So when a burst released a whole free
segment that the very next request could have taken, the allocator did not make that burst —
the program did, and the next malloc needed a new segment only because the cache was gone.

:func:`served_from_cache` reads that evidence from a device's history alone (no model is run),
conservatively: where the record cannot say whether a released block would have been taken
(an expandable range whose pool no allocation names, a request whose rounding straddles
``max_split_size``, a free that completed late, right before the burst), it says no.

Pure array code over the event kinds of :mod:`nsysfrag.events`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from nsysfrag import interpreted, jit
from nsysfrag.events import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    I64,
    SEGMENT_FREE,
    SEGMENT_UNMAP,
)


# What a burst of releases was (per run, ``Record.release_kinds``); the JSON names, in order.
EMPTY_CACHE = 0  # the program's torch.cuda.empty_cache(): nothing needed it, or the cache could serve
OOM_RETRY = 1  # a malloc's out-of-memory path: released before the retry (or before its oom)
COLLECTED = 2  # the garbage collector, before a cudaMalloc
UNKNOWN = 3  # a new segment followed that the device had room for: replayed as the program's
KIND_NAMES = ("empty_cache", "oom_retry", "garbage_collection", "unknown")

UNLIMITED_SPLIT = 1 << 62  # max_split_size when the run did not set it
_SMALL_SIZE = 1 << 20  # kSmallSize: requests up to this go to the small pool
_SMALL_SEGMENT = 2 << 20  # kSmallBuffer: every native small-pool segment is exactly this
_LARGE_BUFFER = 20 << 20  # kLargeBuffer: get_free_block's slack for oversize blocks
_MIN_BLOCK = 512
_QUIET_LOOKBACK = 256  # entries of frees before a burst searched for its freed blocks


def _rounding_bounds(requested: I64, divisions: bool) -> tuple[I64, I64]:
    """Bounds on PyTorch's ``round_size`` of each request: the request in 512 B steps, exactly,
    without roundup_power2_divisions; with them, at most the next power of two."""
    low = np.maximum(_MIN_BLOCK, -(-requested // _MIN_BLOCK) * _MIN_BLOCK)
    if not divisions:
        return low, low
    bits = np.ceil(np.log2(np.maximum(requested, 1).astype(np.float64))).astype(np.int64)
    high = np.maximum(low, np.left_shift(np.int64(1), np.minimum(bits, 62)))
    return low, high


def served_from_cache(
    action: npt.NDArray[np.int8], size: I64, stream: I64, address: I64,
    first: I64, past: I64, then_at: I64, new_segment: I64,
    max_split_size: int = UNLIMITED_SPLIT, divisions: bool = True,
) -> npt.NDArray[np.bool_]:  # fmt: skip
    """Per run of releases (entries ``first[k]`` to ``past[k] - 1``, followed by a new segment
    of ``new_segment[k]`` bytes and the entry ``then_at[k]``): True when the run released a
    whole free block that the allocation at ``then_at`` could have taken from the cache (same
    stream, same pool, large enough, accepted by max_split_size's rules). ``divisions``: the
    run set roundup_power2_divisions (requests are then rounded up further)."""
    n, runs = len(action), len(first)
    served = np.zeros(runs, dtype=np.bool_)
    if not runs or not n:
        return served
    at = np.minimum(then_at, n - 1)
    asks = (then_at < n) & (action[at] == ALLOC) & (new_segment > 0) & (size[at] > 0)
    # A free completed late (another stream used the block) right before the run may have
    # completed in the OOM path itself, after the cache search: that run's evidence is void.
    completed = action == FREE_COMPLETED
    ordinary = np.zeros(n, dtype=np.bool_)
    ordinary[1:] = (action[:-1] == FREE_REQUESTED) & (address[:-1] == address[1:])
    late = np.concatenate([[0], np.cumsum(completed & ~ordinary)])  # late[i]: before entry i
    index = np.arange(n)
    last_other = np.maximum.accumulate(np.where(completed, -1, index))  # last non-completion
    before = np.where(first > 0, last_other[np.maximum(first - 1, 0)], -1)
    asks &= late[first] - late[before + 1] == 0
    # Each released entry against its run's request.
    lengths = past - first
    run_of = np.repeat(np.arange(runs), lengths)
    entry = np.flatnonzero((action == SEGMENT_FREE) | (action == SEGMENT_UNMAP))  # the runs'
    requested = size[at][run_of]
    low, high = _rounding_bounds(requested, divisions)
    small_request = requested <= _SMALL_SIZE
    released = size[entry]
    native = action[entry] == SEGMENT_FREE
    # Native: a small-pool segment is 2 MiB, a large one never is; a whole free segment that is
    # at least the new segment, or the next power of two, is at least the rounded request.
    fits_native = native & ((released == _SMALL_SEGMENT) == small_request) & (
        released >= np.minimum(high, new_segment[run_of])
    )
    # Expandable: the unmapped pages lie inside a free block that also holds the blocks freed
    # right before the burst that overlap them; its pool is that of the allocations there.
    start, end = address.copy(), address + size
    interpreted.chosen(_free_extents, len(entry))(
        action, address, size, ordinary, first, past, start, end, _QUIET_LOOKBACK
    )
    extent = end[entry] - start[entry]
    fits_mapped = (action[entry] == SEGMENT_UNMAP) & (extent >= high)
    fits_mapped &= _range_pool_is(action, size, address, start[entry], extent, small_request)
    fits_mapped &= max_split_size >= UNLIMITED_SPLIT  # the block's own size is not recorded
    fits = (fits_native | fits_mapped) & (stream[entry] == stream[at][run_of])
    if max_split_size < UNLIMITED_SPLIT:
        # get_free_block: a request below max_split_size never takes an oversize block, and
        # one above it takes a block at most kLargeBuffer larger than itself.
        hi = np.minimum(high, new_segment[run_of])
        below = (hi < max_split_size) & (released < max_split_size)
        above = (low >= max_split_size) & (released < low + _LARGE_BUFFER)
        fits &= below | above
    hit = np.bincount(run_of[fits], minlength=runs) > 0
    return served | (hit & asks)


def _range_pool_is(
    action: npt.NDArray[np.int8], size: I64, address: I64, start: I64, length: I64,
    small: npt.NDArray[np.bool_],
) -> npt.NDArray[np.bool_]:  # fmt: skip
    """Per range ``[start, start + length)``: the allocation of the history that starts last
    below its end overlaps it and is of the pool ``small`` names (an expandable segment's pool
    keeps its own address range, so any block that ever lay there was of that pool)."""
    allocs = np.flatnonzero(action == ALLOC)
    order = np.argsort(address[allocs], kind="stable")
    where, nbytes = address[allocs][order], size[allocs][order]
    if not len(where):
        return np.zeros(len(start), dtype=np.bool_)
    k = np.searchsorted(where, start + length) - 1  # the last allocation starting below the end
    at = np.maximum(k, 0)
    overlaps = (k >= 0) & (where[at] + nbytes[at] > start)
    return overlaps & ((nbytes[at] <= _SMALL_SIZE) == small)


@jit.njit(cache=True, nogil=True)
def _free_extents(  # type: ignore[no-untyped-def]
    action, address, size, ordinary, first, past, start, end, lookback,
):  # fmt: skip
    """Widen each unmapped range ``[start, end)`` of a burst by the blocks freed (ordinary
    completions) in the run of frees right before the burst that overlap it, in order: with no
    allocation in between they are still free, in the same segment, so one free block holds
    them all."""
    for k in range(len(first)):
        f = first[k]
        lo = f
        while lo > 0 and f - lo < lookback and (
            action[lo - 1] == FREE_REQUESTED or action[lo - 1] == FREE_COMPLETED
        ):
            lo -= 1
        for j in range(f, past[k]):
            if action[j] != SEGMENT_UNMAP:
                continue
            s, e = start[j], end[j]
            for i in range(lo, f):
                if action[i] == FREE_COMPLETED and ordinary[i]:
                    a, b = address[i], address[i] + size[i]
                    if a < e and b > s:
                        s, e = min(s, a), max(e, b)
            start[j], end[j] = s, e

"""PyTorch's caching-allocator rules, in one place (``CUDACachingAllocator.cpp`` as the
project's docs record it): the constants, ``round_size`` with ``roundup_power2_divisions``,
the pool a size goes to, ``get_allocation_size`` (the size of a new segment) and
``should_split``.

Every model of the caching allocator uses these: the ``torch`` what-if policy's compiled
kernel, the what-if validation's rebuilt layout, and the ``pytorch-segments`` model of
``analyze``. Each rule is written once as plain Python and compiled for the kernels with
``numba.njit`` from the same source, so the interpreter and the kernel cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numba
import numpy as np
import numpy.typing as npt

MiB = 1 << 20

K_MIN_BLOCK = 512  # kMinBlockSize: every size is rounded to at least this
K_SMALL_SIZE = 1 * MiB  # kSmallSize: the largest request of the small pool
K_SMALL_BUFFER = 2 * MiB  # kSmallBuffer: small-pool segments; the small expandable page
K_LARGE_BUFFER = 20 * MiB  # kLargeBuffer: segments for 1-10 MiB; the large expandable page
K_MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: from here a segment is the request rounded up
K_ROUND_LARGE = 2 * MiB  # kRoundLarge: what large segments are rounded up to
DIVISION_INTERVALS = 16  # roundup_power2_divisions: [1, 2), [2, 4) … MiB, the last open-ended

Divisions = Sequence[int] | Mapping[int, int]


# These plain functions are compiled as they stand (below), so they call no other function.


def _interval(size: int) -> int:
    """The roundup_power2_divisions interval of ``size``: floor(log2(size)) - 20, in [0, 15]."""
    lg = 0
    while (size >> (lg + 1)) != 0:
        lg += 1
    return min(max(lg - 20, 0), DIVISION_INTERVALS - 1)


def _rounded(size: int, divisions: int) -> int:
    """round_size with ``divisions`` steps configured for the size's interval."""
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    if divisions > 1 and size > K_MIN_BLOCK * divisions:
        if size & (size - 1) == 0:
            return size
        lg = 0
        while (size >> (lg + 1)) != 0:
            lg += 1
        floor2 = 1 << lg
        step = floor2 // divisions
        if step == 0:
            return floor2 << 1
        floor = size & ~(step - 1)
        return size if floor == size else floor + step
    return -(-size // K_MIN_BLOCK) * K_MIN_BLOCK


def _allocation_size(size: int) -> int:
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


def _should_split(remaining: int, size: int, small_pool: bool, expandable: bool,
                  max_split_size: int) -> bool:  # fmt: skip
    if small_pool or expandable:
        return remaining >= K_MIN_BLOCK
    return size < max_split_size and remaining > K_SMALL_SIZE


# The same rules compiled for the kernels.
interval_kernel = numba.njit(cache=True)(_interval)
rounded_kernel = numba.njit(cache=True)(_rounded)
allocation_size_kernel = numba.njit(cache=True)(_allocation_size)
should_split_kernel = numba.njit(cache=True)(_should_split)


@numba.njit(cache=True)
def round_size_kernel(size: int, divisions: npt.NDArray[np.int64]) -> int:
    """round_size in a kernel: ``divisions`` holds one count per interval."""
    return int(rounded_kernel(size, divisions[interval_kernel(max(size, 1))]))


def division_table(divisions: Divisions | None) -> tuple[int, ...]:
    """One division count per interval, from a list of 16 or a snapshot's
    ``{interval start in MiB: count}`` (keys 1, 2, 4 … 32768)."""
    if divisions is None:
        return (0,) * DIVISION_INTERVALS
    if isinstance(divisions, Mapping):
        return tuple(int(divisions.get(1 << i, 0)) for i in range(DIVISION_INTERVALS))
    return tuple(int(d) for d in divisions)


def round_size(size: int, divisions: Divisions | None = None) -> int:
    """PyTorch's ``round_size``: at least 512 B, a multiple of 512 B, or the next of
    ``roundup_power2_divisions`` steps between powers of two where one is configured
    (``d > 1`` and ``size > 512·d``)."""
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    if not divisions:
        return _rounded(size, 0)
    if isinstance(divisions, Mapping):
        return _rounded(size, int(divisions.get(1 << _interval(size), 0)))
    return _rounded(size, int(divisions[_interval(size)]))


def is_small(size: int) -> bool:
    """A rounded size of at most 1 MiB goes to the small pool."""
    return size <= K_SMALL_SIZE


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment cudaMalloc gets for a rounded request with no
    cached block: 2 MiB (small pool), 20 MiB (under 10 MiB), else rounded up to 2 MiB."""
    return _allocation_size(size)


def should_split(remaining: int, size: int, small_pool: bool, expandable: bool,
                 max_split_size: int | None) -> bool:  # fmt: skip
    """``should_split``: small pool or expandable segments split when 512 B remain; the large
    pool only below max_split_size and when more than 1 MiB remains."""
    limit = (1 << 62) if max_split_size is None else max_split_size
    return _should_split(remaining, size, small_pool, expandable, limit)

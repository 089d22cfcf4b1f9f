"""PyTorch's caching-allocator rules, in one place (``CUDACachingAllocator.cpp`` as the
project's docs record it): the constants, ``round_size`` with ``roundup_power2_divisions``,
the pool a size goes to, ``get_allocation_size`` (the size of a new segment) and
``should_split``; and the settings the ``pytorch-segments`` model reads from a snapshot.

Every model of the caching allocator uses these: the ``pytorch-segments`` model of ``analyze``,
and the what-if ``torch`` policy, whose kernel compiles the plain functions here as they stand
(:mod:`nsysfrag.allocators.torch.compiled_rules`), so the two cannot disagree. Plain Python
only: ``analyze`` loads this module without the what-if models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

MiB = 1 << 20

K_MIN_BLOCK = 512  # kMinBlockSize: every size is rounded to at least this
K_SMALL_SIZE = 1 * MiB  # kSmallSize: the largest request of the small pool
K_SMALL_BUFFER = 2 * MiB  # kSmallBuffer: small-pool segments; the small expandable page
K_LARGE_BUFFER = 20 * MiB  # kLargeBuffer: segments for 1-10 MiB; the large expandable page
K_MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: from here a segment is the request rounded up
K_ROUND_LARGE = 2 * MiB  # kRoundLarge: what large segments are rounded up to
DIVISION_INTERVALS = 16  # roundup_power2_divisions: [1, 2), [2, 4) … MiB, the last open-ended

Divisions = Sequence[int] | Mapping[int, int]


# The kernels compile the next four as they stand, so they call no other function.


def division_interval(size: int) -> int:
    """The roundup_power2_divisions interval of ``size``: floor(log2(size)) - 20, in [0, 15]."""
    lg = 0
    while (size >> (lg + 1)) != 0:
        lg += 1
    return min(max(lg - 20, 0), DIVISION_INTERVALS - 1)


def rounded(size: int, divisions: int) -> int:
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


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment cudaMalloc gets for a rounded request with no
    cached block: 2 MiB (small pool), 20 MiB (under 10 MiB), else rounded up to 2 MiB."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


def split_rule(remaining: int, size: int, small_pool: bool, expandable: bool,
               max_split_size: int) -> bool:  # fmt: skip
    if small_pool or expandable:
        return remaining >= K_MIN_BLOCK
    return size < max_split_size and remaining > K_SMALL_SIZE


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
        return rounded(size, 0)
    if isinstance(divisions, Mapping):
        return rounded(size, int(divisions.get(1 << division_interval(size), 0)))
    return rounded(size, int(divisions[division_interval(size)]))


def should_split(remaining: int, size: int, small_pool: bool, expandable: bool,
                 max_split_size: int | None) -> bool:  # fmt: skip
    """``should_split``: small pool or expandable segments split when 512 B remain; the large
    pool only below max_split_size and when more than 1 MiB remains."""
    limit = (1 << 62) if max_split_size is None else max_split_size
    return split_rule(remaining, size, small_pool, expandable, limit)


def expandable_page(small_pool: bool | None, mapped_bytes: int) -> int:
    """The page an expandable range is mapped in: 2 MiB in the small pool, 20 MiB in the large.
    Where the snapshot does not name the pool, the size of the range (or of the map that made
    it) tells: a small-pool map is one 2 MiB page, a large-pool map whole 20 MiB pages."""
    if small_pool is None:
        small_pool = mapped_bytes % K_LARGE_BUFFER != 0
    return K_SMALL_BUFFER if small_pool else K_LARGE_BUFFER


@dataclass(frozen=True, slots=True)
class AllocatorSettings:
    """The settings of a caching allocator that change where its blocks go."""

    roundup_power2_divisions: dict[int, int] = field(default_factory=dict)  # MiB start -> divisions
    max_split_size: int | None = None  # bytes; None when unlimited
    expandable_segments: bool = False

"""The caching allocator's rounding rule and the constants the segments model needs.

PyTorch's ``CUDACachingAllocator``: blocks are at least 512 B and multiples of it, the small
pool's segments are 2 MiB, and a request of at most 1 MiB is a small one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# CUDACachingAllocator constants (ALLOCATORS.md §1.1).
MIN_BLOCK_BYTES = 512
SMALL_BUFFER_BYTES = 2 << 20
SMALL_SIZE_BYTES = 1 << 20
LARGE_BUFFER_BYTES = 20 << 20  # also the large pool's expandable page


def round_size(size: int, divisions: dict[int, int] | None = None) -> int:
    """PyTorch's ``round_size``: at least 512 B, a multiple of 512 B, or the next of
    ``roundup_power2_divisions`` steps between powers of two where that is configured."""
    if size < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    d = _divisions_for(size, divisions) if divisions else 0
    if d > 1 and size > MIN_BLOCK_BYTES * d:
        if size & (size - 1) == 0:
            return size
        p = 1 << (size.bit_length() - 1)
        step = p // d
        if step == 0:
            return 2 * p
        floor = size & ~(step - 1)
        return size if floor == size else floor + step
    return -(-size // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def _divisions_for(size: int, divisions: dict[int, int]) -> int:
    # Interval i covers [2**i MiB, 2**(i+1) MiB), clamped to [0, 15]; keys are interval starts.
    idx = min(max(size.bit_length() - 1 - 20, 0), 15)
    return divisions.get(1 << idx, 0)


def expandable_page(small_pool: bool | None, mapped_bytes: int) -> int:
    """The page an expandable range is mapped in: 2 MiB in the small pool, 20 MiB in the large.
    Where the snapshot does not name the pool, the size of the range (or of the map that made
    it) tells: a small-pool map is one 2 MiB page, a large-pool map whole 20 MiB pages."""
    if small_pool is None:
        small_pool = mapped_bytes % LARGE_BUFFER_BYTES != 0
    return SMALL_BUFFER_BYTES if small_pool else LARGE_BUFFER_BYTES


@dataclass(frozen=True, slots=True)
class AllocatorSettings:
    """The settings of a caching allocator that change where its blocks go."""

    roundup_power2_divisions: dict[int, int] = field(default_factory=dict)  # MiB start -> divisions
    max_split_size: int | None = None  # bytes; None when unlimited
    expandable_segments: bool = False

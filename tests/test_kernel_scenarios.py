"""GIVEN/WHEN/THEN scenarios for the compiled replay, called directly: no SQLite, no analysis.

Offsets and sizes are small numbers in an arena of ARENA bytes with a granularity of 1 (a block's
footprint is its size) unless a scenario says otherwise, so every expected state can be read off
by hand. Each ``alloc``/``free`` is one event; the kernel reports the state after each.
"""

from __future__ import annotations

import numpy as np

from nsysfrag.models.observed.kernel import KernelEvents, KernelOutput, assign_slots, replay
from nsysfrag.models.series import (
    ALLOCATED,
    FREED,
    NO_BLOCK,
    UNMATCHED_FREE,
    ZERO_SIZE_ALLOC,
)

ARENA = 100
Event = tuple[bool, int, int]  # (is_free, offset from the arena base, bytes)


def alloc(offset: int, size: int) -> Event:
    return (False, offset, size)


def free(offset: int) -> Event:
    return (True, offset, 0)


def run(*events: Event, arena: int = ARENA, granularity: int = 1) -> KernelOutput:
    is_free = np.array([e[0] for e in events], dtype=np.bool_)
    offset = np.array([e[1] for e in events], dtype=np.int64)
    nbytes = np.array([e[2] for e in events], dtype=np.int64)
    is_block = ~is_free & (nbytes > 0)
    footprint = np.where(is_block, -(-nbytes // granularity) * granularity, 0)
    slot_offset, slot = assign_slots(offset, is_block, is_free)
    return replay(KernelEvents(is_free, offset, nbytes, footprint, slot, slot_offset, arena))


def state(out: KernelOutput, i: int = -1) -> tuple[int, int, int, int]:
    """(free bytes, largest free block, free blocks, live bytes) after event ``i``."""
    return (
        int(out.free_bytes[i]),
        int(out.largest_free_bytes[i]),
        int(out.free_blocks[i]),
        int(out.live_bytes[i]),
    )


# -------------------------------------------------------------------- allocations


def test_no_events_give_no_states() -> None:
    # GIVEN an empty stream WHEN replayed THEN there is no state and no peak
    out = run()
    assert len(out.event) == 0 and out.peak_footprint.tolist() == [0, 0]


def test_allocation_at_the_base_leaves_one_free_block_after_it() -> None:
    # GIVEN an empty arena WHEN 10 bytes are allocated at its base THEN 90 bytes stay free
    out = run(alloc(0, 10))
    assert out.event.tolist() == [ALLOCATED]
    assert state(out) == (90, 90, 1, 10)


def test_allocation_in_the_middle_splits_the_free_space_in_two() -> None:
    # GIVEN an empty arena WHEN a block lands at 40 THEN free space is [0, 40) and [50, 100)
    out = run(alloc(40, 10))
    assert state(out) == (90, 50, 2, 10)


def test_allocation_filling_the_arena_leaves_no_free_block() -> None:
    out = run(alloc(0, ARENA))
    assert state(out) == (0, 0, 0, ARENA)


def test_adjacent_allocations_leave_no_gap_between_them() -> None:
    # GIVEN A at 0 WHEN B starts where A ends THEN one free block remains, after B
    out = run(alloc(0, 10), alloc(10, 20))
    assert state(out) == (70, 70, 1, 30)


def test_a_gap_between_allocations_is_a_free_block() -> None:
    out = run(alloc(0, 10), alloc(30, 10))
    assert state(out) == (80, 60, 2, 20)


def test_footprint_rounds_up_to_the_granularity() -> None:
    # GIVEN a granularity of 8 WHEN 5 bytes are allocated THEN the block holds 8, 5 of them live
    out = run(alloc(0, 5), arena=64, granularity=8)
    assert state(out) == (56, 56, 1, 5)
    assert out.peak_footprint.tolist() == [8, 5]


def test_zero_size_allocation_is_counted_and_changes_nothing() -> None:
    out = run(alloc(0, 10), alloc(50, 0))
    assert out.event.tolist() == [ALLOCATED, ZERO_SIZE_ALLOC]
    assert state(out, 0) == state(out, 1)
    assert out.removed_at.tolist() == [NO_BLOCK, NO_BLOCK]


# -------------------------------------------------------------------- frees


def test_freeing_the_only_block_frees_the_whole_arena() -> None:
    out = run(alloc(20, 10), free(20))
    assert out.event.tolist() == [ALLOCATED, FREED]
    assert state(out) == (ARENA, ARENA, 1, 0)


def test_freeing_the_newest_block_is_in_order() -> None:
    out = run(alloc(0, 10), alloc(10, 10), free(10))
    assert not out.out_of_order[2] and not out.hole[2]


def test_freeing_an_older_block_is_out_of_order() -> None:
    # GIVEN A then B live WHEN A is freed THEN A was not the newest live block
    out = run(alloc(0, 10), alloc(10, 10), free(0))
    assert out.out_of_order[2]


def test_freeing_the_base_block_makes_no_hole() -> None:
    # GIVEN A|B from the base WHEN A is freed THEN its free block is bounded by the base, not
    # by a live block, so it is no hole
    out = run(alloc(0, 10), alloc(10, 10), free(0))
    assert not out.hole[2]
    assert state(out) == (90, 80, 2, 10)


def test_freeing_between_live_blocks_makes_a_hole_pinned_by_both() -> None:
    # GIVEN A|B|C WHEN B is freed THEN B's range is a hole and A and C pin it
    out = run(alloc(0, 10), alloc(10, 20), alloc(30, 10), free(10))
    assert out.hole[3] and out.out_of_order[3]
    assert (int(out.pin_left[3]), int(out.pin_right[3])) == (0, 2)
    assert state(out) == (80, 60, 2, 20)


def test_freeing_the_block_before_the_arena_end_makes_no_hole() -> None:
    # GIVEN A|B with B last WHEN B is freed THEN its free block runs to the arena's end
    out = run(alloc(0, 10), alloc(10, 10), alloc(60, 40), free(60))
    assert not out.out_of_order[3]
    assert not out.hole[3]


def test_an_in_order_free_can_still_make_a_hole() -> None:
    # GIVEN A, then C, then B between them WHEN B (the newest) is freed THEN in order, yet a hole
    out = run(alloc(0, 10), alloc(20, 10), alloc(10, 10), free(10))
    assert not out.out_of_order[3] and out.hole[3]


def test_freeing_neighbours_merges_their_free_blocks() -> None:
    # GIVEN A|B|C|D WHEN B then C are freed THEN one free block of B + C, between A and D
    out = run(alloc(0, 10), alloc(10, 10), alloc(20, 10), alloc(30, 10), free(10), free(20))
    assert state(out, 4) == (70, 60, 2, 30)
    assert state(out) == (80, 60, 2, 20)


def test_freeing_every_block_leaves_one_free_block() -> None:
    events = [alloc(10 * i, 10) for i in range(5)] + [free(10 * i) for i in (3, 0, 4, 1, 2)]
    assert state(run(*events)) == (ARENA, ARENA, 1, 0)


def test_a_free_records_the_allocation_it_ends() -> None:
    out = run(alloc(0, 10), alloc(10, 10), free(0))
    assert int(out.freed_alloc[2]) == 0
    assert out.removed_at.tolist()[:2] == [2, NO_BLOCK]


def test_largest_free_block_follows_the_frees() -> None:
    # GIVEN small gaps and one block splitting the arena's tail WHEN that block is freed THEN
    # the largest free block is the whole tail
    out = run(alloc(0, 10), alloc(15, 10), alloc(30, 10), alloc(60, 10), free(60))
    assert int(out.largest_free_bytes[3]) == 30
    assert int(out.largest_free_bytes[4]) == 60


# -------------------------------------------------------------------- anomalies


def test_free_of_an_unknown_address_is_unmatched_and_changes_nothing() -> None:
    out = run(alloc(0, 10), free(50))
    assert out.event.tolist() == [ALLOCATED, UNMATCHED_FREE]
    assert state(out, 0) == state(out, 1)
    assert int(out.freed_alloc[1]) == NO_BLOCK


def test_second_free_of_a_block_is_unmatched() -> None:
    out = run(alloc(0, 10), free(0), free(0))
    assert out.event.tolist() == [ALLOCATED, FREED, UNMATCHED_FREE]


def test_free_inside_a_block_but_not_at_its_start_is_unmatched() -> None:
    out = run(alloc(0, 10), free(5))
    assert out.event.tolist() == [ALLOCATED, UNMATCHED_FREE]
    assert state(out) == (90, 90, 1, 10)


def test_free_below_the_arena_base_is_unmatched() -> None:
    # Offsets below the base are negative: such a free can match no block.
    out = run(alloc(0, 10), free(-1))
    assert out.event.tolist() == [ALLOCATED, UNMATCHED_FREE]


def test_allocation_over_a_live_block_evicts_it() -> None:
    # GIVEN A live at 0 WHEN B is allocated over it (A's free went missing) THEN one overlap,
    # A is gone (removed by B) and B is live
    out = run(alloc(0, 10), alloc(5, 10))
    assert out.overlap.tolist() == [False, True]
    assert out.removed_at.tolist() == [1, NO_BLOCK]
    assert state(out) == (90, 85, 2, 10)


def test_allocation_covering_two_blocks_evicts_both() -> None:
    out = run(alloc(0, 10), alloc(10, 10), alloc(0, 30))
    assert out.overlap[2]
    assert out.removed_at.tolist() == [2, 2, NO_BLOCK]
    assert state(out) == (70, 70, 1, 30)


def test_allocation_at_a_live_block_start_evicts_it() -> None:
    out = run(alloc(20, 10), alloc(20, 5))
    assert out.overlap[1] and int(out.removed_at[0]) == 1
    assert state(out) == (95, 75, 2, 5)


def test_touching_blocks_do_not_overlap() -> None:
    out = run(alloc(10, 10), alloc(0, 10), alloc(20, 10))
    assert not out.overlap.any()


def test_reallocating_a_freed_address_is_an_ordinary_allocation() -> None:
    out = run(alloc(0, 10), free(0), alloc(0, 20))
    assert not out.overlap.any()
    assert state(out) == (80, 80, 1, 20)


def test_free_after_an_eviction_finds_no_block() -> None:
    # GIVEN A evicted by B WHEN A's (late) free arrives THEN it matches nothing at A's address
    out = run(alloc(0, 10), alloc(5, 10), free(0))
    assert out.event.tolist()[2] == UNMATCHED_FREE


# -------------------------------------------------------------------- order and peaks


def test_in_order_check_skips_blocks_already_gone() -> None:
    # GIVEN A, B, C WHEN C then B are freed, then A THEN every free is of the newest live block
    out = run(alloc(0, 10), alloc(10, 10), alloc(20, 10), free(20), free(10), free(0))
    assert not out.out_of_order.any()


def test_in_order_check_skips_evicted_blocks() -> None:
    # GIVEN A, then B, then C over B WHEN A's neighbour C is freed, then A THEN both in order
    out = run(alloc(0, 10), alloc(20, 10), alloc(20, 10), free(20), free(0))
    assert out.overlap[2]
    assert not out.out_of_order[3] and not out.out_of_order[4]


def test_peak_footprint_is_the_first_maximum_and_its_live_bytes() -> None:
    # GIVEN footprints 8, 16, 8, 16 (granularity 8) WHEN replayed THEN the peak is the first 16
    events = [alloc(0, 5), alloc(8, 7), free(8), alloc(8, 8)]
    out = run(*events, arena=64, granularity=8)
    assert out.peak_footprint.tolist() == [16, 12]


def test_many_holes_are_counted_as_free_blocks() -> None:
    # GIVEN ten blocks side by side WHEN every other one is freed THEN five free blocks: four
    # holes and the tail after the last live block merged with the freed last block
    events = [alloc(10 * i, 10) for i in range(10)] + [free(10 * i) for i in range(1, 10, 2)]
    out = run(*events)
    assert state(out) == (50, 10, 5, 50)
    assert int(out.hole.sum()) == 4

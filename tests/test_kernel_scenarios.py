"""GIVEN/WHEN/THEN scenarios for the compiled page replay, called directly: no SQLite, no analysis.

Offsets and sizes are small numbers on a device of CAPACITY bytes with pages of PAGE bytes and a
granularity of 1 (a block's footprint is its size) unless a scenario says otherwise, so every
expected state can be read off by hand: page k is [10k, 10k + 10). Each ``alloc``/``free`` is one
event; the kernel reports the state after each.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from nsysfrag.models.observed.kernel import KernelEvents, KernelOutput, replay
from nsysfrag.models.observed.slots import assign_slots
from nsysfrag.models.series import (
    ALLOCATED,
    FREED,
    NO_BLOCK,
    UNMATCHED_FREE,
    ZERO_SIZE_ALLOC,
)
from tests.kernel_modes import both_kernels  # noqa: F401  (every test both ways)

PAGE = 10
CAPACITY = 100
Event = tuple[bool, int, int, bool]  # (is_free, offset from the base page, bytes, from a pool)


def alloc(offset: int, size: int, pool: bool = False) -> Event:
    return (False, offset, size, pool)


def free(offset: int) -> Event:
    return (True, offset, 0, False)


def run(
    *events: Event,
    granularity: int = 1,
    capacity: int = CAPACITY,
    pool_reserved: list[int] | None = None,
    pool_releasable: list[int] | None = None,
) -> KernelOutput:
    is_free = np.array([e[0] for e in events], dtype=np.bool_)
    offset = np.array([e[1] for e in events], dtype=np.int64)
    nbytes = np.array([e[2] for e in events], dtype=np.int64)
    in_pool = np.array([e[3] for e in events], dtype=np.bool_)
    is_block = ~is_free & (nbytes > 0)
    footprint = np.where(is_block, -(-nbytes // granularity) * granularity, 0)
    slot_offset, slot = assign_slots(offset, is_block, is_free)
    pools = [np.asarray(p or [], dtype=np.int64) for p in (pool_reserved, pool_releasable)]
    return replay(KernelEvents(is_free, offset, nbytes, footprint, slot, slot_offset, in_pool,
                               PAGE, capacity, *pools))  # fmt: skip


class State(NamedTuple):
    reserved: int
    allocated: int
    device_free: int
    largest_block: int  # L: the largest free run inside resident pages
    largest_usable: int  # L_eff
    free: int  # F = D + S + R
    free_blocks: int
    live: int


def state(out: KernelOutput, i: int = -1, capacity: int = CAPACITY) -> State:
    return State(
        int(out.reserved_bytes[i]),
        int(out.allocated_bytes[i]),
        max(0, capacity - int(out.reserved_bytes[i])),
        int(out.largest_block_bytes[i]),
        int(out.largest_free_bytes[i]),
        int(out.free_bytes[i]),
        int(out.free_blocks[i]),
        int(out.live_bytes[i]),
    )


def stranded(out: KernelOutput, i: int = -1) -> int:
    return int(out.free_bytes[i]) - state(out, i).device_free  # no pool: R = 0


# -------------------------------------------------------------------- pages and blocks


def test_no_events_give_no_states() -> None:
    # GIVEN an empty stream WHEN replayed THEN there is no state and no peak
    out = run()
    assert len(out.event) == 0 and out.peak_footprint.tolist() == [0, 0]


def test_a_block_makes_its_page_resident_and_strands_the_rest_of_it() -> None:
    # GIVEN an empty device WHEN 4 bytes are allocated at 0 THEN page 0 is resident: 10
    # reserved, 6 stranded in one run, 90 device free (a run, and the free pages)
    out = run(alloc(0, 4))
    assert out.event.tolist() == [ALLOCATED]
    assert state(out) == State(10, 4, 90, 6, 90, 96, 2, 4)


def test_a_block_across_a_page_boundary_makes_both_pages_resident() -> None:
    # GIVEN an empty device WHEN [5, 15) is allocated THEN pages 0 and 1 are resident: the head
    # [0, 5) and the tail [15, 20) are two stranded runs
    out = run(alloc(5, 10))
    assert state(out) == State(20, 10, 80, 5, 80, 90, 3, 10)


def test_a_block_of_whole_pages_strands_nothing() -> None:
    out = run(alloc(10, 20))
    assert state(out) == State(20, 20, 80, 0, 80, 80, 1, 20)
    assert stranded(out) == 0


def test_blocks_far_apart_leave_no_free_block_between_them() -> None:
    # GIVEN two whole-page blocks 40 bytes of addresses apart WHEN replayed THEN the virtual gap
    # is no free memory: nothing is stranded, and the device's 80 free bytes are one block
    out = run(alloc(0, 10), alloc(50, 10))
    assert state(out) == State(20, 20, 80, 0, 80, 80, 1, 20)


def test_two_blocks_in_one_page_leave_the_runs_between_and_after_them() -> None:
    out = run(alloc(0, 3), alloc(6, 2))
    assert state(out) == State(10, 5, 90, 3, 90, 95, 3, 5)  # runs [3, 6) and [8, 10)


def test_a_whole_free_page_between_neighbours_splits_their_runs() -> None:
    # GIVEN blocks [0, 3) and [25, 28) WHEN replayed THEN pages 0 and 2 are resident, page 1
    # is not: the runs are [3, 10), [20, 25) and [28, 30)
    out = run(alloc(0, 3), alloc(25, 3))
    assert state(out) == State(20, 6, 80, 7, 80, 94, 4, 6)


def test_neighbours_in_adjacent_pages_share_one_run() -> None:
    # GIVEN [8, 12) across pages 0–1 and [15, 17) in page 1 WHEN replayed THEN [12, 15) is one
    # run between them, with the head [0, 8) and the tail [17, 20)
    out = run(alloc(8, 4), alloc(15, 2))
    assert state(out) == State(20, 6, 80, 8, 80, 94, 4, 6)


def test_footprints_round_up_to_the_granularity() -> None:
    # GIVEN a granularity of 4 WHEN 5 bytes are allocated at 0 THEN the footprint is 8 bytes
    out = run(alloc(0, 5), granularity=4)
    assert state(out) == State(10, 8, 90, 2, 90, 92, 2, 5)


def test_overlapping_footprints_count_once_and_are_no_overlap() -> None:
    # GIVEN a granularity of 4 WHEN 1 byte is allocated at 0 and 1 byte at 2 THEN their bytes do
    # not meet (no overlap) though their footprints [0, 4) and [2, 6) do: allocated is 6
    out = run(alloc(0, 1), alloc(2, 1), granularity=4)
    assert out.overlap.tolist() == [False, False]
    assert state(out) == State(10, 6, 90, 4, 90, 94, 2, 2)


def test_zero_size_allocation_is_counted_and_changes_nothing() -> None:
    out = run(alloc(0, 4), alloc(7, 0))
    assert out.event.tolist() == [ALLOCATED, ZERO_SIZE_ALLOC]
    assert state(out, 1) == state(out, 0)


def test_a_device_fuller_than_its_capacity_has_no_device_free_memory() -> None:
    # GIVEN a device of 15 bytes WHEN two whole pages are allocated THEN reserved (20) exceeds it
    # and device free is 0, not negative
    out = run(alloc(0, 10), alloc(10, 10), capacity=15)
    assert state(out, capacity=15) == State(20, 20, 0, 0, 0, 0, 0, 20)


# -------------------------------------------------------------------- frees


def test_freeing_the_only_block_gives_its_page_back() -> None:
    out = run(alloc(2, 4), free(2))
    assert out.event.tolist() == [ALLOCATED, FREED]
    assert state(out) == State(0, 0, 100, 0, 100, 100, 1, 0)


def test_freeing_the_newest_block_is_in_order() -> None:
    out = run(alloc(0, 10), alloc(10, 10), free(10))
    assert out.out_of_order.tolist() == [False, False, False]


def test_freeing_an_older_block_is_out_of_order() -> None:
    out = run(alloc(0, 10), alloc(10, 10), free(0))
    assert out.out_of_order.tolist() == [False, False, True]


def test_freeing_a_block_in_pages_of_its_own_makes_no_hole() -> None:
    # GIVEN two whole-page blocks WHEN the first is freed THEN its page goes back: no hole
    out = run(alloc(0, 10), alloc(10, 10), free(0))
    assert out.hole.tolist() == [False, False, False]
    assert int(out.hole_bytes[2]) == 0 and int(out.pin_left[2]) == NO_BLOCK


def test_freeing_a_block_beside_one_in_its_page_strands_it_pinned_by_that_block() -> None:
    # GIVEN [0, 3) and [3, 6) in page 0 WHEN the second is freed THEN its bytes stay in the
    # resident page: a hole of 3 bytes, pinned on the left by the first block, none on the right
    out = run(alloc(0, 3), alloc(3, 3), free(3))
    assert out.hole.tolist() == [False, False, True]
    assert int(out.hole_bytes[2]) == 3
    assert (int(out.pin_left[2]), int(out.pin_right[2])) == (0, NO_BLOCK)
    assert state(out) == State(10, 3, 90, 7, 90, 97, 2, 3)


def test_freeing_between_two_blocks_of_one_page_makes_a_hole_pinned_by_both() -> None:
    out = run(alloc(0, 2), alloc(2, 2), alloc(4, 2), free(2))
    assert out.hole.tolist() == [False, False, False, True]
    assert int(out.hole_bytes[3]) == 2
    assert (int(out.pin_left[3]), int(out.pin_right[3])) == (0, 2)


def test_freeing_a_block_across_pages_strands_only_the_part_in_a_page_that_stays() -> None:
    # GIVEN [0, 2) and [2, 14) WHEN the second is freed THEN page 1 goes back and the 8 bytes
    # of it in page 0 stay stranded beside the first block
    out = run(alloc(0, 2), alloc(2, 12), free(2))
    assert int(out.hole_bytes[2]) == 8
    assert (int(out.pin_left[2]), int(out.pin_right[2])) == (0, NO_BLOCK)
    assert state(out) == State(10, 2, 90, 8, 90, 98, 2, 2)


def test_freeing_a_block_whose_right_neighbour_keeps_its_last_page() -> None:
    # GIVEN [0, 12) and [12, 14) WHEN the first is freed THEN page 0 goes back and [10, 12)
    # stays stranded in page 1, pinned by the block on the right
    out = run(alloc(0, 12), alloc(12, 2), free(0))
    assert int(out.hole_bytes[2]) == 2
    assert (int(out.pin_left[2]), int(out.pin_right[2])) == (NO_BLOCK, 1)


def test_an_in_order_free_can_still_make_a_hole() -> None:
    out = run(alloc(0, 3), alloc(3, 3), free(3))
    assert out.out_of_order.tolist()[2] is False and out.hole.tolist()[2] is True


def test_freeing_neighbours_in_one_page_merges_their_runs() -> None:
    out = run(alloc(0, 2), alloc(2, 2), alloc(4, 2), alloc(6, 2), free(2), free(4))
    assert state(out) == State(10, 4, 90, 4, 90, 96, 3, 4)  # runs [2, 6) and [8, 10)


def test_freeing_every_block_leaves_the_whole_device_free() -> None:
    out = run(alloc(0, 3), alloc(15, 3), alloc(40, 10), free(15), free(0), free(40))
    assert state(out) == State(0, 0, 100, 0, 100, 100, 1, 0)


def test_a_free_records_the_allocation_it_ends() -> None:
    out = run(alloc(0, 3), alloc(5, 3), free(0))
    assert int(out.freed_alloc[2]) == 0 and int(out.removed_at[0]) == 2
    assert int(out.removed_at[1]) == NO_BLOCK


def test_largest_free_run_follows_the_frees() -> None:
    out = run(alloc(0, 1), alloc(1, 1), alloc(2, 1), alloc(3, 7), free(1), free(2))
    assert [int(v) for v in out.largest_block_bytes] == [9, 8, 7, 0, 1, 2]


def test_many_holes_are_counted_as_free_blocks() -> None:
    # GIVEN 25 one-byte blocks at every other byte of five pages WHEN replayed THEN each leaves
    # a one-byte run after it: 25 runs, and the device's free pages
    out = run(*(alloc(2 * i, 1) for i in range(25)))
    assert state(out) == State(50, 25, 50, 1, 50, 75, 26, 25)


# -------------------------------------------------------------------- unmatched frees


def test_free_of_an_unknown_address_is_unmatched_and_changes_nothing() -> None:
    out = run(alloc(0, 3), free(7))
    assert out.event.tolist() == [ALLOCATED, UNMATCHED_FREE]
    assert state(out, 1) == state(out, 0)


def test_second_free_of_a_block_is_unmatched() -> None:
    out = run(alloc(0, 3), free(0), free(0))
    assert out.event.tolist() == [ALLOCATED, FREED, UNMATCHED_FREE]


def test_free_inside_a_block_but_not_at_its_start_is_unmatched() -> None:
    out = run(alloc(0, 5), free(2))
    assert out.event.tolist() == [ALLOCATED, UNMATCHED_FREE]


def test_free_below_the_base_is_unmatched() -> None:
    out = run(alloc(0, 5), free(-1))
    assert out.event.tolist() == [ALLOCATED, UNMATCHED_FREE]


# -------------------------------------------------------------------- overlaps


def test_allocation_over_a_live_blocks_bytes_evicts_it() -> None:
    out = run(alloc(0, 5), alloc(3, 5))
    assert out.overlap.tolist() == [False, True]
    assert int(out.removed_at[0]) == 1
    assert state(out) == State(10, 5, 90, 3, 90, 95, 3, 5)


def test_allocation_covering_two_blocks_evicts_both() -> None:
    out = run(alloc(0, 2), alloc(4, 2), alloc(1, 5))
    assert out.overlap.tolist() == [False, False, True]
    assert int(out.removed_at[0]) == 2 and int(out.removed_at[1]) == 2


def test_allocation_at_a_live_block_start_evicts_it() -> None:
    out = run(alloc(0, 2), alloc(0, 4))
    assert out.overlap.tolist() == [False, True] and state(out).live == 4


def test_touching_blocks_do_not_overlap() -> None:
    out = run(alloc(0, 5), alloc(5, 5))
    assert out.overlap.tolist() == [False, False]


def test_reallocating_a_freed_address_is_an_ordinary_allocation() -> None:
    out = run(alloc(0, 5), free(0), alloc(0, 5))
    assert out.overlap.tolist() == [False, False, False] and state(out).live == 5


def test_free_after_an_eviction_finds_no_block() -> None:
    out = run(alloc(0, 5), alloc(2, 5), free(0))
    assert out.event.tolist() == [ALLOCATED, ALLOCATED, UNMATCHED_FREE]


def test_in_order_check_skips_blocks_already_gone() -> None:
    out = run(alloc(0, 2), alloc(5, 2), alloc(10, 2), free(10), free(5))
    assert out.out_of_order.tolist()[-1] is False


def test_in_order_check_skips_evicted_blocks() -> None:
    out = run(alloc(0, 2), alloc(10, 2), alloc(11, 2), free(0))
    assert out.out_of_order.tolist()[-1] is True  # 11 is the newest live block
    out = run(alloc(0, 2), alloc(10, 2), alloc(10, 3), free(10))
    assert out.out_of_order.tolist()[-1] is False  # the evicted block does not count


def test_peak_footprint_is_the_first_maximum_and_its_live_bytes() -> None:
    out = run(alloc(0, 5), alloc(5, 5), free(0), alloc(0, 5), granularity=4)
    assert out.peak_footprint.tolist() == [16, 10]


# -------------------------------------------------------------------- memory pools


def test_a_pool_block_counts_in_allocated_but_its_pages_are_the_pools() -> None:
    # GIVEN a pool recorded at 40 bytes with 20 releasable WHEN a 5-byte pool block is allocated
    # THEN reserved is the pool's 40 (no page of the block's), allocated 5, stranded 15
    out = run(alloc(0, 5, pool=True), pool_reserved=[40], pool_releasable=[20])
    s = state(out)
    assert (s.reserved, s.allocated, s.device_free) == (40, 5, 60)
    assert s.free == 60 + 15 + 20 and s.largest_usable == 60 + 20 and s.largest_block == 0
    assert s.free_blocks == 1  # no run: no resident page


def test_pool_and_page_blocks_add_up() -> None:
    out = run(alloc(0, 5, pool=True), alloc(50, 3), pool_reserved=[40, 40], pool_releasable=[0, 0])
    s = state(out)
    assert (s.reserved, s.allocated, s.largest_block) == (50, 8, 7)


def test_freeing_a_pool_block_makes_no_hole() -> None:
    out = run(alloc(0, 5, pool=True), alloc(5, 5, pool=True), free(0),
              pool_reserved=[40] * 3, pool_releasable=[0] * 3)  # fmt: skip
    assert out.event.tolist() == [ALLOCATED, ALLOCATED, FREED]
    assert out.hole.tolist() == [False, False, False]
    assert state(out).allocated == 5


def test_a_page_block_over_a_pool_blocks_bytes_evicts_it() -> None:
    out = run(alloc(0, 5, pool=True), alloc(3, 5), pool_reserved=[40, 40], pool_releasable=[0, 0])
    assert out.overlap.tolist() == [False, True] and state(out).allocated == 5


def test_a_pool_block_s_footprint_over_a_page_block_s_counts_once() -> None:
    # GIVEN a granularity of 4: a page block [0, 1) (footprint [0, 4)) and a pool block [2, 3)
    # (footprint [2, 6)) WHEN replayed THEN their bytes do not meet, and allocated is the
    # union of the footprints, 6 bytes
    out = run(alloc(0, 1), alloc(2, 1, pool=True), granularity=4,
              pool_reserved=[0, 40], pool_releasable=[0, 0])  # fmt: skip
    assert out.overlap.tolist() == [False, False]
    assert state(out).allocated == 6

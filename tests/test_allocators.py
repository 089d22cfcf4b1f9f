"""Allocator models, one GIVEN/WHEN/THEN scenario per rule (ALLOCATORS.md is the reference):
the PyTorch caching allocator's rounding, pools, segment sizes, best fit, splitting, merging,
max_split_size, OOM-path release, empty_cache, garbage collection and expandable segments;
best fit against first fit; the buddy system's splits and merges; the slab's classes; the
cudaMallocAsync-style pool; and invariants every model keeps on random streams."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from nsysfrag.allocators import DEFAULT_POLICIES, Policy, TorchConfig, parse_policy
from nsysfrag.allocators.base import (
    ALLOC,
    EMPTY_CACHE,
    FREE,
    LOG_SEGMENT_ALLOC,
    LOG_SEGMENT_FREE,
    LOG_SEGMENT_MAP,
    LOG_SEGMENT_UNMAP,
    UNLIMITED,
    RequestStream,
    SimResult,
)
from nsysfrag.allocators.slab import class_of, size_classes
from nsysfrag.errors import InputError
from nsysfrag.models.segments.rules import round_size
from tests.kernel_modes import both_kernels  # noqa: F401  (every test both ways)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@dataclass
class Run:
    """A scripted stream's replay: figures after the last event, and the segment calls."""

    r: SimResult

    @property
    def reserved(self) -> int:
        return int(self.r.reserved_bytes[-1])

    @property
    def free(self) -> int:
        return int(self.r.free_bytes[-1])

    @property
    def largest(self) -> int:
        return int(self.r.largest_free_bytes[-1])

    @property
    def blocks(self) -> int:
        return int(self.r.free_blocks[-1])

    @property
    def allocated(self) -> int:
        return int(self.r.allocated_bytes[-1])

    @property
    def live(self) -> int:
        return int(self.r.live_bytes[-1])

    @property
    def ooms(self) -> int:
        return len(self.r.oom_event)

    def segments(self, kind: int) -> list[int]:
        log = self.r.segment_log
        return log["size"][log["kind"] == kind].tolist()


def stream(*ops: tuple[object, ...]) -> RequestStream:
    """``("a", name, bytes[, stream])`` allocates, ``("f", name)`` frees, ``("e",)`` is
    torch.cuda.empty_cache()."""
    kind, request, size, streams = [], [], [], []
    names: dict[object, int] = {}
    for op in ops:
        if op[0] == "a":
            names[op[1]] = len(size)
            size.append(op[2])
            streams.append(op[3] if len(op) > 3 else 0)
            kind.append(ALLOC)
            request.append(names[op[1]])
        elif op[0] == "f":
            kind.append(FREE)
            request.append(names[op[1]])
        else:
            kind.append(EMPTY_CACHE)
            request.append(0)
    return RequestStream.build(kind, request, np.arange(len(kind)), size, streams)


def run(policy: str | Policy, *ops: tuple[object, ...], capacity: int = 80 * GiB) -> Run:
    p = parse_policy(policy) if isinstance(policy, str) else policy
    return Run(p.simulate(stream(*ops), capacity))


def torch_run(*ops: tuple[object, ...], capacity: int = 80 * GiB, conf: str = "") -> Run:
    return run(Policy("torch", TorchConfig.parse(conf)), *ops, capacity=capacity)


# ------------------------------------------------------------------- torch: rounding


@pytest.mark.parametrize(
    ("requested", "divisions", "rounded"),
    [
        (1, 0, 512),
        (513, 0, 1024),
        (1200, 0, 1536),
        (1200, 4, 1536),  # 1,200 <= 512 x 4: no power-of-two rounding
        (2049, 4, 2560),
        (MiB, 0, MiB),
        (MiB + 1, 0, MiB + 512),
        (MiB + 1, 4, MiB + MiB // 4),
        (11 * MiB + 1, 4, 12 * MiB),
        (1200 * MiB, 4, 1280 * MiB),
    ],
)
def test_round_size_follows_allocators_md(requested: int, divisions: int, rounded: int) -> None:
    # GIVEN roundup_power2_divisions for every interval
    # WHEN a request is rounded
    # THEN it matches the worked examples of ALLOCATORS.md §1.2
    assert round_size(requested, (divisions,) * 16) == rounded


def test_division_lists_fill_below_the_first_key_and_after_the_last() -> None:
    # GIVEN [256:1,512:2,1024:4,>:8] (keys in MB)
    divs = TorchConfig.parse("roundup_power2_divisions=[256:1,512:2,1024:4,>:8]").roundup_power2_divisions
    # THEN key k governs [k, 2k) MiB, the first key also everything below, > everything after
    assert divs[:8] == (1,) * 8 and divs[8] == 1
    assert divs[9] == 2 and divs[10] == 4 and divs[11:] == (8,) * 5


# ------------------------------------------------------------ torch: pools and segments


@pytest.mark.parametrize(
    ("request_bytes", "segment"),
    [
        (1 * KiB, 2 * MiB),  # small pool: 2 MiB segments
        (MiB, 2 * MiB),  # 1 MiB is still small
        (MiB + 1, 20 * MiB),  # large pool, under 10 MiB: 20 MiB
        (10 * MiB, 10 * MiB),  # 10 MiB and up: the request rounded up to 2 MiB
        (11 * MiB + 1, 12 * MiB),
    ],
)
def test_new_segment_sizes(request_bytes: int, segment: int) -> None:
    # GIVEN an empty allocator WHEN one request arrives THEN cudaMalloc takes this much
    r = torch_run(("a", "x", request_bytes))
    assert r.segments(LOG_SEGMENT_ALLOC) == [segment]
    assert r.reserved == segment


def test_small_and_large_pools_never_share_a_segment() -> None:
    # GIVEN a 20 MiB large segment with 18 MiB free
    # WHEN a small request arrives THEN it gets its own 2 MiB segment
    r = torch_run(("a", "big", 2 * MiB), ("a", "small", 4 * KiB))
    assert r.segments(LOG_SEGMENT_ALLOC) == [20 * MiB, 2 * MiB]


def test_a_block_freed_on_one_stream_is_not_reused_on_another() -> None:
    # GIVEN a 4 MiB block freed on stream 0
    # WHEN stream 1 asks for 4 MiB THEN it gets a new segment; stream 0 reuses the cache
    r = torch_run(("a", "x", 4 * MiB, 0), ("f", "x"), ("a", "y", 4 * MiB, 1), ("a", "z", 4 * MiB, 0))
    assert r.segments(LOG_SEGMENT_ALLOC) == [20 * MiB, 20 * MiB]


def test_best_fit_takes_the_smallest_block_that_fits() -> None:
    # GIVEN cached whole segments of 24 MiB and 12 MiB (12 MiB allocated later)
    ops = [("a", "big", 24 * MiB), ("a", "small", 12 * MiB), ("f", "big"), ("f", "small")]
    # WHEN 11 MiB is requested THEN it comes from the 12 MiB segment (no split: 1 MiB remains)
    r = torch_run(*ops, ("a", "x", 11 * MiB))
    assert r.segments(LOG_SEGMENT_ALLOC) == [24 * MiB, 12 * MiB]
    assert r.largest == 24 * MiB and r.allocated == 12 * MiB


# ------------------------------------------------------------------- torch: splitting


def test_small_pool_splits_when_512_bytes_remain() -> None:
    # GIVEN a 2 MiB small segment WHEN 1 KiB is taken THEN the rest stays cached as one block
    r = torch_run(("a", "x", 1000))
    assert r.allocated == 1024 and r.free == 2 * MiB - 1024 and r.blocks == 1


def test_large_pool_keeps_a_remainder_of_at_most_1_mib_in_the_block() -> None:
    # GIVEN a 20 MiB segment WHEN 9 MiB is taken THEN 11 MiB remain: split
    split = torch_run(("a", "x", 9 * MiB))
    assert split.allocated == 9 * MiB and split.free == 11 * MiB
    # WHEN the remainder would be 1 MiB or less THEN the block is handed out whole
    whole = torch_run(("a", "x", 12 * MiB), ("f", "x"), ("a", "y", 11 * MiB))
    assert whole.allocated == 12 * MiB and whole.free == 0 and whole.blocks == 0


def test_a_request_is_carved_from_the_low_end_and_the_rest_stays_cached() -> None:
    # GIVEN three 5 MiB blocks in one 20 MiB segment
    r = torch_run(("a", "a", 5 * MiB), ("a", "b", 5 * MiB), ("a", "c", 5 * MiB))
    # THEN one segment holds them all and 5 MiB remain free at its end
    assert r.segments(LOG_SEGMENT_ALLOC) == [20 * MiB]
    assert r.free == 5 * MiB and r.largest == 5 * MiB


# ------------------------------------------------------------------- torch: coalescing


def test_frees_merge_with_free_neighbours_in_the_segment() -> None:
    # GIVEN three 5 MiB blocks and the 5 MiB tail in a 20 MiB segment
    ops = [("a", "a", 5 * MiB), ("a", "b", 5 * MiB), ("a", "c", 5 * MiB)]
    # WHEN the middle one is freed THEN it is a hole of its own
    hole = torch_run(*ops, ("f", "b"))
    assert hole.blocks == 2 and hole.largest == 5 * MiB
    # WHEN the rest is freed THEN the segment is one free block again
    merged = torch_run(*ops, ("f", "b"), ("f", "a"), ("f", "c"))
    assert merged.blocks == 1 and merged.largest == 20 * MiB


def test_blocks_of_different_segments_never_merge() -> None:
    # GIVEN two 12 MiB segments WHEN both are freed THEN two free blocks, nothing returned
    r = torch_run(("a", "x", 12 * MiB), ("a", "y", 12 * MiB), ("f", "x"), ("f", "y"))
    assert r.blocks == 2 and r.largest == 12 * MiB and r.reserved == 24 * MiB


# ------------------------------------------------------------------ torch: max_split_size


def test_max_split_size_keeps_oversize_blocks_for_large_requests() -> None:
    cached = [("a", "big", 64 * MiB), ("f", "big")]
    conf = "max_split_size_mb=32"
    # GIVEN a cached 64 MiB block, max_split_size 32 MiB
    # WHEN 10 MiB (below it) is requested THEN the oversize block is not split: a new segment
    small = torch_run(*cached, ("a", "x", 10 * MiB), conf=conf)
    assert small.segments(LOG_SEGMENT_ALLOC) == [64 * MiB, 10 * MiB]
    # WHEN 50 MiB is requested THEN the 64 MiB block is within 50 + 20 MiB: taken, unsplit
    near = torch_run(*cached, ("a", "x", 50 * MiB), conf=conf)
    assert near.segments(LOG_SEGMENT_ALLOC) == [64 * MiB] and near.allocated == 64 * MiB
    # WHEN 40 MiB is requested THEN 64 >= 40 + 20: rejected, and the search stops there
    far = torch_run(*cached, ("a", "x", 40 * MiB), conf=conf)
    assert far.segments(LOG_SEGMENT_ALLOC) == [64 * MiB, 40 * MiB]
    # AND without the option the 64 MiB block would have been split
    default = torch_run(*cached, ("a", "x", 40 * MiB))
    assert default.segments(LOG_SEGMENT_ALLOC) == [64 * MiB] and default.free == 24 * MiB


def test_max_split_size_must_be_at_least_20_mb() -> None:
    with pytest.raises(InputError, match="at least 20"):
        TorchConfig.parse("max_split_size_mb:10")


def test_oom_path_with_max_split_size_frees_oversize_blocks_first() -> None:
    # GIVEN 100 MiB of device, a cached 64 MiB oversize segment and a cached 2 MiB small one
    ops = [("a", "big", 64 * MiB), ("a", "s", 4 * KiB), ("f", "big"), ("f", "s")]
    # WHEN 36 MiB is requested, which does not fit beside them
    r = torch_run(*ops, ("a", "x", 36 * MiB), capacity=100 * MiB, conf="max_split_size_mb=32")
    # THEN release_available_cached_blocks frees only the oversize block before the retry
    assert r.segments(LOG_SEGMENT_FREE) == [64 * MiB]
    assert r.reserved == 36 * MiB + 2 * MiB and r.ooms == 0


# ---------------------------------------------------------------- torch: giving memory back


def test_nothing_is_returned_to_cuda_on_free() -> None:
    # GIVEN a 40 MiB block WHEN it is freed THEN the segment stays reserved, all of it free
    r = torch_run(("a", "x", 40 * MiB), ("f", "x"))
    assert r.reserved == 40 * MiB and r.free == 40 * MiB and r.segments(LOG_SEGMENT_FREE) == []


def test_oom_retry_frees_cached_segments_then_allocates() -> None:
    # GIVEN 64 MiB of device and a cached 40 MiB segment
    # WHEN 50 MiB is requested THEN cudaMalloc fails, the cached segment goes, the retry works
    r = torch_run(("a", "x", 40 * MiB), ("f", "x"), ("a", "y", 50 * MiB), capacity=64 * MiB)
    assert r.segments(LOG_SEGMENT_ALLOC) == [40 * MiB, 50 * MiB]
    assert r.segments(LOG_SEGMENT_FREE) == [40 * MiB]
    assert r.reserved == 50 * MiB and r.ooms == 0


def test_split_segments_survive_the_oom_path_and_the_request_fails() -> None:
    # GIVEN 64 MiB of device: a 40 MiB segment with 10 MiB live at its start (30 MiB free)
    ops = [("a", "big", 40 * MiB), ("f", "big"), ("a", "x", 10 * MiB)]
    # WHEN 40 MiB more is requested THEN the split segment cannot be released: a simulated OOM,
    # with the segment's 30 MiB tail as the largest free block
    r = torch_run(*ops, ("a", "y", 40 * MiB), capacity=64 * MiB)
    assert r.ooms == 1 and r.segments(LOG_SEGMENT_FREE) == []
    assert int(r.r.oom_largest_free_bytes[0]) == 30 * MiB


def test_empty_cache_releases_whole_free_segments_only() -> None:
    # GIVEN a split segment with a live block and a whole free segment
    r = torch_run(("a", "x", 5 * MiB), ("a", "y", 16 * MiB), ("f", "y"), ("e",))
    # WHEN empty_cache() runs THEN only the whole segment goes
    assert r.segments(LOG_SEGMENT_FREE) == [16 * MiB]
    assert r.reserved == 20 * MiB


def test_garbage_collection_frees_old_whole_segments_before_cudamalloc() -> None:
    # GIVEN a 100 MiB device, threshold 0.5, and 60 MiB of cached whole segments
    ops = [("a", "x", 30 * MiB), ("a", "y", 30 * MiB), ("f", "x"), ("f", "y")]
    # WHEN 40 MiB is requested (no cached block fits)
    r = torch_run(*ops, ("a", "z", 40 * MiB), capacity=100 * MiB,
                  conf="garbage_collection_threshold=0.5")  # fmt: skip
    # THEN reserved (60 MiB) is over 50 MiB, so the collector frees cached segments first
    assert r.segments(LOG_SEGMENT_FREE) == [30 * MiB, 30 * MiB]
    assert r.reserved == 40 * MiB
    # AND without the threshold nothing would be freed
    assert torch_run(*ops, ("a", "z", 40 * MiB), capacity=100 * MiB).reserved == 100 * MiB


def test_garbage_collection_ages_blocks_by_their_pools_clock_shared_by_every_stream() -> None:
    # GIVEN a 100 MiB device, threshold 0.5: a 30 MiB segment cached on stream 1, then another
    # on stream 0 that stream 0 reuses three times (each get_free_block call ticks the large
    # pool's one clock, whichever stream asks)
    ops = [("a", "b", 30 * MiB, 1), ("f", "b"), ("a", "a", 30 * MiB, 0), ("f", "a")]
    for k in range(3):
        ops += [("a", f"x{k}", 30 * MiB, 0), ("f", f"x{k}")]
    # WHEN 45 MiB is requested on stream 0 (60 MiB reserved is over the 50 MiB threshold) and
    # then 30 MiB on stream 0 again
    r = torch_run(*ops, ("a", "d", 45 * MiB, 0), ("a", "y", 30 * MiB, 0), capacity=100 * MiB,
                  conf="garbage_collection_threshold=0.5")  # fmt: skip
    # THEN the collector frees stream 1's segment, idle for five calls, and keeps stream 0's,
    # which the last 30 MiB request reuses: no cudaMalloc for it
    assert r.segments(LOG_SEGMENT_FREE) == [30 * MiB]
    assert r.segments(LOG_SEGMENT_ALLOC) == [30 * MiB, 30 * MiB, 46 * MiB]
    assert r.reserved == 76 * MiB


# ---------------------------------------------------------------- torch: expandable segments


def test_expandable_segments_map_whole_pages_of_the_rounded_request() -> None:
    conf = "expandable_segments=True"
    # GIVEN expandable segments WHEN 1 KiB and 30 MiB are requested
    r = torch_run(("a", "s", KiB), ("a", "x", 30 * MiB), conf=conf)
    # THEN the small pool maps one 2 MiB page and the large pool two 20 MiB pages
    assert r.segments(LOG_SEGMENT_MAP) == [2 * MiB, 40 * MiB]
    assert r.segments(LOG_SEGMENT_ALLOC) == []
    assert r.reserved == 42 * MiB


def test_expandable_oom_path_unmaps_free_pages_and_maps_again() -> None:
    # GIVEN 100 MiB of device and expandable segments: 80 MiB mapped, of which the first
    # 40 MiB and the top 20 MiB are free
    ops = [("a", "a", 40 * MiB), ("a", "b", 20 * MiB), ("a", "c", 20 * MiB), ("f", "a"),
           ("f", "c")]  # fmt: skip
    # WHEN 60 MiB is requested: growing the free top needs 40 MiB more, 120 MiB in all
    conf = "expandable_segments=True"
    r = torch_run(*ops, ("a", "d", 60 * MiB), capacity=100 * MiB, conf=conf)
    # THEN the device refuses, the free pages are unmapped, and the retry maps 60 MiB
    assert r.segments(LOG_SEGMENT_UNMAP) == [20 * MiB, 40 * MiB]
    assert r.segments(LOG_SEGMENT_MAP) == [40 * MiB, 20 * MiB, 20 * MiB, 60 * MiB]
    assert r.reserved == 80 * MiB and r.ooms == 0
    # AND on a device with room the top simply grows
    roomy = torch_run(*ops, ("a", "d", 60 * MiB), capacity=200 * MiB, conf=conf)
    assert roomy.segments(LOG_SEGMENT_UNMAP) == [] and roomy.reserved == 120 * MiB


def test_expandable_segment_grows_in_place_from_its_free_tail() -> None:
    conf = "expandable_segments=True"
    # GIVEN 30 MiB allocated in 40 MiB of mapped pages (10 MiB free at the end)
    # WHEN 30 MiB more is requested THEN one more 20 MiB page is mapped after the free tail
    r = torch_run(("a", "x", 30 * MiB), ("a", "y", 30 * MiB), conf=conf)
    assert r.segments(LOG_SEGMENT_MAP) == [40 * MiB, 20 * MiB]
    assert r.reserved == 60 * MiB and r.free == 0


def test_expandable_release_unmaps_only_whole_free_pages() -> None:
    conf = "expandable_segments=True"
    # GIVEN 5 MiB live at the start of a 20 MiB page and 45 MiB freed after it
    ops = [("a", "x", 5 * MiB), ("a", "y", 45 * MiB), ("f", "y")]
    # WHEN the cache is emptied THEN the two pages after the first are unmapped, the first stays
    r = torch_run(*ops, ("e",), conf=conf)
    assert r.segments(LOG_SEGMENT_UNMAP) == [40 * MiB]
    assert r.reserved == 20 * MiB and r.free == 15 * MiB


def test_expandable_segments_grow_where_split_segments_would_run_out() -> None:
    # GIVEN a 100 MiB device: a 60 MiB block freed, then 30 MiB and 10 MiB carved from it and
    # the 30 MiB freed again, so 50 MiB of the 60 MiB is free around a live 10 MiB block
    ops = [("a", "x", 60 * MiB), ("f", "x"), ("a", "y", 30 * MiB), ("a", "z", 10 * MiB),
           ("f", "y"), ("a", "w", 50 * MiB)]  # fmt: skip
    # WHEN 50 MiB is requested
    native = torch_run(*ops, capacity=100 * MiB)
    expandable = torch_run(*ops, capacity=100 * MiB, conf="expandable_segments=True")
    # THEN the native allocator cannot release its split segment: a simulated OOM
    assert native.ooms == 1 and native.reserved == 60 * MiB
    # AND the expandable segment maps two more pages after its free 20 MiB tail
    assert expandable.ooms == 0
    assert expandable.segments(LOG_SEGMENT_MAP) == [60 * MiB, 40 * MiB]
    assert expandable.reserved == 100 * MiB


# --------------------------------------------------------------------- the reference heaps


HOLES = [("a", "A", 10 * KiB), ("a", "B", KiB), ("a", "C", 4 * KiB), ("a", "D", KiB),
         ("f", "A"), ("f", "C")]  # fmt: skip


def test_best_fit_takes_the_smallest_hole() -> None:
    # GIVEN holes of 10 KiB (lower) and 4 KiB WHEN 4 KiB is requested
    r = run("best-fit", *HOLES, ("a", "x", 4 * KiB))
    # THEN the 4 KiB hole is used and the 10 KiB one stays whole
    assert r.largest == 2 * MiB - 16 * KiB  # the slack up to the page is the largest free block
    assert r.free == 10 * KiB + 2 * MiB - 16 * KiB and r.blocks == 2


def test_first_fit_takes_the_lowest_hole() -> None:
    # GIVEN the same holes WHEN 4 KiB is requested
    r = run("first-fit", *HOLES, ("a", "x", 4 * KiB))
    # THEN it comes from the 10 KiB hole, leaving 6 KiB there and the 4 KiB hole
    assert r.free == 6 * KiB + 4 * KiB + 2 * MiB - 16 * KiB and r.blocks == 3


def test_heaps_coalesce_and_shrink_at_the_top() -> None:
    # GIVEN the holes WHEN B is freed THEN A, B and C merge into one 15 KiB hole
    r = run("best-fit", *HOLES, ("f", "B"))
    assert r.blocks == 2 and r.free == 15 * KiB + 2 * MiB - 16 * KiB
    # WHEN the top block goes too THEN the heap shrinks to nothing
    empty = run("best-fit", *HOLES, ("f", "B"), ("f", "D"))
    assert empty.reserved == 0 and empty.free == 0 and empty.blocks == 0


def test_heap_runs_out_at_the_capacity() -> None:
    r = run("first-fit", ("a", "x", 40 * MiB), ("a", "y", 30 * MiB), capacity=64 * MiB)
    assert r.ooms == 1 and r.reserved == 40 * MiB
    assert int(r.r.oom_largest_free_bytes[0]) == 0


def test_cuda_async_keeps_its_high_water_reservation() -> None:
    # GIVEN a 40 MiB allocation freed WHEN nothing else happens
    # THEN best fit returns the pages, the stream-ordered pool keeps them (release threshold ∞)
    assert run("best-fit", ("a", "x", 40 * MiB), ("f", "x")).reserved == 0
    pool = run("cuda-async", ("a", "x", 40 * MiB), ("f", "x"))
    assert pool.reserved == 40 * MiB and pool.free == 40 * MiB


def test_cuda_async_reuses_memory_across_streams() -> None:
    r = run("cuda-async", ("a", "x", 40 * MiB, 0), ("f", "x"), ("a", "y", 40 * MiB, 1))
    assert r.reserved == 40 * MiB


# ---------------------------------------------------------------------------------- buddy


def test_buddy_rounds_up_to_a_power_of_two_and_splits_down_to_it() -> None:
    # GIVEN an empty arena WHEN 3 KiB is requested
    r = run("buddy", ("a", "x", 3 * KiB))
    # THEN it takes a 4 KiB block; the split left one free block of each order 4 KiB .. 1 MiB
    # inside the page it lives in
    assert r.allocated == 4 * KiB and r.reserved == 2 * MiB
    assert r.blocks == 9 and r.largest == MiB and r.free == 2 * MiB - 4 * KiB


def test_buddies_merge_back_when_both_are_free() -> None:
    # GIVEN two 512 B buddies WHEN both are freed THEN they merge up to the whole arena
    r = run("buddy", ("a", "x", 512), ("a", "y", 512), ("f", "x"))
    # x's 512 B is free beside live y, with the split's blocks of 1 KiB .. 1 MiB
    assert r.blocks == 12 and r.reserved == 2 * MiB
    both = run("buddy", ("a", "x", 512), ("a", "y", 512), ("f", "x"), ("f", "y"))
    assert both.reserved == 0 and both.blocks == 0


def test_buddy_blocks_that_are_not_buddies_do_not_merge() -> None:
    # GIVEN four 512 B blocks WHEN the second and third are freed (neighbours, not buddies)
    ops = [("a", k, 512) for k in "abcd"] + [("f", "b"), ("f", "c")]
    r = run("buddy", *ops)
    # THEN they stay two free blocks
    assert r.free == 2 * MiB - 1024 and r.largest == MiB
    assert int(r.r.free_blocks[-1]) == int(r.r.free_blocks[3]) + 2


# ----------------------------------------------------------------------------------- slab


def test_slab_size_classes_are_four_per_doubling() -> None:
    classes = size_classes()
    assert classes[:8].tolist() == [512, 1024, 1536, 2048, 2560, 3072, 3584, 4096]
    assert classes[-1] == MiB
    idx = class_of(np.array([1, 700, 2000, MiB, MiB + 1]), classes)
    assert classes[idx[:4]].tolist() == [512, 1024, 2048, MiB] and idx[4] == -1


def test_a_class_fills_one_slab_before_taking_another() -> None:
    # GIVEN two 700 B requests THEN both take 1 KiB slots of one 2 MiB slab
    r = run("slab", ("a", "x", 700), ("a", "y", 700))
    assert r.reserved == 2 * MiB and r.allocated == 2 * KiB
    assert r.free == 2 * MiB - 2 * KiB and r.blocks == 1


def test_different_classes_use_different_slabs_and_large_objects_the_heap() -> None:
    r = run("slab", ("a", "x", 700), ("a", "y", 3000), ("a", "z", 3 * MiB))
    assert r.reserved == 2 * MiB + 2 * MiB + 4 * MiB  # two slabs, then 3 MiB on the heap
    assert r.allocated == 1024 + 3072 + 3 * MiB


def test_an_empty_slab_goes_back_to_the_heap() -> None:
    r = run("slab", ("a", "x", 700), ("a", "y", 700), ("f", "x"), ("f", "y"))
    assert r.reserved == 0 and r.free == 0


# ------------------------------------------------------------------------------- policies


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("torch", "torch"),
        ("torch:expandable_segments=True", "torch:expandable_segments=True"),
        ("torch:expandable_segments:True,max_split_size_mb:128",
         "torch:expandable_segments=True,max_split_size_mb=128"),
        ("torch=max_split_size_mb=128", "torch:max_split_size_mb=128"),
        ("Best_Fit", "best-fit"),
        ("cudaMallocAsync", "cuda-async"),
    ],
)  # fmt: skip
def test_policy_names_accept_colon_and_equals_forms(text: str, name: str) -> None:
    assert parse_policy(text).name == name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tcmalloc", "unknown policy"),
        ("best-fit:x=1", "takes no options"),
        ("torch:frobnicate=1", "unknown"),
        ("torch:expandable_segments=maybe", "True or False"),
        ("torch:garbage_collection_threshold=1.5", "between"),
        ("torch:roundup_power2_divisions=3", "power of 2"),
        ("torch:backend=cudaMallocAsync", "cuda-async"),
        ("torch:max_split_size_mb", "KEY=VALUE"),
    ],
)
def test_bad_policies_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_policy(text)


def test_alloc_conf_round_trips() -> None:
    p = parse_policy("torch:max_split_size_mb=128,expandable_segments=True")
    assert p.alloc_conf() == "expandable_segments:True,max_split_size_mb:128"
    assert parse_policy("torch").alloc_conf() == ""
    assert parse_policy("cuda-async").alloc_conf() == "backend:cudaMallocAsync"
    assert parse_policy("buddy").alloc_conf() is None


def _random_stream(seed: int, n: int = 400) -> RequestStream:
    rng = np.random.default_rng(seed)
    sizes = np.where(rng.random(n) < 0.6, rng.integers(1, MiB, n), rng.integers(MiB, 48 * MiB, n))
    life = rng.geometric(0.05, n)
    times = np.concatenate([np.arange(n) * 2, np.arange(n) * 2 + 2 * life + 1])
    kind = np.concatenate([np.full(n, ALLOC), np.full(n, FREE)])
    req = np.concatenate([np.arange(n), np.arange(n)])
    order = np.argsort(times, kind="stable")
    return RequestStream.build(kind[order], req[order], times[order], sizes, rng.integers(0, 2, n))


@pytest.mark.parametrize("policy", DEFAULT_POLICIES)
@pytest.mark.parametrize("seed", [1, 2])
def test_every_model_keeps_its_books(policy: str, seed: int) -> None:
    # GIVEN a random stream on a device that is sometimes too small
    s = _random_stream(seed)
    capacity = 700 * MiB
    r = parse_policy(policy).simulate(s, capacity)
    # THEN free memory is never negative, the largest free block is part of it, every block
    # holds at least its request, and reserved memory stays within the device
    assert (r.free_bytes >= 0).all() and (r.largest_free_bytes <= r.free_bytes).all()
    assert (r.allocated_bytes >= r.live_bytes).all()
    assert (r.reserved_bytes <= capacity).all()
    assert ((r.free_blocks == 0) == (r.free_bytes == 0)).all()
    if policy.startswith("torch") or policy in ("buddy",):
        # caching models: everything reserved is either handed out or cached free
        assert (r.reserved_bytes == r.free_bytes + r.allocated_bytes).all()
    # AND freeing everything leaves nothing live
    assert r.live_bytes[-1] == 0 and r.allocated_bytes[-1] == 0


def test_models_are_deterministic() -> None:
    s = _random_stream(3)
    for policy in DEFAULT_POLICIES:
        a = parse_policy(policy).simulate(s, 700 * MiB)
        b = parse_policy(policy).simulate(s, 700 * MiB)
        assert (a.reserved_bytes == b.reserved_bytes).all() and (a.free_bytes == b.free_bytes).all()


def test_unlimited_capacity_never_ooms() -> None:
    s = _random_stream(4)
    for policy in DEFAULT_POLICIES:
        assert len(parse_policy(policy).simulate(s, UNLIMITED >> 20).oom_event) == 0

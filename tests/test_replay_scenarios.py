"""GIVEN/WHEN/THEN scenarios for the observed model on the driver's pages (SPEC 1.2 §2–§4),
from nsys-shaped exports (pages of 2 MiB, BASE page-aligned)."""

from __future__ import annotations

import pytest

from nsysfrag.analysis import SpaceAnalysis, analyze
from nsysfrag.errors import InputError
from nsysfrag.inputs import InputOptions
from nsysfrag.inputs.nsys import read_export
from nsysfrag.testing.nsys_export import (
    FREE,
    MANAGED,
    PINNED,
    START_END,
    ApiRow,
    ExportOptions,
    Gpu,
    MemoryRow,
    NvtxRow,
)
from tests.conftest import BASE, MakeTrace, MiB

CAP = 64 * MiB


def alloc(t: int, offset: int, size: int, corr: int | None = None, pid: int = 1, device: int = 0, kind: int = 2) -> MemoryRow:
    return MemoryRow(t, pid, device, BASE + offset, size, kind=kind, correlation_id=corr)


def free(t: int, offset: int, size: int = 0, pid: int = 1, device: int = 0) -> MemoryRow:
    return MemoryRow(t, pid, device, BASE + offset, size, op=FREE)


def only_space(make_trace: MakeTrace, memory, **kw) -> SpaceAnalysis:  # type: ignore[no-untyped-def]
    spaces = analyze(read_export(make_trace(memory, **kw))).spaces
    assert len(spaces) == 1
    return spaces[0]


def test_single_allocation_strands_the_rest_of_its_page(make_trace: MakeTrace) -> None:
    # GIVEN one 1 MiB block at the base WHEN replayed THEN its page is resident, the other
    # 1 MiB of it stranded; the device's 62 MiB of free pages are the largest usable request
    s = only_space(make_trace, [alloc(10, 0, MiB)])
    assert s.counts.allocations == 1
    pool = s.final.pool
    assert pool is not None
    assert (pool.reserved_bytes, pool.allocated_bytes, pool.stranded_bytes) == (2 * MiB, MiB, MiB)
    assert s.final.free_blocks == 2  # the page's free half, and the free pages
    assert s.final.largest_free_bytes == CAP - 2 * MiB
    assert s.final.free_bytes == CAP - MiB
    assert s.final.global_frag == pytest.approx(MiB / CAP)
    assert s.base_address == BASE and not s.span_mode


def test_in_order_free_is_not_out_of_order(make_trace: MakeTrace) -> None:
    rows = [alloc(10, 0, 2 * MiB), alloc(20, 2 * MiB, 2 * MiB), free(30, 2 * MiB)]
    s = only_space(make_trace, rows)
    assert s.counts.frees == 1
    assert s.out_of_order_frees == 0 and s.hole_creating_frees == 0
    assert s.final.free_blocks == 1


def test_out_of_order_free_between_live_blocks_creates_a_hole(make_trace: MakeTrace) -> None:
    # GIVEN A|B|C packed WHEN B is freed THEN B's range is a hole bounded by A and C
    s = only_space(
        make_trace, [alloc(10, 0, MiB), alloc(20, MiB, 2 * MiB), alloc(30, 3 * MiB, MiB), free(40, MiB)]
    )
    assert s.out_of_order_frees == 1 and s.hole_creating_frees == 1
    assert s.final.free_blocks == 2
    assert s.final.free_bytes == CAP - 2 * MiB
    assert s.final.largest_free_bytes == CAP - 4 * MiB
    assert s.final.global_frag == pytest.approx(2 * MiB / CAP)
    assert s.hotspots[0].hole_bytes == 2 * MiB and s.hotspots[0].size_class == "2–4 MiB"


def test_out_of_order_free_of_a_whole_page_creates_no_hole(make_trace: MakeTrace) -> None:
    # GIVEN A|B, a page each WHEN A (not the newest) is freed THEN out of order, but its page
    # goes back to the device: no hole
    s = only_space(make_trace, [alloc(10, 0, 2 * MiB), alloc(20, 2 * MiB, 2 * MiB), free(30, 0)])
    assert s.out_of_order_frees == 1 and s.hole_creating_frees == 0
    assert s.final.free_blocks == 1


def test_out_of_order_free_beside_a_live_block_in_its_page_creates_a_hole(make_trace: MakeTrace) -> None:
    # GIVEN A|B in one page WHEN A is freed THEN its MiB stays in the page B keeps resident
    s = only_space(make_trace, [alloc(10, 0, MiB), alloc(20, MiB, MiB), free(30, 0)])
    assert s.out_of_order_frees == 1 and s.hole_creating_frees == 1
    assert s.hotspots[0].hole_bytes == MiB
    assert s.final.free_blocks == 2


def test_freeing_neighbours_merges_free_blocks(make_trace: MakeTrace) -> None:
    # GIVEN A|B|C|D with holes at B and C WHEN both are freed THEN one merged hole of B+C
    rows = [alloc(10 * i, i * MiB, MiB) for i in range(4)] + [free(50, MiB), free(60, 2 * MiB)]
    s = only_space(make_trace, rows)
    assert s.final.free_blocks == 2
    assert s.final.free_bytes - s.final.largest_free_bytes == 2 * MiB
    assert s.hole_creating_frees == 2


def test_free_of_unknown_address_is_unmatched_and_changes_nothing(make_trace: MakeTrace) -> None:
    s = only_space(make_trace, [alloc(10, 0, MiB), free(20, 5 * MiB), free(30, 512)])
    assert s.counts.unmatched_frees == 2 and s.counts.frees == 0
    assert s.final.live_bytes == MiB


def test_free_keeps_the_allocation_size(make_trace: MakeTrace) -> None:
    s = only_space(make_trace, [alloc(10, 0, MiB), alloc(20, MiB, MiB), free(30, 0, size=1)])
    assert s.final.live_bytes == MiB and s.final.free_bytes == CAP - MiB


def test_overlapping_allocation_evicts_the_live_blocks_it_covers(make_trace: MakeTrace) -> None:
    # GIVEN two live blocks WHEN a new block covers both THEN one overlap, both removed silently
    rows = [alloc(10, 0, MiB), alloc(20, MiB, MiB), alloc(30, 512 * 1024, MiB), free(40, 0)]
    s = only_space(make_trace, rows)
    assert s.counts.overlaps == 1
    assert s.counts.frees == 0 and s.counts.unmatched_frees == 1
    assert s.final.live_bytes == MiB


def test_zero_size_allocation_is_counted_not_placed(make_trace: MakeTrace) -> None:
    s = only_space(make_trace, [alloc(10, 0, 2 * MiB), alloc(20, 4 * MiB, 0)])
    assert s.counts.zero_size_allocs == 1 and s.counts.allocations == 1
    assert s.final.free_blocks == 1


def test_footprint_rounds_to_granularity_and_internal_frag_measures_it(make_trace: MakeTrace) -> None:
    s = only_space(make_trace, [alloc(10, 0, 100), alloc(20, 512, 512)])
    assert s.final.free_bytes == CAP - 1024
    assert s.internal_frag == pytest.approx(412 / 1024)


def test_addresses_farther_apart_than_the_device_hold_no_free_memory(make_trace: MakeTrace) -> None:
    # GIVEN two 1 MiB blocks 100 MiB of addresses apart on a 64 MiB device WHEN replayed THEN
    # only their two pages are reserved: the gap is no free memory (no span mode any more)
    s = only_space(make_trace, [alloc(10, 0, MiB), alloc(20, 100 * MiB, MiB)])
    assert not s.span_mode
    assert s.final.free_bytes == CAP - 2 * MiB  # 60 MiB of free pages, 2 MiB stranded
    assert s.final.largest_free_bytes == CAP - 4 * MiB


def test_capacity_override(make_trace: MakeTrace) -> None:
    path = make_trace([alloc(10, 0, MiB)])
    s = analyze(read_export(path, InputOptions(capacity_bytes=8 * MiB))).spaces[0]
    assert s.capacity_bytes == 8 * MiB and s.final.free_bytes == 7 * MiB


def test_peak_is_the_first_event_at_the_maximum(make_trace: MakeTrace) -> None:
    rows = [alloc(10 * (i + 1), i * MiB, MiB) for i in range(3)]
    rows += [free(40, MiB), alloc(50, MiB, MiB), free(60, MiB)]  # the maximum recurs at 60
    s = only_space(make_trace, rows)
    assert s.peak.time_ns == 40
    assert s.peak_index == 3


def test_equal_timestamps_keep_row_order(make_trace: MakeTrace) -> None:
    # The free comes after its allocation in the table, at the same time stamp.
    s = only_space(make_trace, [alloc(10, 0, MiB), free(10, 0)])
    assert s.counts.frees == 1 and s.counts.unmatched_frees == 0


def test_negative_timestamps_and_high_addresses(make_trace: MakeTrace) -> None:
    high = (1 << 63) + (1 << 40)  # stored as a negative SQLite integer
    rows = [
        MemoryRow(-500, 1, 0, high, MiB),
        MemoryRow(20, 1, 0, high + MiB, MiB),
        MemoryRow(30, 1, 0, high, MiB, op=FREE),
    ]
    s = only_space(make_trace, rows)
    assert s.base_address == high
    assert s.peak.time_ns == -500 or s.final.time_ns == 30
    assert s.counts.frees == 1 and s.counts.unmatched_frees == 0


def test_other_kinds_are_counted_not_replayed(make_trace: MakeTrace) -> None:
    rows = [alloc(10, 0, MiB), alloc(20, 64 * MiB, MiB, kind=PINNED), alloc(30, 65 * MiB, MiB, kind=MANAGED)]
    s = only_space(make_trace, rows)
    assert s.counts.other_kind_events == 2
    assert s.counts.allocations == 1 and not s.span_mode


def test_spaces_per_process_and_device_with_cuda_device_mapping(make_trace: MakeTrace) -> None:
    # GIVEN two ranks that each see their GPU as CUDA device 0 on different nsys GPUs
    rows = [alloc(10, 0, MiB, pid=11), alloc(20, 0, MiB, pid=12), alloc(30, 0, MiB, pid=12, device=1)]
    gpus = [Gpu(0, "small", 16 * MiB), Gpu(1, "big", 32 * MiB)]
    opts = ExportOptions(cuda_devices=[(11, 0, 0), (12, 0, 1), (12, 1, 0)])
    spaces = analyze(read_export(make_trace(rows, gpus=gpus, options=opts))).spaces
    assert [(s.pid, s.device, s.capacity_bytes, s.device_name) for s in spaces] == [
        (11, 0, 16 * MiB, "small"),
        (12, 0, 32 * MiB, "big"),
        (12, 1, 16 * MiB, "small"),
    ]


def test_missing_gpu_row_asks_for_capacity(make_trace: MakeTrace) -> None:
    path = make_trace([alloc(10, 0, MiB, device=3)])
    with pytest.raises(InputError, match="--capacity"):
        analyze(read_export(path))
    assert analyze(read_export(path, InputOptions(capacity_bytes=CAP))).spaces[0].device == 3


def test_failures_are_charged_to_the_threads_last_device(make_trace: MakeTrace) -> None:
    # GIVEN thread 7 allocates on device 1, thread 8 never allocates WHEN both see failures
    rows = [alloc(10, 0, MiB, corr=1), alloc(20, 0, MiB, corr=2, device=1)]
    api = [
        ApiRow(5, 15, 1, 7, "cudaMalloc_v3020", 1),
        ApiRow(18, 25, 1, 7, "cudaMalloc_v3020", 2),
        ApiRow(30, 31, 1, 7, "cudaMalloc_v3020", 3, return_value=2),
        ApiRow(32, 33, 1, 7, "cuMemAlloc_v2", 4, return_value=2, event_class=1),
        ApiRow(40, 41, 1, 8, "cudaMallocAsync_v11020", 5, return_value=2),
        ApiRow(2, 3, 1, 7, "cudaMalloc_v3020", 6, return_value=2),  # before any allocation
        ApiRow(50, 51, 1, 7, "cudaLaunchKernel_v7000", 7, return_value=1),  # not an allocation
    ]
    gpus = [Gpu(0, total_memory=CAP), Gpu(1, total_memory=CAP)]
    spaces = analyze(read_export(make_trace(rows, api=api, gpus=gpus))).spaces
    assert [s.counts.failed_allocations for s in spaces] == [2, 2]
    assert spaces[1].alloc_failure_rate == pytest.approx(2 / 3)


def test_sites_come_from_enclosing_nvtx_ranges(make_trace: MakeTrace) -> None:
    rows = [
        alloc(10, 0, MiB, corr=1),
        alloc(20, MiB, MiB, corr=2),
        alloc(30, 2 * MiB, MiB, corr=3),
        alloc(40, 3 * MiB, MiB, corr=4),
        alloc(45, 4 * MiB, MiB),  # no correlation id
        alloc(50, 5 * MiB, MiB, corr=6),
    ]
    rows += [free(60 + i, i * MiB) for i in range(5)]
    api = [
        ApiRow(9, 11, 1, 7, "cudaMalloc_v3020", 1),
        ApiRow(19, 21, 1, 7, "cudaMalloc_v3020", 2),
        ApiRow(19, 21, 1, 7, "cuMemAlloc_v2", 2, event_class=1),
        ApiRow(29, 31, 1, 7, "cudaMalloc_v3020", 3),
        ApiRow(39, 41, 1, 9, "cudaMalloc_v3020", 4),
        ApiRow(49, 51, 1, 7, "cudaMalloc_v3020", 6),
    ]
    nvtx = [
        NvtxRow(0, 100, 1, 7, "step"),
        NvtxRow(15, 25, 1, 7, "forward"),
        NvtxRow(18, 22, 1, 7, "attn"),
        NvtxRow(25, 35, 1, 7, "backward"),  # range.start <= t < range.end: encloses 29 not 25
        NvtxRow(35, 45, 1, 9, "outer", event_type=START_END),
        NvtxRow(38, 42, 1, 9, "inner", event_type=START_END),
        NvtxRow(0, 100, 1, 8, "other thread"),
    ]
    s = only_space(make_trace, rows, api=api, nvtx=nvtx)
    sites = {h.site for h in s.hotspots}
    # Every block but the last-allocated is freed out of order. Two 1 MiB blocks share each
    # page: freeing the first of a pair strands its MiB, pinned by the second.
    assert sites == {"step", "step/forward/attn", "step/backward", "inner", "(no range)"}
    pinned = {h.site: h.pinned_by for h in s.hotspots if h.hole_creating_frees}
    assert pinned == {"step": ("step/forward/attn",), "step/backward": ("inner",),
                      "(no range)": ("step",)}  # fmt: skip


def test_registered_nvtx_strings_resolve_through_string_ids(make_trace: MakeTrace) -> None:
    rows = [alloc(10, 0, MiB, corr=1), alloc(20, MiB, MiB, corr=2), free(30, 0)]
    api = [ApiRow(9, 11, 1, 7, "cudaMalloc_v3020", 1), ApiRow(19, 21, 1, 7, "cudaMalloc_v3020", 2)]
    nvtx = [NvtxRow(0, 15, 1, 7, "registered")]
    s = only_space(make_trace, rows, api=api, nvtx=nvtx, options=ExportOptions(registered_nvtx_strings=True))
    assert s.hotspots[0].site == "registered"


def test_health_is_the_worst_rated_metric(make_trace: MakeTrace) -> None:
    # GIVEN 400 packed blocks in one page WHEN every other one of the first 300 is freed THEN
    # 152 free blocks (150 holes, the page's tail, the device's free pages: warn) while global
    # and local fragmentation stay tiny (ok): health is warn
    rows = [alloc(i, i * 512, 512) for i in range(400)]
    rows += [free(1000 + i, i * 512) for i in range(0, 300, 2)]
    s = only_space(make_trace, rows)
    assert s.max_free_blocks == 152
    assert s.max_global_frag < 0.2 and s.max_local_frag < 0.3
    assert s.health.label == "warn"

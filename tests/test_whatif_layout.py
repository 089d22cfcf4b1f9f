"""The torch model's state at the start of a snapshot's window (``whatif/layout.py``): a
hand-made layout, and the invariants every layout keeps on random allocator workloads (some
corrupted): each segment tiled exactly, the live blocks placed in order as the first requests,
every live block inside a segment either placed or counted as a conflict, and the validation
replay running from it."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings

from nsysfrag.allocators import TorchConfig
from nsysfrag.inputs.torch_snapshot.columns import snapshot_columns
from nsysfrag.models.segments.compiled import WindowLayout
from nsysfrag.models.segments.requests import first_seen, segment_of
from nsysfrag.whatif.capacity import recorded_devices
from nsysfrag.whatif.layout import ES_VA_VALIDATION, start_layout
from nsysfrag.whatif.streams import snapshot_config
from nsysfrag.whatif.validate import validate_snapshot
from tests.test_segments_kernel import EXAMPLES, snapshots
from tests.kernel_modes import both_kernels  # noqa: F401  (every test both ways)

MiB = 1 << 20
UNMAPPED, FREE, LIVE = -1, 0, 1


def window(segments: list[tuple[int, int, bool]], blocks: list[tuple[int, int, int]]) -> WindowLayout:
    """A window start: (start, size, expandable) per large-pool segment on the default stream,
    (address, size or -1 where the final state does not say, requested) per live block."""
    z = np.zeros(len(segments), dtype=np.int64)

    def col(rows: list[Any], k: int) -> Any:
        return np.array([r[k] for r in rows], dtype=np.int64)

    return WindowLayout(
        segment_start=col(segments, 0), segment_end=col(segments, 0) + col(segments, 1),
        segment_stream=z, segment_small_pool=z.copy(),
        segment_expandable=np.array([s[2] for s in segments], dtype=np.bool_),
        block_address=col(blocks, 0), block_size=col(blocks, 1), block_requested=col(blocks, 2),
        block_site=np.zeros(len(blocks), dtype=np.int64), known_size=np.zeros(0, np.int64),
        conflicts=0,
    )  # fmt: skip


def test_a_window_start_becomes_the_models_segments_and_blocks() -> None:
    # GIVEN two 20 MiB cudaMalloc segments and two mapped ranges of an expandable segment with
    # a 20 MiB hole between them; live: a 1 MiB block the final state knows, a 3 MiB and a
    # 19 MiB request freed in the window (sizes unknown), and a 5 MiB block in the second range
    a, b, e = 0x1000_0000, 0x2000_0000, 0x4000_0000
    start = window(
        [(a, 20 * MiB, False), (b, 20 * MiB, False), (e, 20 * MiB, True), (e + 40 * MiB, 20 * MiB, True)],
        [(a + 2 * MiB, MiB, MiB), (a + 10 * MiB, -1, 3 * MiB), (b, -1, 19 * MiB),
         (e + 40 * MiB, 5 * MiB, 5 * MiB)],
    )  # fmt: skip
    # WHEN the torch model's initial state is built from it
    got = start_layout(start, TorchConfig(), np.zeros(4, dtype=np.int64))
    layout = got.layout
    # THEN each cudaMalloc segment is tiled by its blocks; the 3 MiB request took 3 MiB (PyTorch
    # split the 7 MiB after it off), the 19 MiB one the whole segment (1 MiB is not split off)
    assert layout.segment_address.tolist() == [a, b, e]
    assert layout.segment_size.tolist() == [20 * MiB, 20 * MiB, 40 * MiB]
    assert layout.segment_expandable.tolist() == [-1, -1, 0]
    rows = list(zip(layout.block_segment.tolist(), layout.block_address.tolist(),
                    layout.block_size.tolist(), layout.block_state.tolist(),
                    layout.block_request.tolist(), strict=True))  # fmt: skip
    assert rows == [
        (0, a, 2 * MiB, FREE, -1), (0, a + 2 * MiB, MiB, LIVE, 0),
        (0, a + 3 * MiB, 7 * MiB, FREE, -1), (0, a + 10 * MiB, 3 * MiB, LIVE, 1),
        (0, a + 13 * MiB, 7 * MiB, FREE, -1),
        (1, b, 20 * MiB, LIVE, 2),
        # AND the expandable ranges are one virtual range: the hole and the room after unmapped
        (2, e, 20 * MiB, FREE, -1), (2, e + 20 * MiB, 20 * MiB, UNMAPPED, -1),
        (2, e + 40 * MiB, 5 * MiB, LIVE, 3), (2, e + 45 * MiB, 15 * MiB, FREE, -1),
        (2, e + 60 * MiB, ES_VA_VALIDATION, UNMAPPED, -1),
    ]
    (es,) = layout.expandables
    assert (int(es["base"]), int(es["va"]), int(es["page"])) == (e, 60 * MiB + ES_VA_VALIDATION, 20 * MiB)
    # AND the live blocks are the first requests, in that order
    assert got.placed.tolist() == [0, 1, 2, 3] and got.conflicts == 0


def test_a_block_ends_where_the_next_begins_and_an_empty_one_is_a_conflict() -> None:
    # GIVEN a 4 MiB block with another live block 1 MiB above it, and a block of no bytes
    a = 0x1000_0000
    blocks = [(a, 4 * MiB, 4 * MiB), (a + MiB, MiB, MiB), (a + 5 * MiB, 0, 0)]
    start = window([(a, 20 * MiB, False)], blocks)
    got = start_layout(start, TorchConfig(), np.zeros(1, dtype=np.int64))
    # THEN the first is cut short, the second placed, the empty one a conflict
    assert got.placed.tolist() == [0, 1] and got.conflicts == 1
    assert got.layout.block_size.tolist() == [MiB, MiB, 18 * MiB]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(corrupt=True))
def test_every_layout_tiles_its_segments_and_places_its_blocks(snap: dict[str, Any]) -> None:
    columns = snapshot_columns(snap, "snapshot")
    config = snapshot_config(columns)
    for d in recorded_devices(columns):
        w = d.window
        got = start_layout(w, config, first_seen(w.segment_stream)[0])
        layout = got.layout
        for s in range(len(layout.segment_address)):
            mine = layout.block_segment == s
            address, size = layout.block_address[mine], layout.block_size[mine]
            # contiguous, from the segment's start to its end (an expandable one: its VA's)
            assert (address[1:] == address[:-1] + size[:-1]).all()
            assert address[0] == layout.segment_address[s]
            mapped = size[layout.block_state[mine] != UNMAPPED].sum()
            assert mapped == layout.segment_size[s]
            e = layout.segment_expandable[s]
            top = layout.segment_address[s] + (
                layout.segment_size[s] if e < 0 else layout.expandables[e]["va"]
            )
            assert address[-1] + size[-1] == top
        live = layout.block_state == LIVE
        assert layout.block_request[live].tolist() == list(range(len(got.placed)))
        assert (layout.block_address[live] == w.block_address[got.placed]).all()
        inside = int((segment_of(w, w.block_address) >= 0).sum())
        assert len(got.placed) + got.conflicts == inside
    # AND the validation replay runs from every such layout
    validate_snapshot(columns)

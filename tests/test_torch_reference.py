"""Property test: the compiled ``torch`` model agrees with a plain transcription of PyTorch's
caching allocator (tests/torch_reference.py) after every event — reserved, allocated, the
cached free blocks, every cudaMalloc / cudaFree / map / unmap, and which requests fail — on
random multi-stream streams, mostly on devices too small for them, so that the pressure path
(garbage collection, release_available_cached_blocks, release_cached_blocks with the frees
that wait on other streams, the retry, the OOM) runs often, under every option the model
takes."""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysfrag.allocators import TorchConfig
from nsysfrag.allocators.base import ALLOC, EMPTY_CACHE, FREE, RequestStream
from nsysfrag.allocators.torch import simulate_torch
from nsysfrag.models.segments.rules import division_table
from tests.torch_reference import Options, reference_replay
from tests.kernel_modes import both_kernels  # noqa: F401  (every test both ways)

KiB, MiB = 1 << 10, 1 << 20
# CI runs the default; NSYSFRAG_PROPERTY_EXAMPLES=5000 for a deeper local check.
EXAMPLES = int(os.environ.get("NSYSFRAG_PROPERTY_EXAMPLES", "150"))
VA = 1 << 40  # an expandable segment's virtual size (PyTorch: 1.125 x the GPU's memory)
# Sizes that collide often: repeated exact sizes make ties; the others cover every pool,
# segment size and rounding interval.
SIZES = [1, 512, 4 * KiB, 300 * KiB, MiB, MiB + 1, 3 * MiB, 9 * MiB, 10 * MiB, 12 * MiB,
         20 * MiB, 25 * MiB, 40 * MiB, 64 * MiB, 100 * MiB]  # fmt: skip


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[tuple[str, int, int, int]], int, Options]:
    n = draw(st.integers(1, 70))
    n_streams = draw(st.integers(1, 3))
    ops: list[tuple[str, int, int, int]] = []
    live: list[int] = []
    made = 0
    for _ in range(n):
        roll = draw(st.integers(0, 19))
        if live and roll < 8:
            op = "p" if draw(st.integers(0, 5)) == 0 else "f"  # used on another stream
            ops.append((op, live.pop(draw(st.integers(0, len(live) - 1))), 0, 0))
        elif roll == 19:
            ops.append(("e", 0, 0, 0))
        else:
            if draw(st.booleans()):
                size = draw(st.sampled_from(SIZES))
            else:
                size = draw(st.integers(1, 120 * MiB))
            ops.append(("a", made, size, draw(st.integers(0, n_streams - 1))))
            live.append(made)
            made += 1
    capacity = draw(st.sampled_from([40, 64, 100, 160, 256, 1 << 20])) * MiB
    mss = draw(st.sampled_from([None, 20, 32, 64]))
    options = Options(
        max_split_size=(mss * MiB) if mss else 1 << 62,
        max_non_split_rounding=draw(st.sampled_from([20, 40])) * MiB,
        divisions=list(division_table([draw(st.sampled_from([0, 0, 2, 4, 8]))] * 16)),
        expandable_segments=draw(st.booleans()),
        garbage_collection_threshold=draw(st.sampled_from([0.0, 0.0, 0.3, 0.6])),
    )
    return ops, capacity, options


def _model(ops: list[tuple[str, int, int, int]], capacity: int, o: Options):  # type: ignore[no-untyped-def]
    codes = {"a": ALLOC, "f": FREE, "p": FREE, "e": EMPTY_CACHE}
    sizes = [nbytes for op, _, nbytes, _ in ops if op == "a"]
    streams = [stream for op, _, _, stream in ops if op == "a"]
    pending = np.zeros(max(len(sizes), 1), dtype=np.int64)
    for op, r, _, _ in ops:
        if op == "p":
            pending[r] = 1
    stream = RequestStream.build(
        [codes[op] for op, *_ in ops], [r for _, r, _, _ in ops], np.arange(len(ops)),
        sizes or [1], streams or [0],
    )  # fmt: skip
    config = TorchConfig(
        max_split_size=o.max_split_size, max_non_split_rounding=o.max_non_split_rounding,
        roundup_power2_divisions=tuple(o.divisions), expandable_segments=o.expandable_segments,
        garbage_collection_threshold=o.garbage_collection_threshold,
    )  # fmt: skip
    return simulate_torch(stream, capacity, config, es_va_bytes=VA, pending_frees=pending)


@settings(max_examples=EXAMPLES, deadline=None)
@given(workloads())
def test_the_model_is_pytorchs_caching_allocator(
    case: tuple[list[tuple[str, int, int, int]], int, Options],
) -> None:
    ops, capacity, options = case
    # GIVEN a stream, a device and the allocator's options
    # WHEN the compiled model and the transcription of PyTorch's allocator replay it
    ref = reference_replay(ops, capacity, options, VA)
    got = _model(ops, capacity, options)
    # THEN the same requests fail
    assert got.oom_event.tolist() == ref.ooms
    # AND after every event reserved, allocated and the cached free blocks agree
    assert got.reserved_bytes.tolist() == ref.reserved
    assert got.allocated_bytes.tolist() == ref.allocated
    assert got.free_bytes.tolist() == ref.free
    assert got.largest_free_bytes.tolist() == ref.largest
    assert got.free_blocks.tolist() == ref.free_blocks
    # AND each event made the same cudaMalloc / cudaFree / map / unmap calls
    log = got.segment_log
    calls: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for kind, nbytes, event in zip(log["kind"], log["size"], log["event"], strict=True):
        calls[int(event)].append((int(kind), int(nbytes)))
    assert [sorted(calls[i]) for i in range(len(ops))] == ref.calls

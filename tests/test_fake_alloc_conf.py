"""The fake torch's allocator under each PYTORCH_CUDA_ALLOC_CONF setting
(tests/fake_torch/torch/_alloc_conf.py) behaves as PyTorch's rules say, so that a round of
``nsysfrag record --try`` on the fake measures real differences. Each case runs in a fresh
process (the fake's devices, like CUDA's, are made once per process)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.record_helpers import fake_env

MiB, GiB = 1 << 20, 1 << 30

PROLOGUE = """
import json, torch
MiB, GiB = 1 << 20, 1 << 30
def empty(n): return torch.empty(int(n), dtype=torch.uint8, device="cuda")
def stats(): return torch.cuda.memory_stats()
"""


def run(conf: str, body: str) -> dict[str, Any]:
    """Run ``body`` on the fake under ``conf``; it prints one JSON line, returned."""
    done = subprocess.run(
        [sys.executable, "-c", PROLOGUE + body],
        env=fake_env(PYTORCH_CUDA_ALLOC_CONF=conf), capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


REUSE = """
x = empty(300 * MiB); del x
y = empty(50 * MiB)
print(json.dumps({"reserved": stats()["reserved_bytes.all.current"], "max_split": stats()["max_split_size"]}))
"""


def test_max_split_size_keeps_a_small_request_out_of_an_oversize_block() -> None:
    # Natively the 50 MiB request splits the cached 300 MiB segment; with max_split_size_mb:200
    # that segment is oversize, so the request gets a segment of its own.
    assert run("", REUSE) == {"reserved": 300 * MiB, "max_split": -1}
    assert run("max_split_size_mb:200", REUSE) == {"reserved": 350 * MiB, "max_split": 200 * MiB}


def test_max_split_size_lets_an_oversize_request_take_a_block_at_most_20_mib_larger() -> None:
    body = """
x = empty(300 * MiB); del x
y = empty(290 * MiB); z = empty(250 * MiB)
print(json.dumps({"reserved": stats()["reserved_bytes.all.current"]}))
"""
    # 290 MiB takes the cached 300 MiB block whole; 250 MiB may not (50 MiB larger than it).
    assert run("max_split_size_mb:200", body) == {"reserved": 550 * MiB}


@pytest.mark.parametrize(("conf", "allocated"), [
    ("", 1100 * MiB),
    ("roundup_power2_divisions:2", 1536 * MiB),  # 1100 MiB → the next half step above 1 GiB
    ("roundup_power2_divisions:4", 1280 * MiB),  # → the next quarter step
    ("roundup_power2_divisions:[256:1,>:4]", 1280 * MiB),
])  # fmt: skip
def test_roundup_power2_divisions_rounds_request_sizes(conf: str, allocated: int) -> None:
    body = 'x = empty(1100 * MiB); print(json.dumps({"allocated": stats()["allocated_bytes.all.current"]}))'
    assert run(conf, body) == {"allocated": allocated}


def test_expandable_segments_grow_one_range() -> None:
    body = """
for i in range(5):
    x = empty((100 + 10 * i) * MiB); del x
print(json.dumps({"peak": stats()["reserved_bytes.all.peak"]}))
"""
    assert run("", body) == {"peak": (100 + 110 + 120 + 130 + 140) * MiB}
    assert run("expandable_segments:True", body) == {"peak": 140 * MiB}  # seven 20 MiB pages


def test_garbage_collection_works_only_with_a_memory_fraction() -> None:
    body = """
if FRACTION:
    torch.cuda.set_per_process_memory_fraction(0.5)
for i in range(30):
    x = empty((100 + 10 * i) * MiB); del x
print(json.dumps({"peak": stats()["reserved_bytes.all.peak"]}))
"""
    native = run("garbage_collection_threshold:0.5", "FRACTION = False\n" + body)["peak"]
    collected = run("garbage_collection_threshold:0.5", "FRACTION = True\n" + body)["peak"]
    assert native == sum((100 + 10 * i) * MiB for i in range(30))  # PyTorch: no fraction, no GC
    # With the fraction (4 GiB of 8) the collector frees old cached segments once reserved
    # passes half of it: the peak stays within the fraction.
    assert collected <= 4 * GiB < native


def test_cuda_malloc_async_caches_nothing_and_records_no_history() -> None:
    body = """
x = empty(300 * MiB); del x
s = stats()
try:
    torch.cuda.memory._record_memory_history(enabled="all")
    refused = False
except RuntimeError:
    refused = True
print(json.dumps({"reserved": s["reserved_bytes.all.current"], "peak": s["reserved_bytes.all.peak"],
                  "backend": torch.cuda.get_allocator_backend(), "refused": refused}))
"""
    assert run("backend:cudaMallocAsync", body) == {
        "reserved": 0, "peak": 300 * MiB, "backend": "cudaMallocAsync", "refused": True,
    }  # fmt: skip


def test_an_option_pytorch_does_not_know_ends_the_program_at_initialization() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROLOGUE + "empty(1)"],
        env=fake_env(PYTORCH_CUDA_ALLOC_CONF="expandable_segment:True"), capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "RuntimeError: Unrecognized CachingAllocator option: expandable_segment" in done.stderr

"""What a recorded process could reach: the capacity of a record's snapshot under a memory
fraction (the allowed maximum, not the device), and at an OOM (reserved + the device's free
memory then, when that is less than the device: other processes, NCCL, the CUDA context)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from nsysfrag.capacity import DEVICE, OOM, DeviceBytes, read_record, snapshot_capacity
from nsysfrag.events import ALLOC, FAILED_ALLOC, SEGMENT_ALLOC
from nsysfrag.inputs.torch_snapshot.facts import parse_facts
from nsysfrag.record.bootstrap.nsysfrag_recorder.names import FACTS_SCHEMA
from tests.record_helpers import fake_env, record

GiB, MiB = 1 << 30, 1 << 20


def _record(oom_free: int | None) -> object:
    """1 GiB reserved in one segment and used, then (optionally) an OOM with ``oom_free``
    free on the device."""
    actions = [SEGMENT_ALLOC, ALLOC] + ([FAILED_ALLOC] if oom_free is not None else [])
    sizes = [GiB, GiB] + ([GiB] if oom_free is not None else [])
    free = [-1, -1] + ([oom_free] if oom_free is not None else [])
    return read_record(np.array(actions, np.int8), np.array(sizes, np.int64),
                       np.array(free, np.int64), 0)  # fmt: skip


def test_a_memory_fraction_makes_the_allowed_maximum_the_capacity() -> None:
    c = snapshot_capacity(_record(None), device_bytes=DeviceBytes(2 * GiB, 0.25))  # type: ignore[arg-type]
    assert (c.bytes, c.source) == (2 * GiB, DEVICE)
    assert "set_per_process_memory_fraction(0.25)" in c.basis


def test_at_an_oom_what_was_reachable_wins_over_the_device() -> None:
    # 1 GiB reserved + 512 MiB free at the OOM on an 8 GiB device: 1.5 GiB was all it could get.
    c = snapshot_capacity(_record(512 * MiB), device_bytes=8 * GiB)  # type: ignore[arg-type]
    assert (c.bytes, c.source) == (GiB + 512 * MiB, OOM)
    assert "what this process could reach then, less than the device's total memory" in c.basis
    # Under a fraction the device's free memory can exceed what the allocator allows: the
    # allowed maximum stays.
    c = snapshot_capacity(_record(7 * GiB), device_bytes=DeviceBytes(2 * GiB, 0.25))  # type: ignore[arg-type]
    assert (c.bytes, c.source) == (2 * GiB, DEVICE)
    # --capacity still wins over both.
    assert snapshot_capacity(_record(512 * MiB), 3 * GiB, 8 * GiB).bytes == 3 * GiB  # type: ignore[arg-type]


def test_the_facts_give_the_fraction_or_the_observers_figure() -> None:
    device = {"index": 0, "total_memory_bytes": 8 * GiB}
    facts = {"schema": FACTS_SCHEMA, "reason": "exit", "devices": [{**device, "memory_fraction": 0.5}]}
    got = parse_facts(Path("x.device.json"), facts)
    assert got is not None and got.total_memory == {0: 4 * GiB}
    assert got.total_memory[0].fraction == 0.5  # type: ignore[attr-defined]
    # A torch without get_per_process_memory_fraction: the OOM observer was handed the maximum.
    facts = {"schema": FACTS_SCHEMA, "reason": "oom", "devices": [device],
             "oom": {"device": 0, "device_total_bytes": 2 * GiB, "device_free_bytes": 5 * GiB}}  # fmt: skip
    got = parse_facts(Path("x.device.json"), facts)
    assert got is not None and got.total_memory == {0: 2 * GiB}
    for fraction in (1.0, 0, -0.5, True, "0.5", float("nan")):
        plain = {"schema": FACTS_SCHEMA, "reason": "exit", "devices": [{**device, "memory_fraction": fraction}]}
        got = parse_facts(Path("x.device.json"), plain)
        assert got is not None and got.total_memory == {0: 8 * GiB}, fraction


def test_a_recorded_job_under_a_memory_fraction_is_rated_against_it(tmp_path: Path) -> None:
    program = (
        "import torch\n"
        "torch.cuda.set_per_process_memory_fraction(0.25)\n"
        "kept = []\n"
        "try:\n"
        "    while True:\n"
        "        kept.append(torch.empty(100 << 20, dtype=torch.uint8, device='cuda'))\n"
        "except torch.cuda.OutOfMemoryError:\n"
        "    print(len(kept))\n"
    )
    run = record(tmp_path / "rec", "--json", str(tmp_path / "job.json"), "--", sys.executable,
                 "-c", program, env=fake_env(FAKE_TORCH_DEVICE_MEMORY=str(4 * GiB)))  # fmt: skip
    assert run.code == 0, run.err
    assert int(run.out.split()[0]) * 100 * MiB <= GiB  # the fake's allocator kept to the fraction
    (space,) = json.loads((tmp_path / "job.json").read_text())["ranks"][0]["analysis"]["spaces"]
    assert (space["capacity_bytes"], space["capacity_source"]) == (GiB, "device")
    assert "set_per_process_memory_fraction(0.25)" in space["capacity_basis"]
    oom = json.loads((tmp_path / "rec" / "rank0" / "oom-1.device.json").read_text())["oom"]
    assert oom["device_total_bytes"] == GiB  # the observer's third figure is the allowed maximum

"""The sample exports: the driver model they are made with, their reproducibility, and what
sample_traces/README.md says each one shows."""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysfrag.cli import cli
from tests.conftest import REPO, SAMPLES

MiB, GiB = 1 << 20, 1 << 30
SAMPLE_NAMES = ("training_loop", "inference_serving", "churn_anomalies", "multi_gpu",
                "caching_allocator")  # fmt: skip


def _driver_pages() -> ModuleType:
    spec = importlib.util.spec_from_file_location("driver_pages", SAMPLES / "driver_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pages = _driver_pages()
PAGE = pages.PAGE


# ---------------------------------------------------------------- the driver model


def _span(nbytes: int) -> int:
    return -(-nbytes // PAGE) * PAGE if nbytes >= PAGE else -(-nbytes // 512) * 512


SIZES = st.one_of(
    st.sampled_from([1, 512, 513, 1 * MiB, 1 * MiB + 512 * 1024, PAGE - 1, PAGE, PAGE + 1]),
    st.integers(1, PAGE - 1),
    st.integers(PAGE, 9 * MiB),
)


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(st.tuples(st.booleans(), SIZES, st.integers(0, 10**6)), min_size=1, max_size=80),
    capacity_pages=st.integers(1, 12),
)
def test_the_driver_model_keeps_its_rules(
    ops: list[tuple[bool, int, int]], capacity_pages: int
) -> None:
    """Blocks never overlap; small ones stay inside one page at 512-byte steps, large ones
    start on a page; reserved is the pages blocks touch; a request fails exactly when it
    cannot be served; freeing everything gives every page back."""
    import random

    driver = pages.DriverPages(capacity_pages * PAGE, 0x7F00_0000_0000, random.Random(1))
    live: dict[int, int] = {}
    for free, nbytes, pick in ops:
        if free and live:
            address = sorted(live)[pick % len(live)]
            driver.free(address)
            del live[address]
            continue
        touched = {a // PAGE + k for a, n in live.items() for k in range(-(-_span(n) // PAGE))}
        free_pages = capacity_pages - len(touched)
        gaps = _small_gaps(live)
        try:
            address = driver.malloc(nbytes)
        except pages.OutOfMemory:
            if nbytes >= PAGE:
                assert _span(nbytes) // PAGE > free_pages
            else:
                assert free_pages == 0 and max(gaps, default=0) < _span(nbytes)
            continue
        if nbytes >= PAGE:
            assert address % PAGE == 0 and _span(nbytes) // PAGE <= free_pages
        else:
            assert address % 512 == 0 and address // PAGE == (address + _span(nbytes) - 1) // PAGE
            assert free_pages > 0 or max(gaps, default=0) >= _span(nbytes)
        live[address] = nbytes
        spans = sorted((a, a + _span(n)) for a, n in live.items())
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
        touched = {a // PAGE + k for a, n in live.items() for k in range(-(-_span(n) // PAGE))}
        assert driver.reserved_bytes == len(touched) * PAGE
    for address in list(live):
        driver.free(address)
    assert driver.reserved_bytes == 0


def _small_gaps(live: dict[int, int]) -> list[int]:
    """The free runs inside the pages that small blocks occupy."""
    by_page: dict[int, list[tuple[int, int]]] = {}
    for a, n in live.items():
        if n < PAGE:
            by_page.setdefault(a // PAGE, []).append((a, a + _span(n)))
    gaps = []
    for page, spans in by_page.items():
        cursor = page * PAGE
        for start, end in sorted(spans):
            gaps.append(start - cursor)
            cursor = end
        gaps.append((page + 1) * PAGE - cursor)
    return gaps


def test_small_blocks_go_to_the_tightest_gap() -> None:
    """As in a GH200 export: a 407 B block went to the partly used chunk with the least room."""
    import random

    driver = pages.DriverPages(64 * PAGE, 0x7F00_0000_0000, random.Random(1))
    roomy = driver.malloc(1 * MiB)  # one chunk with 1 MiB free
    tight = driver.malloc(PAGE - 512 * 1024)  # another with 512 KiB free
    assert roomy // PAGE != tight // PAGE
    assert driver.malloc(407) // PAGE == tight // PAGE


# ---------------------------------------------------------------- the files


def test_the_samples_regenerate_byte_for_byte(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(SAMPLES / "make_samples.py"), "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for name in SAMPLE_NAMES:
        made = (tmp_path / f"{name}.sqlite").read_bytes()
        assert made == (SAMPLES / f"{name}.sqlite").read_bytes(), f"{name}: regenerate it"
        assert len(made) < 620_000  # small enough to commit and to demo


@cache
def _analysis(name: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["analyze", str(SAMPLES / f"{name}.sqlite"), "--json", "-"])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def _failed_calls(name: str) -> int:
    con = sqlite3.connect(SAMPLES / f"{name}.sqlite")
    try:
        return int(con.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE returnValue != 0"
        ).fetchone()[0])  # fmt: skip
    finally:
        con.close()


def test_inference_serving_strands_pages_and_fails_while_they_are_stranded() -> None:
    (s,) = _analysis("inference_serving")["spaces"]
    assert s["health"] == "critical" and s["health_basis"]["metric"] == "local_frag"
    assert len(s["ooms"]) == s["counts"]["failed_allocations"] == _failed_calls("inference_serving")
    assert len(s["ooms"]) >= 15
    # Every failure happened with GiB stranded in partly used pages.
    assert min(o["stranded_bytes"] for o in s["ooms"]) > 0.5 * GiB
    assert s["final"]["stranded_bytes"] > 1.5 * GiB
    assert not s["caching_allocator_suspected"]
    assert s["hotspots"][0]["hole_bytes"] > 1 * GiB


def test_the_training_samples_strand_little_and_name_their_pinning_sites() -> None:
    for name in ("training_loop", "multi_gpu"):
        for s in _analysis(name)["spaces"]:
            assert s["health"] == "ok"
            assert s["max"]["global_frag"] < 0.01
            if s["hotspots"]:
                assert s["hotspots"][0]["pinned_by"], s["hotspots"][0]
    (training,) = _analysis("training_loop")["spaces"]
    assert any(
        p.startswith("train_step/backward/") for h in training["hotspots"] for p in h["pinned_by"]
    )


def test_churn_anomalies_counts_every_anomaly_it_was_built_with() -> None:
    (s,) = _analysis("churn_anomalies")["spaces"]
    built = {"unmatched_frees": 5, "overlaps": 3, "zero_size_allocs": 4,
             "failed_allocations": 5, "other_kind_events": 58}  # fmt: skip
    assert {k: s["counts"][k] for k in built} == built
    # The cudaMallocAsync pool's trim-able memory is releasable.
    assert s["memory_peak"]["releasable_bytes"] > 0


def test_caching_allocator_is_seen_as_one() -> None:
    (s,) = _analysis("caching_allocator")["spaces"]
    assert s["caching_allocator_suspected"] and s["final"]["stranded_bytes"] == 0
    for name in ("training_loop", "inference_serving", "churn_anomalies"):
        assert not any(x["caching_allocator_suspected"] for x in _analysis(name)["spaces"])


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_no_sample_rates_a_ratio_above_one(name: str) -> None:
    for s in _analysis(name)["spaces"]:
        assert 0 <= s["max"]["global_frag"] <= 1 and 0 <= s["max"]["local_frag"] <= 1

"""The observed model held to what the CUDA driver itself said.

``sample_traces/make_driver_traces.py`` runs raw cudaMalloc/cudaFree on a GPU and writes each
run as an nsys-schema export beside a truth file: cudaMemGetInfo at chosen moments, each tagged
with the memory event after which it was read, and the big requests with their outcome. The
model must agree with the driver on both:

* **device free**. The model's device free after event ``i`` is ``C - reserved(i)`` (``C`` the
  card's total). cudaMemGetInfo also leaves out what the driver held before the first allocation
  (the context; ``overhead``, read then), so it must say ``C - overhead - reserved(i)``, within
  ``TOLERANCE``: room for what the driver may map for its own bookkeeping as blocks come and go
  (page tables), which the trace cannot show.
* **big requests**. A request succeeds exactly when its pages fit in the largest usable request
  at that moment (``L_eff``, the model's ``largest_free_bytes``) less the same overhead: the
  capacity nsys reports includes memory the context holds, which no request can have.

Every truth file in sample_traces/ is checked (none is committed until the script has run on a
GPU). Until then the pipeline itself is proven here: the script runs against a simulated driver
(``tests/fake_cupy``, the page behaviour the samples are made with, plus a context overhead) and
its output must pass the same checks; and against simulated drivers unlike the model (physical
pages of 64 KiB under small blocks; a driver that keeps freed pages), where the checks must fail.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nsysfrag.inputs.nsys import read_export
from tests.conftest import REPO, SAMPLES

MiB = 1 << 20
PAGE = 2 * MiB
TOLERANCE = 16 * MiB
SCRIPT = SAMPLES / "make_driver_traces.py"
FAKE_CUPY = Path(__file__).resolve().parent / "fake_cupy"
RECORDED = sorted(SAMPLES.glob("driver_*_truth.json"))


def _model(export: Path) -> tuple[int, np.ndarray, np.ndarray]:
    """The card's capacity, and after every memory event the model's reserved bytes and its
    largest usable request (L_eff)."""
    (space,) = read_export(export).spaces
    assert space.capacity_bytes is not None
    series = space.model.run(space).series
    assert series.pool is not None
    return space.capacity_bytes, series.pool.reserved_bytes, series.largest_free_bytes


def mismatches(truth_path: Path) -> list[str]:
    """Where the model and the driver disagree on one truth file (empty: they agree)."""
    truth: dict[str, Any] = json.loads(truth_path.read_text())
    capacity, reserved, usable = _model(truth_path.parent / truth["export"])
    if capacity != truth["device"]["total_bytes"]:
        return [f"capacity {capacity} B, but the device's total is {truth['device']['total_bytes']} B"]
    if len(reserved) != truth["memory_events"]:
        return [f"{len(reserved)} points replayed of {truth['memory_events']} memory events"]
    overhead = truth["overhead_bytes"]
    wrong = []
    for r in truth["readings"]:
        i = r["after_event"]
        model_free = capacity - (int(reserved[i]) if i >= 0 else 0) - overhead
        if abs(model_free - r["free_bytes"]) > TOLERANCE:
            wrong.append(
                f"{r['label']} (after event {i}): cudaMemGetInfo free {r['free_bytes']:,} B,"
                f" the model {model_free:,} B"
            )
    for q in truth["requests"]:
        i = q["after_event"]
        largest = (int(usable[i]) if i >= 0 else capacity) - overhead
        predicted = -(-q["bytes"] // PAGE) * PAGE <= largest
        if predicted != q["succeeded"]:
            wrong.append(
                f"{q['label']} ({q['bytes']:,} B): {'succeeded' if q['succeeded'] else 'failed'},"
                f" the model predicted {'success' if predicted else 'failure'}"
                f" (largest usable {largest:,} B)"
            )
    return wrong


@pytest.mark.parametrize("truth", RECORDED, ids=[p.stem for p in RECORDED])
def test_the_model_agrees_with_the_recorded_driver(truth: Path) -> None:
    wrong = mismatches(truth)
    assert not wrong, f"{len(wrong)} disagreements; first: " + "; ".join(wrong[:3])


# ---------------------------------------------------------------- the pipeline, simulated


def _record(out: Path, *runs: str, **knobs: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(FAKE_CUPY), str(REPO)]),
        **{f"FAKE_CUPY_{k.upper()}": v for k, v in knobs.items()},
    }
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), *(f"--run={r}" for r in runs)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("driver_truth")
    done = _record(out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.mark.parametrize("run", ["sizes", "checkerboard", "subpage"])
def test_the_script_s_output_passes_the_checks_on_a_simulated_driver(
    simulated: Path, run: str
) -> None:
    truth_path = simulated / f"driver_{run}_truth.json"
    truth = json.loads(truth_path.read_text())
    assert truth["schema"] == "nsysfrag-driver-truth/1" and truth["run"] == run
    assert truth["readings"][0]["after_event"] == -1  # the overhead is read before anything
    assert not mismatches(truth_path)


def test_the_exports_are_what_nsys_would_write(simulated: Path) -> None:
    for truth_path in sorted(simulated.glob("driver_*_truth.json")):
        truth = json.loads(truth_path.read_text())
        con = sqlite3.connect(simulated / truth["export"])
        try:
            (total,) = con.execute("SELECT totalMemory FROM TARGET_INFO_GPU").fetchone()
            assert total == truth["device"]["total_bytes"]
            # Every memory row lies inside the call that made it, matched by correlation id.
            outside = con.execute(
                "SELECT count(*) FROM CUDA_GPU_MEMORY_USAGE_EVENTS m LEFT JOIN"
                " CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId"
                " WHERE r.start IS NULL OR m.start < r.start OR m.start > r.end"
            ).fetchone()[0]
            assert outside == 0
            # A failed call is an API row with returnValue 2 and no memory row.
            failed = con.execute(
                "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE returnValue = 2 AND"
                " NOT EXISTS (SELECT 1 FROM CUDA_GPU_MEMORY_USAGE_EVENTS m"
                " WHERE m.correlationId = r.correlationId)"
            ).fetchone()[0]
            (memory_rows,) = con.execute(
                "SELECT count(*) FROM CUDA_GPU_MEMORY_USAGE_EVENTS"
            ).fetchone()
        finally:
            con.close()
        assert failed >= sum(not q["succeeded"] for q in truth["requests"])
        assert memory_rows == truth["memory_events"]


def test_the_runs_ask_what_they_should(simulated: Path) -> None:
    """On the simulated driver (the model's own physics) the outcomes are known: a freed 2 MiB
    block gives its page back, a half-used page gives nothing back."""
    board = json.loads((simulated / "driver_checkerboard_truth.json").read_text())
    sub = json.loads((simulated / "driver_subpage_truth.json").read_text())
    assert [q["succeeded"] for q in board["requests"]] == [True]
    assert [q["succeeded"] for q in sub["requests"]] == [False, False]
    sizes = {c["bytes"]: c for c in json.loads(
        (simulated / "driver_sizes_truth.json").read_text())["sizes"]}  # fmt: skip
    assert sizes[1]["address_steps"][0][0] == 512  # packed
    assert sizes[2 * MiB + 1]["device_bytes_per_allocation"] == 2 * PAGE
    assert all(c["free_after_freeing"] == c["free_before"] for c in sizes.values())


@pytest.mark.parametrize(
    ("run", "knobs"),
    [
        ("subpage", {"physical_page": str(64 << 10)}),  # small blocks on 64 KiB pages
        ("checkerboard", {"keep_freed": "1"}),  # freed pages never given back
    ],
    ids=["64KiB-physical-pages", "keeps-freed-pages"],
)
def test_the_checks_catch_a_driver_unlike_the_model(
    tmp_path: Path, run: str, knobs: dict[str, str]
) -> None:
    done = _record(tmp_path, run, **knobs)
    assert done.returncode == 0, done.stdout + done.stderr
    wrong = mismatches(tmp_path / f"driver_{run}_truth.json")
    assert any("cudaMemGetInfo" in w for w in wrong), wrong
    if run == "subpage":
        # Half of every chunk's small pages came back, so the requests the model refuses fit.
        assert any("predicted failure" in w for w in wrong), wrong

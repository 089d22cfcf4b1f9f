"""Small inputs run the kernels interpreted (nsysfrag.interpreted): a first run compiles
nothing and reports what the compiled kernels report, byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nsysfrag import interpreted
from nsysfrag.models.observed import kernel as replay
from tests.conftest import REPO, SAMPLES


def _run(argv: list[str], cache: Path, kernels: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(REPO)}
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop("NSYSFRAG_KERNELS", None)
    if kernels is not None:
        env["NSYSFRAG_KERNELS"] = kernels
    return subprocess.run(
        [sys.executable, "-m", "nsysfrag", *argv], env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze", str(SAMPLES / "inference_serving.sqlite"), "--json", "-"],
        ["analyze", str(SAMPLES / "torch_fragmentation_snapshot.pickle"), "--json", "-"],
    ],
    ids=["analyze-trace", "analyze-snapshot"],
)
def test_a_first_run_on_a_sample_compiles_nothing_and_reports_the_same(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, argv: list[str]
) -> None:
    first = _run(argv, tmp_path / "empty", None)
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""  # no "compiling ..." notice: nothing compiled
    assert not list((tmp_path / "empty").rglob("*.nbi"))  # and nothing was cached
    # The three share a cache of compiled kernels (the snapshots' reader compiles once).
    compiled = _run(argv, tmp_path_factory.getbasetemp() / "compiled-kernels", "compiled")
    assert compiled.returncode == 0, compiled.stderr
    assert first.stdout == compiled.stdout


def test_whatif_compiles_its_models_and_reports_what_the_interpreted_ones_do(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """whatif compiles whatever the size (interpreted, its replays would cost ~10 s on every
    run of a sample): its allocator models land in the cache, and the figures are those of
    the interpreted twins."""
    argv = ["whatif", str(SAMPLES / "torch_capacity_snapshot.pickle"), "--json", "-"]
    cache = tmp_path_factory.getbasetemp() / "compiled-kernels"
    auto = _run(argv, cache, None)
    assert auto.returncode == 0, auto.stderr
    assert [p for p in cache.rglob("*.nbi") if "_heap_kernel" in p.name]
    interpreted_run = _run(argv, tmp_path / "empty", "interpreted")
    assert interpreted_run.returncode == 0, interpreted_run.stderr
    assert interpreted_run.stdout == auto.stdout


def test_the_size_decides_unless_the_environment_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSYSFRAG_KERNELS", raising=False)
    # A whatif run in this process (the CLI tests) made auto compile: not what this test asks.
    monkeypatch.setattr(interpreted, "_compile_in_auto", False)
    assert interpreted.interpret(interpreted.INTERPRET_UP_TO)
    assert not interpreted.interpret(interpreted.INTERPRET_UP_TO + 1)
    monkeypatch.setenv("NSYSFRAG_KERNELS", "interpreted")
    assert interpreted.interpret(10**9)
    monkeypatch.setenv("NSYSFRAG_KERNELS", "compiled")
    assert not interpreted.interpret(0)
    assert interpreted.chosen(replay._replay_kernel, 0) is replay._replay_kernel


def test_a_kernel_compiled_already_runs_compiled_whatever_the_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NSYSFRAG_KERNELS", "compiled")
    replay.warm_up()  # the session compiled it, or loads it from the cache now
    monkeypatch.delenv("NSYSFRAG_KERNELS")
    assert interpreted.chosen(replay._replay_kernel, 0) is replay._replay_kernel


def test_a_twin_reads_and_writes_records_in_place_even_a_field_numpy_names() -> None:
    table = np.zeros(3, dtype=np.dtype([("flags", np.int64), ("size", np.int64)]))
    table["size"] = [5, 6, 7]
    view = interpreted.records(table)
    row = view[1]
    row.flags = row.size + 1  # np.recarray would read its own .flags and .size here
    view[2] = view[1]
    assert table.tolist() == [(0, 5), (7, 6), (7, 6)]
    assert interpreted.records((table, 1))[0] is not table  # inside a tuple too

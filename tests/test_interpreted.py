"""Small inputs run the kernels interpreted (nsysfrag.interpreted): a first run compiles
nothing and reports what the compiled kernels report, byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from nsysfrag import background_compile, interpreted
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


def test_whatif_on_a_sample_compiles_nothing_and_reports_what_the_compiled_models_do(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With nothing cached, whatif on a sample runs its allocator models interpreted (~7 s on
    the training sample at load 2, against 60-120 s of compiling first): nothing compiled, the
    figures those of the compiled models."""
    argv = ["whatif", str(SAMPLES / "torch_capacity_snapshot.pickle"), "--json", "-"]
    auto = _run(argv, tmp_path / "empty", None)
    assert auto.returncode == 0, auto.stderr
    assert auto.stderr == ""
    assert not list((tmp_path / "empty").rglob("*.nbi"))
    compiled = _run(argv, tmp_path_factory.getbasetemp() / "compiled-kernels", "compiled")
    assert compiled.returncode == 0, compiled.stderr
    assert [p for p in (tmp_path_factory.getbasetemp() / "compiled-kernels").rglob("*.nbi")
            if "_heap_kernel" in p.name]  # fmt: skip
    assert compiled.stdout == auto.stdout


def test_the_size_decides_unless_the_environment_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSYSFRAG_KERNELS", raising=False)
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


def test_a_cached_kernel_is_interpreted_while_the_runs_twins_stay_within_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before numba is imported, a cached kernel's twin runs while the twins' estimated cost
    adds up to no more than the budget; the call past it runs compiled, and so does every
    call after it, however small (here numba's import is feigned: the session has it)."""
    monkeypatch.delenv("NSYSFRAG_KERNELS", raising=False)
    monkeypatch.setattr(interpreted, "_compiled", lambda kernel: True)  # cached
    monkeypatch.setattr(interpreted, "_spent_us", 0.0)
    imported = False
    monkeypatch.setattr(interpreted, "numba_loaded", lambda: imported)
    kernel = replay._replay_kernel
    per_item = interpreted.twin_cost_us(1, kernel)
    assert per_item == interpreted.TWIN_US_PER_ITEM[f"{kernel.__module__}._replay_kernel"]
    third = int(interpreted.TINY_BUDGET_US / per_item / 3)
    assert interpreted.interpret(third, kernel) and interpreted.interpret(third, kernel)
    assert interpreted.interpret(third, kernel)  # three thirds: the budget, not past it
    assert not interpreted.interpret(third, kernel)
    imported = True  # the call past the budget loaded numba: from now on cached is compiled
    assert not interpreted.interpret(1, kernel)
    # A kernel not measured costs as the costliest; sizes past INTERPRET_UP_TO never interpret.
    monkeypatch.setattr(interpreted, "_spent_us", 0.0)
    imported = False
    assert interpreted.twin_cost_us(2, print) == 2 * max(interpreted.TWIN_US_PER_ITEM.values())
    assert not interpreted.interpret(interpreted.INTERPRET_UP_TO + 1, kernel)
    assert interpreted._spent_us == 0.0


def test_every_kernel_costed_is_a_kernel_of_the_package() -> None:
    """TWIN_US_PER_ITEM names kernels by module and name: a renamed kernel would silently cost
    as the costliest."""
    import importlib

    from nsysfrag import jit

    for name in interpreted.TWIN_US_PER_ITEM:
        module, _, attribute = name.rpartition(".")
        assert jit.is_kernel(getattr(importlib.import_module(module), attribute)), name


def test_a_twin_reads_and_writes_records_in_place_even_a_field_numpy_names() -> None:
    table = np.zeros(3, dtype=np.dtype([("flags", np.int64), ("size", np.int64)]))
    table["size"] = [5, 6, 7]
    view = interpreted.records(table)
    row = view[1]
    row.flags = row.size + 1  # np.recarray would read its own .flags and .size here
    view[2] = view[1]
    assert table.tolist() == [(0, 5), (7, 6), (7, 6)]
    assert interpreted.records((table, 1))[0] is not table  # inside a tuple too


def test_a_cached_kernel_runs_compiled_for_a_small_input_in_a_fresh_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Once in the cache (the runs above compiled the replay kernel into this one), a small
    input runs the compiled kernel, loaded rather than interpreted, and nothing is noted; a
    tiny one (a few events: less twin work than importing numba) runs the twin without
    importing numba, and is not noted either (its kernel is cached)."""
    cache = tmp_path_factory.getbasetemp() / "compiled-kernels"
    warmed = _run(["analyze", str(SAMPLES / "inference_serving.sqlite"), "-q"], cache, "compiled")
    assert warmed.returncode == 0, warmed.stderr
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from nsysfrag import interpreted\n"
        "from nsysfrag.models.observed import kernel as k\n"
        "assert interpreted.chosen(k._replay_kernel, 10) is not k._replay_kernel\n"
        "assert 'numba' not in sys.modules\n"
        "small = interpreted.INTERPRET_UP_TO\n"
        "assert interpreted.twin_cost_us(small, k._replay_kernel) > interpreted.TINY_BUDGET_US\n"
        "assert not k._replay_kernel.overloads\n"  # not compiled in this process
        "assert interpreted.chosen(k._replay_kernel, small) is k._replay_kernel\n"
        "assert interpreted.chosen(k._replay_kernel, 10) is k._replay_kernel\n"  # numba is in
        "print(interpreted.uncached())\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(REPO)}
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop("NSYSFRAG_KERNELS", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _listing_run(cache: Path, way: str = "list") -> subprocess.CompletedProcess[str]:
    """A run in auto mode with the background compiler on, listing instead of compiling (or
    compiling: ``way="on"``)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(REPO)}
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop("NSYSFRAG_KERNELS", None)
    env.pop("CI", None)
    env[background_compile.ENVIRONMENT] = way
    argv = ["analyze", str(SAMPLES / "torch_fragmentation_snapshot.pickle"), "--json", "-"]
    return subprocess.run([sys.executable, "-m", "nsysfrag", *argv], env=env,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip


def _wait_for(path: Path, seconds: float = 120) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        # The compiler writes the log under its lock: written and unlocked is finished.
        if path.exists() and not background_compile.running(path.parent):
            assert not list(path.parent.glob("pending-compile-*"))
            return path.read_text()
        time.sleep(0.2)
    raise AssertionError(f"{path} was not written within {seconds} s")


def test_a_run_without_cached_kernels_starts_one_compiler_after_it(tmp_path: Path) -> None:
    root = tmp_path / "nsysfrag"
    first = _listing_run(tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""  # the user is told nothing and waits for nothing
    listed = _wait_for(root / background_compile.LOG).splitlines()
    # The kernels this run interpreted, each once: the snapshot's scan and the segments replay.
    assert "nsysfrag.inputs.torch_snapshot.pickle_scan._scan" in listed
    assert "nsysfrag.models.segments.kernel.replay_forward" in listed
    assert len(listed) == len(set(listed))
    assert not list(tmp_path.rglob("*.nbi"))  # listing compiles nothing


def test_the_background_compile_caches_what_the_next_run_loads(tmp_path: Path) -> None:
    """The one test that waits for numba (about 15 s at load 2): the compiler compiles the
    kernels for the argument types the run noted, so the next run runs them all compiled,
    compiling nothing while the user waits, noting nothing, with the same figures."""
    root = tmp_path / "nsysfrag"
    first = _listing_run(tmp_path, "on")
    assert first.returncode == 0, first.stderr
    compiled = _wait_for(root / background_compile.LOG, 600).splitlines()
    assert "nsysfrag.models.segments.kernel.replay_forward" in compiled
    assert [p for p in root.rglob("*.nbi") if "replay_forward" in p.name]
    with background_compile._lock(root) as held:  # what the run interprets stays pending
        assert held
        later = _listing_run(tmp_path)
    assert later.returncode == 0, later.stderr
    assert later.stderr == ""
    assert later.stdout == first.stdout
    assert not list(root.glob("pending-compile-*"))  # it interpreted nothing


def test_a_run_while_a_compiler_works_leaves_its_request_to_that_one(tmp_path: Path) -> None:
    root = tmp_path / "nsysfrag"
    root.mkdir()
    with background_compile._lock(root) as held:  # this test is the compiler at work
        assert held
        run = _listing_run(tmp_path)
        assert run.returncode == 0, run.stderr
        time.sleep(1)  # a second compiler, had one started, would have listed by now
        assert not (root / background_compile.LOG).exists()
        assert len(list(root.glob("pending-compile-*"))) == 1
        assert background_compile.compile_pending(root) == 0  # one compiler at a time
    environ = {background_compile.ENVIRONMENT: "list"}
    assert background_compile.compile_pending(root, environ) >= 2  # the working one takes it
    assert not list(root.glob("pending-compile-*"))
    assert "replay_forward" in (root / background_compile.LOG).read_text()


@pytest.mark.parametrize(
    "environ",
    [{"NSYSFRAG_KERNELS": "compiled"}, {"NSYSFRAG_KERNELS": "interpreted"}, {"CI": "true"},
     {background_compile.ENVIRONMENT: "off"}],
    ids=["forced-compiled", "forced-interpreted", "ci", "off"],
)  # fmt: skip
def test_no_compiler_starts_when_forced_in_ci_or_off(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setitem(interpreted._uncached, ("nsysfrag.x", "y", ()), None)
    assert not background_compile.start(environ)
    assert not list(tmp_path.rglob("pending-compile-*"))

"""A run that interprets its kernels never imports numba (nsysfrag.jit); one that finds them
cached imports it and runs them compiled, loaded from the cache, unless its input is tiny."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

import nsysfrag.allocators  # noqa: F401  (their kernels, defined lazily at import)
import nsysfrag.models.segments  # noqa: F401
from nsysfrag import interpreted, jit
from nsysfrag.models.observed import kernel as observed
from tests.conftest import REPO, SAMPLES

# The command line in a process of its own, then what it left loaded: whether numba was
# imported, which of the named kernels have compiled code, and what the run noted uncached.
_PROBE = """
import json, sys
from nsysfrag import cli, interpreted
try:
    cli.main(sys.argv[2:])
except SystemExit as done:
    code = done.code
kernels = {}
if "numba" in sys.modules:
    import importlib
    for name in sys.argv[1].split(","):
        module, _, attribute = name.rpartition(".")
        kernels[name] = bool(getattr(importlib.import_module(module), attribute).overloads)
print(json.dumps({"code": code, "numba": "numba" in sys.modules, "compiled": kernels,
                  "uncached": [f"{m}.{n}" for m, n, _ in interpreted.uncached()]}))
"""

REPLAY = "nsysfrag.models.observed.kernel._replay_kernel"
SEGMENTS = "nsysfrag.models.segments.kernel.replay_forward"


def _probe(argv: list[str], cache: Path, kernels: str | None, watch: str = REPLAY) -> dict:
    import json

    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(REPO),
           "NSYSFRAG_BACKGROUND_COMPILE": "off"}  # fmt: skip
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop("NSYSFRAG_KERNELS", None)
    if kernels is not None:
        env["NSYSFRAG_KERNELS"] = kernels
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, watch, *argv], env=env, capture_output=True, text=True,
        timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr
    assert result["code"] == 0, done.stderr
    return result


TRACE = ["analyze", str(SAMPLES / "inference_serving.sqlite"), "--json", os.devnull]
SNAPSHOT = ["analyze", str(SAMPLES / "torch_fragmentation_snapshot.pickle"), "--json", os.devnull]
# A genuine export of 19 memory events (absent where the shared inputs are not beside the repo).
TINY_TRACE = ["analyze", str(REPO.parent / "shared" / "real_memory_traces" / (
    "ntua-el20062+gemm_spmm_a100__gemm_pipeline_inference_like__nsys_reports"
    "__nsys_report_db_10000_10_100.sqlite")), "--json", os.devnull]  # fmt: skip


@pytest.mark.parametrize("argv", [TRACE, SNAPSHOT], ids=["trace", "snapshot"])
@pytest.mark.parametrize("kernels", [None, "interpreted"], ids=["auto", "forced"])
def test_an_interpreted_analyze_never_imports_numba(
    tmp_path: Path, argv: list[str], kernels: str | None
) -> None:
    run = _probe(argv, tmp_path, kernels)
    assert not run["numba"], "numba was imported by a run that interpreted its kernels"
    if kernels is None:  # noted for the background compiler all the same, without numba
        assert REPLAY in run["uncached"] or SEGMENTS in run["uncached"]


LARGE_SNAPSHOT = ["analyze", str(SAMPLES / "training_snapshot.pickle"), "--json", os.devnull]


def test_a_run_that_finds_its_kernels_cached_runs_them_compiled(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The sample snapshot (9,000 items of pickle, 8,000 events: more twin work than numba's
    import), once the kernels are cached (the compiled run fills the cache the other test
    modules share): numba is imported, the kernel runs compiled, loaded (no compile notice),
    and nothing is noted for a compiler."""
    cache = tmp_path_factory.getbasetemp() / "compiled-kernels"
    filled = _probe(LARGE_SNAPSHOT, cache, "compiled", SEGMENTS)
    assert filled["compiled"] == {SEGMENTS: True}
    warm = _probe(LARGE_SNAPSHOT, cache, None, SEGMENTS)
    assert warm["numba"] and warm["compiled"] == {SEGMENTS: True}
    assert warm["uncached"] == []
    assert "compiling" not in warm["stderr"]


@pytest.mark.parametrize(
    ("argv", "kernel"), [(TINY_TRACE, REPLAY), (SNAPSHOT, SEGMENTS)], ids=["trace", "snapshot"]
)
def test_a_tiny_input_runs_its_cached_kernels_interpreted_without_numba(
    tmp_path_factory: pytest.TempPathFactory, argv: list[str], kernel: str
) -> None:
    """A tiny input (a real export's 19 memory events, a snapshot of a few dozen), its kernels
    cached: their twins are done before numba would be imported, so it is not, and nothing is
    noted for a compiler (the cache has them)."""
    if not Path(argv[1]).exists():
        pytest.skip(f"{argv[1]} is not beside the repository")
    cache = tmp_path_factory.getbasetemp() / "compiled-kernels"
    filled = _probe(argv, cache, "compiled", kernel)
    assert filled["compiled"] == {kernel: True}
    warm = _probe(argv, cache, None, kernel)
    assert not warm["numba"], "numba was imported for a tiny input"
    assert warm["uncached"] == []
    assert warm["stderr"] == ""


def test_maybe_cached_names_the_file_numba_reads(tmp_path_factory: pytest.TempPathFactory) -> None:
    """jit.maybe_cached looks where numba's own cache looks, for every kernel of the package."""
    lazy = [k for k in jit._kernels if k.options.get("cache")]
    assert len(lazy) > 20
    jit.make_all()
    for k in lazy:
        index = Path(k.dispatcher._cache._cache_file._index_path)
        assert jit.maybe_cached(k) == index.is_file(), k
    observed.warm_up()  # compiled or loaded: its index is there now
    assert jit.maybe_cached(next(k for k in lazy if k.dispatcher is observed._replay_kernel))


Pair = namedtuple("Pair", ["a", "b"])


@pytest.mark.parametrize(
    "value",
    [
        np.arange(6, dtype=np.int64),
        np.arange(6, dtype=np.int32).reshape(2, 3),
        np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
        np.arange(12, dtype=np.int8)[::3],
        np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],
        np.zeros(0, dtype=np.bool_),
        np.zeros(3, dtype=np.dtype([("flags", np.int64), ("size", np.uint32)])),
        np.frombuffer(b"abcdef", dtype=np.uint8),  # read-only
        (np.zeros(2), np.zeros((2, 2), dtype=np.int64)),
        Pair(np.zeros(2, dtype=np.int64), 7),
        5,
        2**63,
        -1.5,
        True,
        np.int32(3),
    ],
)
def test_a_stand_in_types_as_its_argument(value: object) -> None:
    from numba import typeof

    assert typeof(interpreted.stand_in(value)) == typeof(value)


def test_a_stand_in_keeps_its_type_through_the_pending_file(tmp_path: Path) -> None:
    """numpy's pickling stores an array's items contiguous and brings it back writeable: a
    read-only or strided stand-in that came back that way would make the background compiler
    compile a signature the next run does not ask for (it then compiled again, in the foreground)."""
    from nsysfrag import background_compile

    read_only = np.frombuffer(b"abcdefgh", dtype=np.uint8)
    strided = np.zeros(9, dtype=np.int64)[::2]
    fortran = np.zeros((3, 2), dtype=np.float64, order="F")
    args = (interpreted.stand_in(read_only), (interpreted.stand_in(strided), 7), interpreted.stand_in(fortran))
    background_compile._write_pending(tmp_path, [("m", "k", args)])
    (written,) = tmp_path.glob("pending-compile-*.pickle")
    import pickle

    ((_, _, back),) = pickle.loads(written.read_bytes())
    flags = lambda a: (a.dtype, a.ndim, a.flags.writeable, a.flags.c_contiguous, a.flags.f_contiguous)  # noqa: E731
    assert flags(back[0]) == flags(read_only) == (np.dtype(np.uint8), 1, False, True, True)
    assert flags(back[1][0]) == flags(strided) and back[1][1] == 7
    assert flags(back[2]) == flags(fortran)

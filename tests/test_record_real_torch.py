"""``nsysfrag record`` against real torch's Python layer: the CPU build of torch with only its C
entry points that need a GPU replaced by the simulated allocator (tests/torch_layer/shim.py), so
that ``_lazy_init``, the ``_lazy_call`` queue and its lock, ``_record_memory_history``'s dispatch,
``memory_stats``'s flattening and ``_dump_snapshot``'s pickling are torch's own; and the
recorder's calls held to the signatures of every torch from 2.1 on (a table from their sources).
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nsysfrag.record.bootstrap.nsysfrag_recorder.options import Options
from nsysfrag.record.bootstrap.nsysfrag_recorder.recorder import Unsupported, check_torch, record_history
from nsysfrag.record.bootstrap.nsysfrag_recorder.sampler import Sampler
from nsysfrag.record.layout import rank_folders
from tests.record_helpers import REPO, WORKLOADS, record

torch = pytest.importorskip(
    "torch", reason="real torch is not installed here (pip install -e '.[test]' installs its CPU build)"
)
if "fake" in torch.__version__ or not hasattr(torch, "_C"):
    pytest.skip("the torch importable here is not PyTorch", allow_module_level=True)

LAYER = WORKLOADS / "real_layer.py"
GiB, MiB = 1 << 30, 1 << 20


def real_env(**extra: str) -> dict[str, str]:
    """Our environment, without the fake torch: ``import torch`` is PyTorch."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("NSYSFRAG_RECORD", "FAKE_TORCH"))}
    env.pop("PYTHONPATH", None)
    env["COLUMNS"] = "100"
    env.update(extra)
    return env


def test_an_mp_spawn_job_on_real_torch_gives_four_ranks_named_by_device(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    run = record(out, "--json", str(tmp_path / "job.json"), "--", sys.executable, str(LAYER),
                 "spawn", "4", env=real_env(FAKE_TORCH_GPUS="4"), timeout=300)  # fmt: skip
    assert run.code == 0, run.err
    assert [r.path.name for r in rank_folders(out)] == [f"rank{d}" for d in range(4)]
    doc = json.loads((tmp_path / "job.json").read_text())
    for entry in doc["ranks"]:
        analysis = entry["analysis"]
        assert analysis["recorded"]["named_by"] == "device"
        assert analysis["recorded"]["torch_version"] == torch.__version__
        (space,) = analysis["spaces"]
        assert space["device"] == entry["rank"]
        assert space["allocated_bytes_peak"] == (entry["rank"] + 1) * 8 * MiB
        assert space["capacity_source"] == "device"  # torch's get_device_properties, recorded


def test_a_memory_fraction_on_real_torch_is_the_capacity(tmp_path: Path) -> None:
    run = record(tmp_path / "rec", "--json", str(tmp_path / "job.json"), "--", sys.executable,
                 str(LAYER), "fraction", "0.25",
                 env=real_env(FAKE_TORCH_DEVICE_MEMORY=str(4 * GiB)), timeout=300)  # fmt: skip
    assert run.code == 0, run.err
    assert int(run.out.split()[0]) == 10  # 10 x 100 MiB fit in 1 GiB
    (space,) = json.loads((tmp_path / "job.json").read_text())["ranks"][0]["analysis"]["spaces"]
    assert (space["capacity_bytes"], space["capacity_source"]) == (GiB, "device")
    assert "set_per_process_memory_fraction(0.25)" in space["capacity_basis"]
    facts = json.loads((tmp_path / "rec" / "rank0" / "oom-1.device.json").read_text())
    assert facts["oom"]["device_total_bytes"] == GiB  # what torch handed the observer


def test_the_recorder_in_real_torch_asks_for_state_without_the_history(tmp_path: Path) -> None:
    """monitor() in the program: armed through torch's own _lazy_call, history on through its
    own dispatch, a state snapshot per step() without the traces (2.11's include_traces)."""
    program = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from tests.torch_layer import shim
        torch = shim.install()
        from nsysfrag.torch import monitor
        with monitor({str(tmp_path / "api")!r}, every=1) as m:
            torch.cuda.init()
            blocks = [shim.malloc(1 << 20) for _ in range(20)]
            ratings = m.step()
        calls = [(name, args) for name, args in shim.CALLS
                 if name in ("_cuda_record_memory_history", "_cuda_memorySnapshot")]
        print(repr(calls))
        print(len(ratings or []))
    """)
    done = subprocess.run([sys.executable, "-c", program], env=real_env(), capture_output=True,
                          text=True, timeout=300, check=False, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls_line, ratings = done.stdout.strip().splitlines()[-2:]
    calls = eval(calls_line)  # noqa: S307  (our own repr of tuples of plain values)
    assert calls[0] == ("_cuda_record_memory_history", ("all", "all", "python", 100_000, False, False, False, []))
    states = [args for name, args in calls if name == "_cuda_memorySnapshot"]
    assert (((0, 0, False),) in states)  # the state snapshot: no traces
    assert ((None,) in states)  # the final one (_dump_snapshot): everything
    assert int(ratings) == 1


def test_a_try_round_on_real_torch_keeps_expandable_segments(tmp_path: Path) -> None:
    """``record --try`` on real torch's layer: each run's PYTORCH_CUDA_ALLOC_CONF reaches the
    allocator, and the figures are the ones PyTorch's rules give for the growing workload."""
    steps = 12
    requests = [(100 + 10 * step) * MiB for step in range(steps)]
    run = record(tmp_path / "rec", "--try", "expandable_segments:True", "--json",
                 str(tmp_path / "try.json"), "--", sys.executable, str(LAYER), "grow", str(steps),
                 env=real_env(NSYSFRAG_KERNELS="interpreted"), timeout=300)  # fmt: skip
    assert run.code == 0, run.err
    doc = json.loads((tmp_path / "try.json").read_text())
    peaks = {r["setting"]: r["job"]["peak_reserved_bytes"] for r in doc["runs"]}
    assert peaks == {
        "baseline": sum(-(-r // (2 * MiB)) * 2 * MiB for r in requests),  # a segment per step
        "expandable_segments:True": -(-max(requests) // (20 * MiB)) * 20 * MiB,  # one range
    }
    assert doc["verdict"]["keep"] == "expandable_segments:True"


# What each torch's Python layer accepts: ``_record_memory_history``'s current form (its bool
# form dispatches to ``_record_memory_history_legacy`` from 2.1 on), ``memory_snapshot``, and
# whether ``_dump_snapshot`` exists. What the recorder passes (enabled, context, stacks,
# max_entries) is in every release from 2.1 (2.0.1 takes the trace_alloc_* form, 1.13.1 only
# enabled and device; neither has _dump_snapshot), and ``include_traces`` from 2.11 (2.13, as
# installed here, checked below). The parameters it never passes (clear_history,
# compile_context, global_record_annotations, skip_actions, mempool_id) are placed in the
# release that added them as best known, not read from each release: they only make the
# signatures wider.
_HISTORY = ("enabled", "context", "stacks", "max_entries", "device")
SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...], bool]] = {
    "1.13.1": (("enabled", "device"), (), False),
    "2.0.1": (("enabled", "record_context", "trace_alloc_max_entries", "trace_alloc_record_context",
               "device"), (), False),  # fmt: skip
    "2.1.0": (_HISTORY, (), True),
    "2.2.0": (_HISTORY, (), True),
    "2.3.0": (_HISTORY, (), True),
    "2.4.0": (_HISTORY + ("clear_history",), (), True),
    "2.5.0": (_HISTORY + ("clear_history",), ("mempool_id",), True),
    "2.6.0": (_HISTORY + ("clear_history",), ("mempool_id",), True),
    "2.7.0": (_HISTORY + ("clear_history", "compile_context"), ("mempool_id",), True),
    "2.8.0": (_HISTORY + ("clear_history", "compile_context", "global_record_annotations"),
              ("mempool_id",), True),  # fmt: skip
    "2.9.0": (_HISTORY + ("clear_history", "compile_context", "global_record_annotations"),
              ("mempool_id",), True),  # fmt: skip
    "2.10.0": (_HISTORY + ("clear_history", "compile_context", "global_record_annotations",
                           "skip_actions"), ("mempool_id",), True),  # fmt: skip
    "2.11.0": (_HISTORY + ("clear_history", "compile_context", "global_record_annotations",
                           "skip_actions"), ("mempool_id", "include_traces"), True),  # fmt: skip
}


def _function(name: str, params: tuple[str, ...], calls: list[tuple[str, dict[str, Any]]]) -> Any:
    """A function of exactly these parameters (each with a default) that logs its calls."""
    def log(**given: Any) -> Any:
        calls.append((name, given))
        return []

    signature = inspect.Signature(
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None) for p in params]
    )

    def function(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)  # TypeError, as Python raises it, if it does not fit
        return log(**bound.arguments)

    return function


def _torch_of(version: str, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    history, snapshot, dump = SIGNATURES[version]
    memory = SimpleNamespace(_record_memory_history=_function("history", history, calls))
    if dump:
        memory._dump_snapshot = _function("dump", ("filename",), calls)
    cuda = SimpleNamespace(memory=memory, memory_snapshot=_function("snapshot", snapshot, calls),
                           get_allocator_backend=lambda: "native")  # fmt: skip
    return SimpleNamespace(__version__=version, cuda=cuda)


@pytest.mark.parametrize("version", sorted(SIGNATURES))
def test_the_recorder_calls_fit_every_torch_signature(version: str) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    stub = _torch_of(version, calls)
    if not SIGNATURES[version][2]:
        with pytest.raises(Unsupported, match=rf"needs torch ≥ 2\.1 \(found {version}\)"):
            check_torch(stub)
        return
    check_torch(stub)
    assert record_history(stub, Options(entries=5000, stacks="all")) is None
    assert calls == [("history", {"enabled": "all", "context": "all", "stacks": "all", "max_entries": 5000})]
    sampler = Sampler(SimpleNamespace(options=Options(), torch=stub))  # type: ignore[arg-type]
    light = "include_traces" in SIGNATURES[version][1]
    for _ in range(2):  # the second call knows the answer: no second TypeError
        assert (sampler._light_segments() is not None) is light
    assert sampler.light is light
    snapshots = [given for name, given in calls if name == "snapshot"]
    assert snapshots == ([{"include_traces": False}] * 2 if light else [])


def test_the_installed_torch_takes_the_recorder_calls() -> None:
    """The torch pip installs here (2.13 at the time of writing) against the same calls."""
    memory = torch.cuda.memory
    inspect.signature(memory._record_memory_history).bind(
        enabled="all", context="all", stacks="python", max_entries=100_000
    )
    inspect.signature(memory.memory_snapshot).bind(include_traces=False)
    inspect.signature(memory._dump_snapshot).bind("x.pickle")
    assert set(SIGNATURES["2.11.0"][1]) <= set(inspect.signature(memory.memory_snapshot).parameters)

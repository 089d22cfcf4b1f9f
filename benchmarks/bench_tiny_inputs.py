"""What a twin costs per item against what importing numba costs: nsysfrag.interpreted's figures.

    python benchmarks/bench_tiny_inputs.py              # both parts
    python benchmarks/bench_tiny_inputs.py --twins      # only the twins' cost per item
    python benchmarks/bench_tiny_inputs.py --runs       # only the whole runs, paired

``--twins`` runs, in one process each, commands on the samples with every kernel interpreted
(``NSYSFRAG_KERNELS=interpreted``) and times each twin's calls against the size its call site
passes (events, rows, bytes / 64 of a pickle: each counts its own thing), and times, in fresh
processes, importing numba and loading a first cached kernel. It prints each kernel's
microseconds per item, the size at which its twin costs what numba's import does (the break-
even), and the figures nsysfrag.interpreted holds (``TWIN_US_PER_ITEM``, ``NUMBA_LOAD_US``)
beside them. The ratios hold on a loaded machine where the seconds do not: put both sides'
figures from one run into the module, never one side alone.

``--runs`` times whole processes, kernels cached (a warm-up run first), auto mode against
``NSYSFRAG_KERNELS=compiled``, alternating: a tiny input must not import numba and be sooner, a
larger one (the sample snapshot) must load its kernels as before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"
TINY_EXPORT = (
    REPO.parent / "shared" / "real_memory_traces"
    / "ntua-el20062+gemm_spmm_a100__gemm_pipeline_inference_like__nsys_reports__nsys_report_db_10000_10_100.sqlite"
)  # fmt: skip

# Inside the measured process: every twin chosen (or made for pickle_scan's own call) is
# timed, per kernel: calls, items, seconds.
_TWIN_PROBE = r"""
import json, os, sys, time
from nsysfrag import cli, interpreted
stats = {}
def timed(kernel, size, fn):
    py = getattr(kernel, "py_func", kernel)
    name = f"{py.__module__}.{py.__qualname__}"
    def run(*args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            s = stats.setdefault(name, [0, 0, 0.0])
            s[0] += 1; s[1] += size; s[2] += time.perf_counter() - t
    return run
chosen, twin = interpreted.chosen, interpreted.twin
interpreted.chosen = lambda kernel, size: timed(kernel, size, chosen(kernel, size))
pickle_items = int(os.environ.get("PICKLE_ITEMS", "0"))  # pickle_scan's size: its file's
interpreted.twin = lambda kernel: (
    timed(kernel, pickle_items, twin(kernel)) if kernel.__name__ == "_scan" else twin(kernel))
try:
    cli.main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(stats))
"""
_NUMBA_PROBE = r"""
import json, time
import nsysfrag.models.observed.kernel as k
from nsysfrag import jit
t = time.perf_counter()
jit.make_all()
k.warm_up()
print(json.dumps(time.perf_counter() - t))
"""
_WALL = (
    "import resource, subprocess, sys, time;"
    "t = time.perf_counter();"
    "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode;"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN);"
    "print(time.perf_counter() - t, u.ru_maxrss / 1024);"
    "sys.exit(rc)"
)


def _env(kernels: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NSYSFRAG_BACKGROUND_COMPILE": "off"}
    env.pop("NSYSFRAG_KERNELS", None)
    if kernels is not None:
        env["NSYSFRAG_KERNELS"] = kernels
    return env


def _python(code: str, args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=1800, check=True)  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


def twins() -> None:
    from nsysfrag import interpreted

    pickle = SAMPLES / "training_snapshot.pickle"
    commands = [
        ["analyze", str(SAMPLES / "inference_serving.sqlite")],
        ["analyze", str(pickle), "--html", os.devnull],
        ["whatif", str(pickle), "--validate"],
    ]
    per_item: dict[str, float] = {}
    load = os.getloadavg()[0]
    numba = _python(_NUMBA_PROBE, [], _env("compiled"))  # the cache filled, if it was not
    for argv in commands:
        env = {**_env("interpreted"), "PICKLE_ITEMS": str(pickle.stat().st_size // 64)}
        stats = json.loads(_python(_TWIN_PROBE, [*argv, "-q", "--json", os.devnull], env))
        for name, (_, items, seconds) in stats.items():
            if items:  # the largest cost per item a sample showed
                per_item[name] = max(per_item.get(name, 0.0), seconds / items * 1e6)
    numba_us = 1e6 * statistics.median(
        float(_python(_NUMBA_PROBE, [], _env(None))) for _ in range(3)
    )
    load = (load + os.getloadavg()[0]) / 2
    print(f"importing numba and loading a first cached kernel: {numba_us / 1e6:.2f} s"
          f" (nsysfrag.interpreted holds {interpreted.NUMBA_LOAD_US / 1e6:.2f} s); load {load:.1f}")
    print(f"{'kernel':58} {'us/item':>8} {'held':>6} {'break-even items':>17}")
    for name, us in sorted(per_item.items(), key=lambda kv: -kv[1]):
        held = interpreted.TWIN_US_PER_ITEM.get(name)
        print(f"{name:58} {us:8.1f} {held if held is not None else '-':>6} {numba_us / us:17,.0f}")
    print("a run's twins run in place of cached kernels up to"
          f" {interpreted.TINY_BUDGET_US / 1e6:.2f} s of estimated work in all (TINY_BUDGET_US)")


def runs(rounds: int) -> None:
    cases = [
        ("tiny export analyze", ["analyze", str(TINY_EXPORT)]),
        ("sample snapshot analyze", ["analyze", str(SAMPLES / "training_snapshot.pickle")]),
        ("sample trace analyze", ["analyze", str(SAMPLES / "inference_serving.sqlite")]),
        ("sample snapshot whatif", ["whatif", str(SAMPLES / "training_snapshot.pickle")]),
    ]
    print(f"{'case':26} {'auto s':>7} {'compiled s':>10} {'auto MiB':>9}"
          f" {'compiled MiB':>12}  load")
    for label, argv in cases:
        if not Path(argv[1]).exists():
            print(f"{label:26} (no {argv[1]})")
            continue
        command = [sys.executable, "-m", "nsysfrag", *argv, "-q", "--json", os.devnull]
        _python(_WALL, command, _env("compiled"))  # the kernels cached, the file read once
        timed: dict[str, list[tuple[float, float]]] = {"auto": [], "compiled": []}
        for _ in range(rounds):
            for way in timed:
                wall, rss = _python(_WALL, command, _env(None if way == "auto" else way)).split()
                timed[way].append((float(wall), float(rss)))
        med = {w: [statistics.median(r[i] for r in v) for i in range(2)] for w, v in timed.items()}
        print(f"{label:26} {med['auto'][0]:7.2f} {med['compiled'][0]:10.2f} {med['auto'][1]:9.0f}"
              f" {med['compiled'][1]:12.0f}  {os.getloadavg()[0]:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--twins", action="store_true")
    parser.add_argument("--runs", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    both = not (args.twins or args.runs)
    if args.twins or both:
        twins()
    if args.runs or both:
        runs(args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

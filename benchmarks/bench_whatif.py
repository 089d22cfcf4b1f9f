"""Benchmark `nsysfrag whatif`: a 1 M-request stream through every default policy (issue 7).

    python benchmarks/bench_whatif.py               # 1,000,000 requests (2,000,000 events)
    python benchmarks/bench_whatif.py --requests 200000
    python benchmarks/bench_whatif.py --snapshot-entries 200000   # whatif on a big snapshot too

A request stream shaped like a training loop (70 % small tensors under 1 MiB, the rest 1–64 MiB,
geometric lifetimes, two CUDA streams) is replayed through each default policy on an 80 GiB
device, and each replay is summarised into the SPEC figures, as `whatif` does. The compiled
kernels are warmed up first (numba caches them on disk, so only a first-ever run pays for
compiling); the figure is the warm total. The last line is machine-readable:
`target whatif_1M_requests_all_policies: <seconds> s vs 60 s: PASS|FAIL`.

With ``--snapshot-entries N`` it also times ``whatif`` end to end on a snapshot of N trace
entries from ``big_snapshot.py`` (read once into columns, request streams, the torch model's
validation, every policy), the best of ``--repeat`` runs.

``--first-run`` measures the first ``whatif`` after installing instead (issue 37, item 2):

    python benchmarks/bench_whatif.py --first-run

what one event costs each policy's interpreted twin (and its compiled kernel, warm), then, each
in a process of its own with a fresh, empty kernel cache and the background compiler off, the
first ``whatif -q --json`` of the sample snapshot, of the largest genuine snapshot beside the
repository (when present) and of a synthetic one of about 20,000 request events, and a second
run on the cache the first one left. The load average is printed beside the figures (a loaded
machine slows everything: compare figures of one run), and one line per target:
``target NAME: <seconds> s vs <limit> s: PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # big_snapshot.py

from nsysfrag.allocators import DEFAULT_POLICIES, parse_policy
from nsysfrag.allocators.base import ALLOC, FREE, RequestStream
from nsysfrag.whatif import summarize, whatif

GiB, MiB = 1 << 30, 1 << 20
LIMIT_S = 60.0
REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_traces" / "training_snapshot.pickle"
GENUINE = (REPO.parent / "shared" / "real_snapshots"
           / "Wedsonlin+assignment2-systems__results__medium_512_training_memory_snapshot.pickle")  # fmt: skip
# big_snapshot's training loop makes about 0.7 request events per trace entry (as the genuine
# one does: 22,332 entries, 15,625 events), so this many entries give some 20,000 events.
SYNTHETIC_ENTRIES = 28_600
FIRST_RUN_LIMITS_S = {"sample": 8.0, "genuine": 15.0, "synthetic": 15.0}


def training_like_stream(n_requests: int, seed: int = 7) -> RequestStream:
    rng = np.random.default_rng(seed)
    small = rng.integers(1, MiB, n_requests)
    large = rng.integers(MiB, 64 * MiB, n_requests)
    sizes = np.where(rng.random(n_requests) < 0.7, small, large).astype(np.int64)
    life = rng.geometric(1 / 50, n_requests)
    t_alloc = np.arange(n_requests, dtype=np.int64) * 2
    times = np.concatenate([t_alloc, t_alloc + 2 * life + 1])
    kind = np.concatenate([np.full(n_requests, ALLOC), np.full(n_requests, FREE)])
    request = np.concatenate([np.arange(n_requests), np.arange(n_requests)])
    order = np.argsort(times, kind="stable")
    return RequestStream.build(
        kind[order], request[order], times[order] * 1000, sizes, rng.integers(0, 2, n_requests)
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--capacity-gib", type=int, default=80)
    ap.add_argument("--snapshot-entries", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--first-run", action="store_true",
                    help="the first whatif on an empty cache, and the twins' cost per event")  # fmt: skip
    args = ap.parse_args()
    if args.first_run:
        return first_run()
    capacity = args.capacity_gib * GiB
    policies = [parse_policy(p) for p in DEFAULT_POLICIES]

    started = time.perf_counter()
    warm = training_like_stream(2_000, seed=1)
    for p in policies:
        summarize(p, p.simulate(warm, capacity), warm, capacity, False, 0.0)
    warmup_s = time.perf_counter() - started

    started = time.perf_counter()
    stream = training_like_stream(args.requests)
    build_s = time.perf_counter() - started
    print(f"stream: {stream.n_requests:,} requests, {stream.n_events:,} events"
          f" (built in {build_s:.2f} s); warm-up / compile {warmup_s:.2f} s")  # fmt: skip
    print(f"{'policy':34s} {'replay s':>9s} {'summary s':>10s} {'peak reserved':>14s} {'OOMs':>5s}")
    total = 0.0
    for p in policies:
        t0 = time.perf_counter()
        result = p.simulate(stream, capacity)
        t1 = time.perf_counter()
        outcome = summarize(p, result, stream, capacity, False, t1 - t0)
        t2 = time.perf_counter()
        total += t2 - t0
        print(f"{p.name:34s} {t1 - t0:9.2f} {t2 - t1:10.2f}"
              f" {outcome.peak_reserved_bytes / GiB:10.2f} GiB {outcome.simulated_ooms:5d}")  # fmt: skip
    verdict = "PASS" if total < LIMIT_S else "FAIL"
    print(f"total (all {len(policies)} policies, replay + summary): {total:.2f} s")
    if args.snapshot_entries:
        snapshot_whatif(args.snapshot_entries, args.repeat)
    print(f"target whatif_1M_requests_all_policies: {total:.2f} s vs {LIMIT_S:.0f} s: {verdict}")
    return 0


def snapshot_whatif(n_entries: int, repeat: int) -> None:
    from big_snapshot import big_snapshot

    path = big_snapshot(n_entries)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        report = whatif(path)
        times.append(time.perf_counter() - started)
    (space, *_) = report.spaces
    print(f"whatif on a {n_entries:,}-entry snapshot ({path.stat().st_size / 1e6:.0f} MB,"
          f" {space.requests:,} requests, {len(space.outcomes)} policies): best of {repeat}"
          f" {min(times):.2f} s ({', '.join(f'{t:.2f}' for t in times)})")


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def twin_costs(n_requests: int = 3_000, capacity: int = 80 * GiB) -> None:
    """Each default policy on one small stream, interpreted and compiled (warm): µs an event."""
    stream = training_like_stream(n_requests, seed=3)
    print(f"per-event cost, {stream.n_events:,} events (load {_load()}):")
    print(f"{'policy':34s} {'twin µs':>9s} {'compiled µs':>12s} {'ratio':>7s}")
    before = os.environ.get("NSYSFRAG_KERNELS")
    try:
        for p in (parse_policy(name) for name in DEFAULT_POLICIES):
            spent = {}
            for way in ("compiled", "interpreted"):
                os.environ["NSYSFRAG_KERNELS"] = way
                p.simulate(stream, capacity)  # compiled: compile, or load from the cache, first
                started = time.perf_counter()
                p.simulate(stream, capacity)
                spent[way] = (time.perf_counter() - started) / stream.n_events * 1e6
            print(f"{p.name:34s} {spent['interpreted']:9.1f} {spent['compiled']:12.2f}"
                  f" {spent['interpreted'] / spent['compiled']:6.0f}×")  # fmt: skip
    finally:
        if before is None:
            os.environ.pop("NSYSFRAG_KERNELS", None)
        else:
            os.environ["NSYSFRAG_KERNELS"] = before


def _whatif_seconds(path: Path, cache: Path) -> float:
    """Process start to exit of ``nsysfrag whatif PATH -q --json`` on the cache in ``cache``,
    as a user runs it on a fresh install, less the background compiler."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(REPO),
           "NSYSFRAG_BACKGROUND_COMPILE": "off"}  # fmt: skip
    for name in ("NUMBA_CACHE_DIR", "NSYSFRAG_KERNELS"):
        env.pop(name, None)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "nsysfrag", "whatif", str(path), "-q", "--json", os.devnull],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"nsysfrag whatif {path} failed: {done.stderr}")
    return time.perf_counter() - started


def first_run() -> int:
    from big_snapshot import big_snapshot

    twin_costs()
    inputs = {"sample": SAMPLE, "genuine": GENUINE, "synthetic": big_snapshot(SYNTHETIC_ENTRIES)}
    print(f"first whatif on an empty cache, then a second on what it left (load {_load()}):")
    firsts = {}
    for name, path in inputs.items():
        if not path.exists():
            print(f"{name:10s} {path.name}: not here, skipped")
            continue
        with tempfile.TemporaryDirectory(prefix="nsysfrag-bench-cache-") as folder:
            firsts[name] = _whatif_seconds(path, Path(folder))
            later = _whatif_seconds(path, Path(folder))
        print(f"{name:10s} first {firsts[name]:6.2f} s, later {later:6.2f} s  {path.name}"
              f" (load {_load()})")  # fmt: skip
    for name, seconds in firsts.items():
        limit = FIRST_RUN_LIMITS_S[name]
        verdict = "PASS" if seconds <= limit else "FAIL"
        print(f"target first_whatif_{name}: {seconds:.2f} s vs {limit:.0f} s: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

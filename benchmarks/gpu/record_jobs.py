"""The programs ``record_check.py`` records, one per check (``python record_jobs.py MODE ...``);
plain ``torch.empty`` tensors only, so the same file runs on a GPU and on tests/fake_torch.

- ``frag``: torchrun's rank 0 holds a little and waits; rank 1 fills the device with 6 MiB
  tensors (three to a 20 MiB segment) until a quarter of it is free, frees two of every three,
  holds that ``HOLD_S``, then asks for 40 % of the device: more than is free outside the
  segments, less than is stranded inside them (a fragmentation OOM, exit 1);
- ``spawn N``: N processes started as ``torch.multiprocessing.spawn`` starts them (the spawn
  method, no RANK), all on device 0, each holding ``(i + 1) x 64 MiB``;
- ``hold S``: 256 MiB held for S seconds (the check sends SIGTERM meanwhile);
- ``fraction F``: ``set_per_process_memory_fraction(F)``, then 256 MiB at a time until refused;
- ``churn N``: N allocations and frees of 1 MiB beside 1 GiB held (the history fills);
- ``monitor N OUT``: ``nsysfrag.torch.monitor(OUT, every=1)`` around N quick steps of churn,
  printing how many steps were rated.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

import torch

MiB, GiB = 1 << 20, 1 << 30


def _empty(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


def frag() -> int:
    torch.cuda.set_device(0)
    total = torch.cuda.get_device_properties(0).total_memory
    if int(os.environ.get("RANK", "0")) != 1:
        held = _empty(256 * MiB)
        time.sleep(float(os.environ.get("RANK0_S", "60")))  # torchrun's SIGTERM ends it
        del held
        return 0
    time.sleep(1.0)
    blocks = []
    while torch.cuda.mem_get_info()[0] > total // 4:
        blocks.append(_empty(6 * MiB))
    pinned = blocks[::3]
    del blocks
    time.sleep(float(os.environ.get("HOLD_S", "3")))
    ask = _empty(int(total * 0.4))  # OutOfMemoryError: the process exits 1
    del ask, pinned
    return 0


def _spawned(index: int) -> None:
    torch.cuda.set_device(0)
    held = [_empty(64 * MiB) for _ in range(index + 1)]
    time.sleep(1.5)
    del held


def spawn(n: int) -> int:
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_spawned, args=(i,)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return max(p.exitcode or 0 for p in procs)


def hold(seconds: float) -> int:
    held = _empty(256 * MiB)
    print("holding", flush=True)
    time.sleep(seconds)
    del held
    return 0


def fraction(share: float) -> int:
    torch.cuda.set_per_process_memory_fraction(share)
    kept = []
    try:
        while True:
            kept.append(_empty(256 * MiB))
    except torch.cuda.OutOfMemoryError:
        print(len(kept))
    return 0


def churn(n: int) -> int:
    held = _empty(GiB)
    for _ in range(n):
        x = _empty(MiB)
        del x
    time.sleep(2.5)  # a sample or two after the history is full
    for _ in range(n // 10):
        x = _empty(MiB)
        del x
    del held
    return 0


def monitored(n: int, out: str) -> int:
    from nsysfrag.torch import monitor

    rated = 0
    with monitor(out, every=1, interval=1) as m:
        held = _empty(GiB)
        for _ in range(n):
            for _ in range(50):
                x = _empty(MiB)
                del x
            rated += m.step() is not None
        del held
    print(rated)
    return 0


def main(argv: list[str]) -> int:
    mode, args = argv[0], argv[1:]
    if mode == "frag":
        return frag()
    if mode == "spawn":
        return spawn(int(args[0]))
    if mode == "hold":
        return hold(float(args[0]))
    if mode == "fraction":
        return fraction(float(args[0]))
    if mode == "churn":
        return churn(int(args[0]))
    return monitored(int(args[0]), args[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

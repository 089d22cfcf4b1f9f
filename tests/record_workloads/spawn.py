"""``torch.multiprocessing.spawn``'s way of starting a job, on the fake torch: N fresh Python
processes (the spawn start method), each told its index as an argument and no ``RANK``, each
doing ``torch.cuda.set_device(index % DEVICES)`` and allocating ``(index + 1)`` x 8 MiB.

``python spawn.py N [DEVICES]`` (DEVICES: how many devices the processes share, default N).
"""

from __future__ import annotations

import multiprocessing
import sys

import torch

MiB = 1 << 20


def worker(index: int, devices: int) -> None:
    torch.cuda.set_device(index % devices)
    kept = [torch.empty(8 * MiB, dtype=torch.uint8, device="cuda") for _ in range(index + 1)]
    del kept


def main(argv: list[str]) -> int:
    n = int(argv[0])
    devices = int(argv[1]) if len(argv) > 1 else n
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=worker, args=(i, devices)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return max(p.exitcode or 0 for p in procs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A job on real torch's Python layer (a CPU build) over the simulated allocator
(tests/torch_layer/shim.py), for ``nsysfrag record``:

- ``python real_layer.py spawn N``: ``torch.multiprocessing.spawn`` of N processes, no ``RANK``,
  each ``torch.cuda.set_device(i)`` and ``(i + 1)`` x 8 MiB allocated, then freed;
- ``python real_layer.py fraction F``: ``set_per_process_memory_fraction(F)``, then 100 MiB at a
  time until the allocator refuses; prints how many it got;
- ``python real_layer.py churn N``: N allocations and frees of 1 MiB (the history fills);
- ``python real_layer.py grow N``: N steps whose activation grows by 10 MiB a step (100 MiB
  first), each allocated and freed: the workload whose cached segments expandable segments
  remove (tests/record_workloads/settings.py's ``growing``, for ``record --try``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.torch_layer import shim  # noqa: E402  (the repository first on the path)

torch = shim.install()  # in every process: spawn's children import this module again
MiB = 1 << 20


def worker(index: int) -> None:
    torch.cuda.set_device(index)
    blocks = [shim.malloc(8 * MiB) for _ in range(index + 1)]
    for b in blocks:
        shim.free(b)


def fraction(share: float) -> int:
    torch.cuda.set_per_process_memory_fraction(share)
    kept = []
    try:
        while True:
            kept.append(shim.malloc(100 * MiB))
    except torch.cuda.OutOfMemoryError:
        return len(kept)


def churn(n: int) -> None:
    torch.cuda.init()
    keep = shim.malloc(64 * MiB)
    for _ in range(n):
        shim.free(shim.malloc(MiB))
    shim.free(keep)


def grow(steps: int) -> None:
    torch.cuda.init()
    for step in range(steps):
        shim.free(shim.malloc((100 + 10 * step) * MiB))


def main(argv: list[str]) -> int:
    if argv[0] == "spawn":
        torch.multiprocessing.spawn(worker, nprocs=int(argv[1]))
    elif argv[0] == "fraction":
        print(fraction(float(argv[1])))
    elif argv[0] == "grow":
        grow(int(argv[1]))
    else:
        churn(int(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The planted workload of ``record_try_check.sh`` on a real GPU: a step loop whose activation
grows by 10 MiB a step (100 MiB to 490 MiB, then again), reporting each step through
``nsysfrag.torch.monitor().step()``. PyTorch's native allocator keeps every smaller cached
segment and grows reserved memory by each new size (until its OOM path frees the cache);
expandable segments grow one mapped range instead. It runs until ``--duration`` ends it."""

from __future__ import annotations

import itertools
import time

import torch

from nsysfrag.torch import monitor

MiB = 1 << 20


def main() -> None:
    with monitor(every=5) as m:
        for step in itertools.count():
            # zeros, not empty: the memory is written, as an activation's is
            activation = torch.zeros((100 + 10 * (step % 40)) * MiB, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            time.sleep(0.05)
            del activation
            m.step()


if __name__ == "__main__":
    main()

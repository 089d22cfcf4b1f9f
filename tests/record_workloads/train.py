"""A training job for the fake torch (tests/fake_torch), one process per rank.

Rank 0 trains steadily: weights, then per step activations allocated and freed. Rank 1 fills
its device with 6 MiB tensors (PyTorch packs three into each 20 MiB segment) until about
400 MiB are left, frees two of every three (the one left pins its segment: the rest is
stranded), waits for the recorder to rate that, then asks for 1 GiB: more than the device has
outside its segments, less than what is free in them, so the out-of-memory is fragmentation's.
Its OutOfMemoryError ends the process (exit 1).

``STEPS`` and ``STEP_S`` (environment) set rank 0's length; ``HOLD_S`` how long rank 1 waits.
"""

from __future__ import annotations

import os
import time

import torch

MiB, GiB = 1 << 20, 1 << 30


def weights(n: int, size: int) -> list[torch.Tensor]:
    return [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(n)]


def steady(steps: int, step_s: float) -> None:
    params = weights(8, 64 * MiB)
    for _ in range(steps):
        activations = [torch.empty(32 * MiB, dtype=torch.uint8, device="cuda") for _ in range(6)]
        time.sleep(step_s)
        del activations
    del params


def fragmenting(hold_s: float) -> None:
    segments = (torch.cuda.mem_get_info()[0] - 400 * MiB) // (20 * MiB)
    blocks = [torch.empty(6 * MiB, dtype=torch.uint8, device="cuda") for _ in range(3 * segments)]
    pinned = blocks[::3]  # one tensor in each segment stays
    del blocks
    time.sleep(hold_s)
    cache = torch.empty(1 * GiB, dtype=torch.uint8, device="cuda")  # OutOfMemoryError
    del cache, pinned


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if rank == 1:
        fragmenting(float(os.environ.get("HOLD_S", "2.5")))
    else:
        steady(int(os.environ.get("STEPS", "5")), float(os.environ.get("STEP_S", "0.8")))


if __name__ == "__main__":
    main()

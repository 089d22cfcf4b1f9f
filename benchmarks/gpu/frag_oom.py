"""A two-rank job with a fragmentation OOM on rank 1, for ``record_check.py`` on one GPU:
``torchrun --nproc_per_node=2 frag_oom.py`` (both ranks share device 0 when there is one).

Rank 0 trains a small MLP for ``STEPS`` steps (its memory is allocated in its first steps and
reused after). Rank 1 waits ``SETTLE_S``, then fills the device with 6 MiB tensors (PyTorch
packs three into each 20 MiB segment) until less than ``LEFT_GIB`` is free, frees two of every
three (the third pins its segment: the rest is stranded), holds that for ``HOLD_S`` so the
recorder rates it, and asks for ``ASK_GIB``: more than the device has outside the segments,
much less than is free inside them, so the OutOfMemoryError is fragmentation's.
"""

from __future__ import annotations

import os
import time

import torch

MiB, GiB = 1 << 20, 1 << 30


def env(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def steady() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(128, 2048, device="cuda")
    for _ in range(int(env("STEPS", 2000))):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        time.sleep(0.01)


def fragmenting() -> None:
    time.sleep(env("SETTLE_S", 3))
    blocks = []
    while torch.cuda.mem_get_info()[0] > env("LEFT_GIB", 2) * GiB:
        blocks.append(torch.empty(6 * MiB, dtype=torch.uint8, device="cuda"))
    pinned = blocks[::3]
    del blocks
    time.sleep(env("HOLD_S", 8))
    ask = torch.empty(int(env("ASK_GIB", 8) * GiB), dtype=torch.uint8, device="cuda")
    del ask, pinned


def main() -> None:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local % torch.cuda.device_count())
    if int(os.environ.get("RANK", "0")) == 1:
        fragmenting()
    else:
        steady()


if __name__ == "__main__":
    main()

"""The training loop ``bench_record.py`` times: ``python record_workload.py TIMES.json SECONDS``
(steps until SECONDS have passed).

With PyTorch and CUDA: a 6-layer MLP (8192 wide, bf16, batch 2048) trained with AdamW, each step
synchronized so its wall time is the GPU's; its allocations are the caching allocator's usual
mix (activations, gradients set to None every step, the optimizer's state once). With the fake
torch of the tests (no GPU: ``PYTHONPATH=tests/fake_torch``): the same step's allocations on
the fake device and 20 ms of sleep for its compute. Writes each step's seconds as JSON.
"""

from __future__ import annotations

import json
import sys
import time

import torch


def real_steps(seconds: float) -> list[float]:
    model = torch.nn.Sequential(
        *[m for _ in range(6) for m in (torch.nn.Linear(8192, 8192), torch.nn.GELU())]
    ).to("cuda", torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(2048, 8192, device="cuda", dtype=torch.bfloat16)
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return times


def fake_steps(seconds: float) -> list[float]:
    mib = 1 << 20
    params = [torch.empty(32 * mib, dtype=torch.uint8, device="cuda") for _ in range(6)]
    state = [torch.empty(64 * mib, dtype=torch.uint8, device="cuda") for _ in range(6)]
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        activations = [torch.empty(2 * mib, dtype=torch.uint8, device="cuda") for _ in range(12)]
        grads = [torch.empty(32 * mib, dtype=torch.uint8, device="cuda") for _ in range(6)]
        time.sleep(0.02)
        del activations, grads
        times.append(time.perf_counter() - started)
    del params, state
    return times


def main() -> None:
    out, seconds = sys.argv[1], float(sys.argv[2])
    fake = "fake" in torch.__version__
    times = fake_steps(seconds) if fake else real_steps(seconds)
    with open(out, "w") as f:
        json.dump({"torch": torch.__version__, "fake": fake, "step_s": times}, f)


if __name__ == "__main__":
    main()

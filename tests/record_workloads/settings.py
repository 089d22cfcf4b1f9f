"""A program for ``nsysfrag record --try`` on the fake torch (tests/fake_torch), whose memory
each allocator setting changes in a way known beforehand. ``WORKLOAD`` (environment) picks:

- ``growing``: a step loop whose activation grows by 10 MiB a step (a sequence length that
  grows). The native allocator cannot reuse a cached segment for a larger request, so it keeps
  every smaller one and reserved memory climbs to the sum of them; expandable segments grow
  the one mapped range instead, and reserved stays near the largest request.
- ``rounding``: the same steps beside five 1.1 GiB buffers, which fit the device as asked but
  not once roundup_power2_divisions:2 rounds each up to 1.5 GiB (an out-of-memory error).
- ``forever``: the growing loop without end (``--duration`` must end it).

``PROGRAM_CONF`` (environment), when set, is what the program itself puts in
PYTORCH_CUDA_ALLOC_CONF before torch starts, as a training script that configures its own
allocator does.

Under a launcher (``RANK`` set) each rank's activations are ``50 MiB × RANK`` larger, so that
the ranks' figures differ.

Each step reports itself through ``nsysfrag.torch.monitor().step()``; ``STEPS`` sets how many
(default 20) and ``STEP_S`` how long each sleeps (default 0.05 s).
"""

from __future__ import annotations

import itertools
import os
import time

if "PROGRAM_CONF" in os.environ:  # before torch reads it
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = os.environ["PROGRAM_CONF"]

import torch  # noqa: E402

from nsysfrag.torch import monitor  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30


def main() -> None:
    workload = os.environ.get("WORKLOAD", "growing")
    steps = int(os.environ.get("STEPS", "20"))
    step_s = float(os.environ.get("STEP_S", "0.05"))
    extra = 50 * int(os.environ.get("RANK", "0"))
    buffers = []
    if workload == "rounding":
        buffers = [torch.empty(int(1.1 * GiB), dtype=torch.uint8, device="cuda") for _ in range(5)]
    with monitor(every=5) as m:
        for step in itertools.count() if workload == "forever" else range(steps):
            size = (100 + extra + 10 * (step % 40)) * MiB
            activation = torch.empty(size, dtype=torch.uint8, device="cuda")
            time.sleep(step_s)
            del activation
            m.step()
    del buffers


if __name__ == "__main__":
    main()

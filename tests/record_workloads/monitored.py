"""A program that records itself with the Python API (``nsysfrag.torch.monitor``) on the fake
torch: every other step() rates a state (forced: the test asks for each, whatever the budget;
``--budget`` leaves it to the budget); what it returns is printed as JSON lines."""

from __future__ import annotations

import json
import sys

import torch

from nsysfrag.torch import monitor

MiB = 1 << 20


def main(out: str) -> None:
    with monitor(out, every=2, interval=30, overwrite="--overwrite" in sys.argv) as m:
        kept = []
        for step in range(6):
            blocks = [torch.empty(6 * MiB, dtype=torch.uint8, device="cuda") for _ in range(120)]
            kept += blocks[::3]
            del blocks
            ratings = m.step(force="--budget" not in sys.argv)
            if ratings is not None:
                print(json.dumps({"step": step, "ratings": [r.document() for r in ratings]}))
    del kept


if __name__ == "__main__":
    main(sys.argv[1])

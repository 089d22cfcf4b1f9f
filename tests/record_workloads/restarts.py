"""torchrun's elastic restarts in small: rank 0 runs once per attempt, one after the other,
with ``TORCHELASTIC_RESTART_COUNT`` counting them; the first attempt allocates 8 MiB and
fails, the second 16 MiB and succeeds. ``python restarts.py``."""

from __future__ import annotations

import os
import subprocess
import sys

PROGRAM = (
    "import os, sys, torch;"
    " n = int(os.environ['TORCHELASTIC_RESTART_COUNT']) + 1;"
    " x = torch.empty(n * 8 << 20, dtype=torch.uint8, device='cuda');"
    " sys.exit(0 if n > 1 else 3)"
)


def main() -> int:
    for attempt in range(2):
        env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
               "TORCHELASTIC_RESTART_COUNT": str(attempt)}  # fmt: skip
        code = subprocess.run([sys.executable, "-c", PROGRAM], env=env, check=False).returncode
        if code == 0:
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""A two-rank launcher in torchrun's manner: ``python launch.py [--nproc N] SCRIPT ARGS...``
starts N Python processes of SCRIPT with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set; when one fails it ends the others with SIGTERM (as torchrun does) and exits 1;
else 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    n = 2
    if argv[:1] == ["--nproc"]:
        n, argv = int(argv[1]), argv[2:]
    procs = []
    for rank in range(n):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, *argv], env=env))
    failed = False
    while [p.poll() for p in procs].count(None):
        if any(p.returncode not in (None, 0) for p in procs) and not failed:
            failed = True
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
        time.sleep(0.05)
    return 1 if failed or any(p.returncode != 0 for p in procs) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

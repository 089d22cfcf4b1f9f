"""The local pool's own choices: which rank goes first, and how a worker's malloc reuses memory."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nsysfrag.job.pool import largest_first, run_pool
from nsysfrag.job.worker import RankTask
from tests.conftest import SAMPLES


def _task(rank: int, path: Path) -> RankTask:
    return RankTask(rank, str(path), None, 512)


def test_the_largest_input_goes_first_and_ties_keep_rank_order(tmp_path: Path) -> None:
    sizes = {0: 10, 1: 3000, 2: 10, 3: 70_000, 4: 3000}
    tasks = []
    for rank, size in sizes.items():
        path = tmp_path / f"rank{rank}.sqlite"
        path.write_bytes(b"x" * size)
        tasks.append(_task(rank, path))
    tasks.append(_task(5, tmp_path / "missing.sqlite"))  # its worker says what is wrong
    assert [t.rank for t in largest_first(tasks)] == [3, 1, 4, 0, 2, 5]


def test_a_pool_run_in_another_order_gives_every_outcome(tmp_path: Path) -> None:
    small = tmp_path / "small.sqlite"
    small.write_bytes(b"not an export")
    tasks = [_task(0, small), _task(1, SAMPLES / "training_loop.sqlite"), _task(2, small)]
    outcomes = sorted(run_pool(tasks, 2), key=lambda o: o.rank)
    assert [o.rank for o in outcomes] == [0, 1, 2]
    assert [o.ok for o in outcomes] == [False, True, False]


# A fresh process, so that this test's allocations are the first its malloc sees: a block
# freed and asked for again comes back from the heap without a page fault once the worker's
# settings are in, and as fresh (faulting) pages without them.
REUSE = """
import resource, sys
from nsysfrag.job import pool
if sys.argv[1] == "kept":
    pool._keep_freed_memory()
size = 24 << 20
block = bytearray(size)  # written through (zeroed) by Python: every page touched
del block
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = bytearray(size)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_a_worker_reuses_freed_memory_instead_of_faulting_fresh_pages() -> None:
    def faults(mode: str) -> int:
        run = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(REUSE), mode],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return int(run.stdout)

    pages = (24 << 20) // 4096
    assert faults("kept") < pages // 10
    if not _huge_pages_always():  # else a fresh block may fault a 2 MiB page at a time
        assert faults("default") > pages // 2  # what the settings save: the block's pages again


def _huge_pages_always() -> bool:
    try:
        return "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False

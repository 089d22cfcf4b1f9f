"""The hostile-input contract of ``contract.py``, checked in this process.

A fresh interpreter costs more than a second per run (numba, numpy), too much for a fuzz test's
thousands of examples. Here ``nsysfrag.cli.main`` runs in this process with stdout and stderr
captured and an alarm as the wall-clock limit; the checks on the exit code, stderr and the
inputs are the same. What this cannot check is the address-space limit: ``run_nsysfrag`` does,
on the representative cases, and a local fuzz run can put the whole pytest under ``ulimit -v``.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

from nsysfrag.cli import main
from tests.hostile.contract import TIMEOUT_S, Outcome, _fingerprint, check_outcome


class _TimedOut(BaseException):  # not an Exception: main() must not report it as a bug
    pass


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: FrameType | None) -> None:
        raise _TimedOut()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_in_process(
    args: Sequence[str | os.PathLike[str]],
    *,
    inputs: Sequence[Path] = (),
    timeout_s: float = TIMEOUT_S,
    allowed_codes: Sequence[int] = (0, 2),
) -> Outcome:
    """Run ``nsysfrag ARGS`` here and assert the hostile-input contract (but the memory limit)."""
    before = {p: _fingerprint(p) for p in inputs}
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    try:
        with _deadline(timeout_s), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main([os.fspath(a) for a in args])
    except SystemExit as done:
        code = 0 if done.code is None else done.code
    except _TimedOut:
        raise AssertionError(f"nsysfrag {list(args)!r} ran past {timeout_s:.0f} s") from None
    stderr = err.getvalue()
    check_outcome(code, stderr, before, allowed_codes)
    return Outcome(int(code) if isinstance(code, int) else 2, out.getvalue(), stderr)

"""A child process (nsys, or a stand-in for it) that finishes, or is killed with all of its own.

An ``nsys export`` that never returns, or an ``nsys --version`` stuck on a dead network mount,
must not hang a CI job. Such a child runs in a process group of its own (a new session), with
its output captured, under a time limit; when the limit passes, or nsysfrag is interrupted
(Ctrl-C, SIGTERM), the whole group is killed — nsys's own helpers too — and the caller hears
of it as :class:`TimedOut` or the interruption itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

# After the kill: how long to wait for the pipes to drain before giving up on them (a
# grandchild that left the group may still hold them open).
_DRAIN_S = 2.0


class TimedOut(Exception):
    """The child ran past its limit and was killed with its process group."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"did not finish within {seconds:g} s")
        self.seconds = seconds


class Terminated(KeyboardInterrupt):
    """SIGTERM while a child ran: its group was killed; the run stops as for Ctrl-C."""


@dataclass(frozen=True, slots=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str


def run_bounded(
    argv: Sequence[str], timeout_s: float | None, env: Mapping[str, str] | None = None
) -> Finished:
    """Run ``argv`` (stdin closed, output captured as text) in its own process group, for at
    most ``timeout_s`` seconds (None: no limit); raise :class:`TimedOut` past it, OSError when
    it cannot start."""
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=None if env is None else dict(env),
        start_new_session=True,
    )
    try:
        with _sigterm_raises():
            out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise TimedOut(timeout_s or 0.0) from None
    except BaseException:
        kill_group(proc)
        raise
    return Finished(
        proc.returncode,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
    )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s process group (it leads one: ``start_new_session``), then reap it."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()  # not in its group any more (it called setsid itself)
    try:
        proc.communicate(timeout=_DRAIN_S)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_DRAIN_S)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the block, so the child's group is killed (its
    own session does not get the signal a terminal or a job scheduler sends ours)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

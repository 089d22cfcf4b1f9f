"""What a command shows on stderr while it works, so that a long wait is never a silent one.

On a terminal: a transient bar per phase (loading rows, replaying events) and a spinner while
numba compiles; all of it disappears when the work is done. Elsewhere (a pipe, a CI log): no
bars, and one line when kernels are compiled, which happens once per install (then they load
from the cache, see nsysfrag.kernel_cache).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from nsysfrag import jit
from nsysfrag.errors import EXIT_GATE
from nsysfrag.events import ProgressCallback
from nsysfrag.pipeline.outputs import stderr_console
from nsysfrag.printable import printable


def say(message: str) -> None:
    """One line on stderr, ``nsysfrag: MESSAGE``; a path or name in it is shown escaped."""
    click.echo(f"nsysfrag: {printable(message)}", err=True)


def say_tripped(lines: Iterable[str]) -> int:
    """Say each tripped gate or regression; return the exit code they make (1, else 0)."""
    code = 0
    for line in lines:
        say(line)
        code = EXIT_GATE
    return code


class Feedback:
    """Progress and compile notices for one command (use :func:`feedback`)."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._bar: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._lock = threading.Lock()
        self._said: set[str] = set()

    @property
    def on_terminal(self) -> bool:
        return self._console.is_terminal

    @property
    def progress(self) -> ProgressCallback | None:
        """The callback for a phase's progress, None when stderr is not a terminal."""
        return self._update if self.on_terminal else None

    def _progress(self) -> Progress:
        with self._lock:
            if self._bar is None:
                self._bar = Progress(
                    SpinnerColumn(finished_text=" "),
                    TextColumn("{task.description}"),
                    BarColumn(),
                    TextColumn("{task.fields[count]}"),
                    TimeElapsedColumn(),
                    console=self._console,
                    transient=True,
                )
                self._bar.start()
            return self._bar

    def _update(self, phase: str, done: int, total: int) -> None:
        bar = self._progress()
        if phase not in self._tasks:
            self._tasks[phase] = bar.add_task(phase, total=total, count="")
        bar.update(self._tasks[phase], completed=done, total=total, count=f"{done}/{total}")

    def _start(self, label: str) -> None:
        if not self.on_terminal:
            if label not in self._said:
                self._said.add(label)
                say(label)
            return
        bar = self._progress()
        if label in self._tasks:
            bar.reset(self._tasks[label], total=None)
        else:
            self._tasks[label] = bar.add_task(label, total=None, count="")

    def _stop(self, label: str) -> None:
        if self.on_terminal and label in self._tasks:
            self._progress().update(self._tasks[label], total=1, completed=1)

    @contextmanager
    def compiling(self, what: str) -> Iterator[None]:
        """Say "compiling WHAT, once per install; later runs load it from the cache" if numba
        compiles in the block: only on a cache miss, i.e. the first run after installing on an
        input too large to interpret (nsysfrag.interpreted); a warm run says nothing. No time
        is promised: it depends on the machine and its load (docs/performance.md has what
        benchmarks/bench_startup.py --compiled measured); on a terminal the spinner shows the
        time elapsed."""
        label = f"compiling {what}, once per install; later runs load it from the cache"
        with jit.watching_compiles(lambda: self._start(label), lambda: self._stop(label)):
            yield

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


@contextmanager
def feedback() -> Iterator[Feedback]:
    """A :class:`Feedback` on stderr for the duration of the block."""
    shown = Feedback(stderr_console())
    try:
        yield shown
    finally:
        shown.close()

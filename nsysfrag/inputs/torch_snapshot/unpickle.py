"""Unpickle a file that must hold plain data only: no global is ever imported.

A PyTorch memory snapshot is dicts, lists, strings, numbers and tuples. The unpickler here
refuses every global (class, function) and persistent id, so a pickle that asks for
``os.system`` is rejected before any of it runs. The file is streamed into it, never held whole
beside the objects it makes, with the cyclic garbage collector paused while they are built,
and only as far as ``pickle_scan`` has checked its opcodes: no tuple nested deeper than
``limits.PICKLE_NESTING`` is ever built (hashing one recurses in C until the process crashes).
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nsysfrag import limits
from nsysfrag.errors import InputError
from nsysfrag.events import ProgressCallback
from nsysfrag.inputs.files import check_input_file
from nsysfrag.inputs.torch_snapshot.pickle_scan import (
    MARKS_TOO_DEEP,
    MEMO_BEYOND,
    OK,
    REFUSED,
    TUPLES_TOO_DEEP,
    Scanner,
)

PICKLE_PROTO = 0x80  # the first byte of every pickle of protocol 2 or later


class _RefusedGlobal(Exception):
    pass


class _PlainDataUnpickler(pickle.Unpickler):
    """Builds containers and scalars only: every global (class, function) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise _RefusedGlobal(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _RefusedGlobal("a persistent object")


def load_plain_pickle(path: Path, progress: ProgressCallback | None = None) -> Any:
    """Unpickle ``path`` without importing anything; raise :class:`InputError` otherwise."""
    return load_pickle_bytes(path, progress)[0]


def load_pickle_bytes(path: Path, progress: ProgressCallback | None = None) -> tuple[Any, int]:
    """Unpickle ``path`` without importing anything, and how many bytes the pickle is (up to
    its STOP: what expansion limits count, whatever the file's size); InputError otherwise.

    The file is streamed into the unpickler (never held whole beside the objects it makes),
    with the cyclic garbage collector paused: a snapshot is millions of small containers, and
    the collector would otherwise rescan them all, again and again, while they are built. The
    unpickler is handed only bytes whose opcodes ``pickle_scan`` has checked, on a thread of
    its own that runs ahead of it without the GIL (on two cores it costs no time).
    """
    check_input_file(
        path,
        expected="pass the .pickle written by _dump_snapshot()",
        directory="pass a snapshot file (.pickle)",
    )
    with path.open("rb") as f:
        head = f.read(1)
        if not head:
            raise InputError(f"{path}: the file is empty; dump the snapshot again")
        if head[0] != PICKLE_PROTO:
            raise InputError(
                f"{path}: not a pickle (no protocol header); pass the file written by"
                " torch.cuda.memory._dump_snapshot(), or an nsys .sqlite export"
            )
        f.seek(0)
        total = os.fstat(f.fileno()).st_size
        limit = int(limits.PICKLE_NESTING.value())
        guarded = _Checked(f, Scanner(f.fileno(), total, limit), progress)
        try:
            data = _unpickle(path, guarded, limit)
        finally:
            guarded.stop()
        if progress is not None:
            progress("reading the snapshot", guarded.position, guarded.position)
        return data, guarded.pickle_bytes()


class _Refused(Exception):
    """The pass over the opcodes refused what comes next (``pickle_scan.REFUSED``)."""


class _Checked(io.RawIOBase):
    """The file as the unpickler reads it: only bytes whose opcodes the pass has checked,
    waiting for it when the unpickler catches up; reporting how far it got."""

    def __init__(
        self, f: io.BufferedReader, scanner: Scanner, progress: ProgressCallback | None
    ) -> None:
        self.f, self.scanner, self.progress = f, scanner, progress
        self.position = self.next_report = 0
        self.checked = 0  # the end of the last opcode the pass checked
        self._finished = False
        self._stopping = False
        self._failure: BaseException | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._scan, name="pickle-scan", daemon=True)
        self._thread.start()

    def _scan(self) -> None:
        try:
            while not self.scanner.done and not self._stopping:
                self.scanner.step()
                with self._changed:
                    self.checked = self.scanner.pos
                    self._changed.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the reading thread
            self._failure = err
        finally:
            with self._changed:
                self._finished = True
                self._changed.notify_all()

    def stop(self) -> None:
        self._stopping = True
        self._thread.join()

    def _allowed(self, end: int) -> int:
        """How far the unpickler may read, wanting to read to ``end``: there once the pass is
        past it; when the pass ended, to the pickle's end, or just past where the pass could
        not follow it (the unpickler then fails there in its own words)."""
        with self._changed:
            while self.checked < end and not self._finished:
                self._changed.wait(0.1)  # a timeout keeps Ctrl-C answered
        if self._failure is not None:
            raise self._failure
        if self.checked >= end:
            return end
        status = self.scanner.status
        if status in REFUSED:
            raise _Refused(status, self.scanner.deepest)
        if status == OK:
            return end
        return min(end, self.scanner.pos + _LAST_OPCODE_BYTES)

    def pickle_bytes(self) -> int:
        """The pickle's own bytes: to its STOP (what the unpickler consumed, at most)."""
        return self.scanner.pos if self.scanner.status == OK else self.position

    def readable(self) -> bool:
        return True

    def _advance(self, n: int) -> None:
        self.position += n
        if self.progress is not None and self.position >= self.next_report:
            self.progress("reading the snapshot", self.position, self.scanner.file_bytes)
            self.next_report = self.position + (1 << 22)

    def read(self, n: int | None = -1) -> bytes:
        want = self.scanner.file_bytes - self.position if n is None or n < 0 else n
        allowed = self._allowed(self.position + want) - self.position
        data = self.f.read(max(allowed, 0))
        self._advance(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def readline(self, size: int | None = -1) -> bytes:
        line = self.f.readline(-1 if size is None else size)
        allowed = self._allowed(self.position + len(line)) - self.position
        if allowed < len(line):
            self.f.seek(self.position + max(allowed, 0))
            line = line[: max(allowed, 0)]
        self._advance(len(line))
        return line

    def peek(self, n: int = 0) -> bytes:
        self._allowed(self.position + 1)
        with self._changed:
            ahead = self.checked - self.position
        if self._finished and self.scanner.status == OK:
            ahead = max(ahead, 0)
        return self.f.peek(n)[: max(ahead, 0)]


# How far the unpickler may read past the last opcode the pass checked: the opcode it could
# not follow and its (short) argument, so that the unpickler fails on it in its own words.
_LAST_OPCODE_BYTES = 9


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic collector off while plain data is built (it holds no cycles to collect)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _unpickle(path: Path, source: Any, limit: int) -> Any:
    try:
        with paused_gc():
            return _PlainDataUnpickler(source).load()
    except _Refused as err:
        status, deepest = err.args
        what = {
            TUPLES_TOO_DEEP: f"tuples nested more than {limit:,} deep",
            MARKS_TOO_DEEP: f"containers open more than {limit:,} deep",
            MEMO_BEYOND: "a memo slot beyond any the file could fill",
        }[status]
        raise InputError(
            f"{path}: the pickle holds {what}, which no memory snapshot has (a crafted file?);"
            f" refusing to load it ({limits.PICKLE_NESTING.env} raises the depth)"
        ) from None
    except _RefusedGlobal as err:
        raise InputError(
            f"{path}: the pickle references {err}, and a memory snapshot holds only plain data;"
            " refusing to load it (never unpickle untrusted files with pickle.load)"
        ) from None
    except EOFError:
        raise InputError(
            f"{path}: the pickle is truncated; copy or dump the snapshot again"
        ) from None
    except pickle.UnpicklingError as err:
        if "truncated" in str(err):
            raise InputError(
                f"{path}: the pickle is truncated; copy or dump the snapshot again"
            ) from None
        raise InputError(
            f"{path}: not a readable pickle ({_first_line(err)}); the file is corrupt: copy or"
            " dump the snapshot again"
        ) from None
    except RecursionError:
        raise InputError(f"{path}: the pickle nests too deeply to be a memory snapshot") from None
    except MemoryError:
        raise InputError(f"{path}: the pickle does not fit in memory") from None
    except Exception as err:  # noqa: BLE001 - any malformed opcode stream is the same user error
        raise InputError(
            f"{path}: not a readable pickle ({_first_line(err)}); the file is corrupt or"
            " truncated: copy or dump the snapshot again"
        ) from None


def _first_line(err: BaseException) -> str:
    text = str(err).splitlines()[0][:200] if str(err) else ""
    return text or type(err).__name__

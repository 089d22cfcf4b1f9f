"""Unpickle a file that must hold plain data only: no global is ever imported.

A PyTorch memory snapshot is dicts, lists, strings, numbers and tuples. The unpickler here
refuses every global (class, function) and persistent id, so a pickle that asks for
``os.system`` is rejected before any of it runs. The file is streamed into it, never held whole
beside the objects it makes, with the cyclic garbage collector paused while they are built,
and only once ``pickle_scan`` has checked its opcodes: no tuple nested deeper than
``limits.PICKLE_NESTING`` is ever built (hashing one recurses in C until the process crashes).
"""

from __future__ import annotations

import gc
import io
import os
import pickle
from collections.abc import Callable, Iterator
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
    pass of ``pickle_scan`` checks the whole pickle first; one it passes is unpickled straight
    from the file. Alongside the unpickler, on a thread, the pass cost more than it saved: at
    a million entries 1.72-2.08 s CPU against 1.50 s one after the other (the two threads hand
    the GIL back and forth). A pickle the pass stops in is unpickled through ``_Checked``, only
    as far as the pass got, so that the unpickler fails there in its own words.
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
        scanner = Scanner(f.fileno(), total, limit)
        source = _Counted(f, progress, total)

        def scanned_and_loaded() -> Any:
            nonlocal source
            while not scanner.done:
                scanner.step()
                if progress is not None:  # the pass is the bar's first half, unpickling its second
                    progress("reading the snapshot", min(scanner.pos, total) // 2, total)
            if scanner.status != OK:
                source = _Checked(f, scanner, progress, total)
            return _PlainDataUnpickler(source).load()

        data = _unpickle(path, scanned_and_loaded, limit)
        if progress is not None:
            progress("reading the snapshot", source.position, source.position)
        pickle_bytes = scanner.pos if scanner.status == OK else source.position
        return data, pickle_bytes


class _Refused(Exception):
    """The pass over the opcodes refused what comes next (``pickle_scan.REFUSED``)."""


class _Counted(io.RawIOBase):
    """The file as the unpickler reads it, reporting how far it got."""

    def __init__(self, f: io.BufferedReader, progress: ProgressCallback | None, total: int) -> None:
        self.f, self.progress, self.total = f, progress, total
        self.position = self.next_report = 0

    def readable(self) -> bool:
        return True

    def _advance(self, n: int) -> None:
        self.position += n
        if self.progress is not None and self.position >= self.next_report:
            self.progress("reading the snapshot", (self.total + self.position) // 2, self.total)
            self.next_report = self.position + (1 << 22)

    def _allowed(self, end: int) -> int:
        """How far the unpickler may read, wanting to read to ``end``."""
        return end

    def read(self, n: int | None = -1) -> bytes:
        want = self.total - self.position if n is None or n < 0 else n
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
        return self.f.peek(n)


class _Checked(_Counted):
    """The file as the unpickler reads it when the pass stopped short of a whole pickle: only
    the bytes whose opcodes it checked, then (for an opcode it could not follow) just past it,
    so that the unpickler fails there in its own words; or, for what it refused, nothing."""

    def __init__(
        self, f: io.BufferedReader, scanner: Scanner, progress: ProgressCallback | None, total: int
    ) -> None:
        super().__init__(f, progress, total)
        self.scanner = scanner

    def _allowed(self, end: int) -> int:
        if self.scanner.pos >= end:
            return end
        status = self.scanner.status
        if status in REFUSED:
            raise _Refused(status, self.scanner.deepest)
        return min(end, self.scanner.pos + _LAST_OPCODE_BYTES)

    def peek(self, n: int = 0) -> bytes:
        self._allowed(self.position + 1)
        return self.f.peek(n)[: max(self.scanner.pos - self.position, 0)]


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


def _unpickle(path: Path, load: Callable[[], Any], limit: int) -> Any:
    """``load()``'s plain data; InputError, in words, for anything it raises."""
    try:
        with paused_gc():
            return load()
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

"""Unpickle a file that must hold plain data only: no global is ever imported.

A PyTorch memory snapshot is dicts, lists, strings, numbers and tuples. The unpickler here
refuses every global (class, function) and persistent id, so a pickle that asks for
``os.system`` is rejected before any of it runs. The file is streamed into it, never held whole
beside the objects it makes, with the cyclic garbage collector paused while they are built.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nsysfrag.errors import InputError
from nsysfrag.events import ProgressCallback
from nsysfrag.inputs.files import check_input_file

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
    """Unpickle ``path`` without importing anything; raise :class:`InputError` otherwise.

    The file is streamed into the unpickler (never held whole beside the objects it makes),
    with the cyclic garbage collector paused: a snapshot is millions of small containers, and
    the collector would otherwise rescan them all, again and again, while they are built.
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
        if progress is None:
            return _unpickle(path, f)
        data = _unpickle(path, _Reporting(f, total, progress))
        progress("reading the snapshot", total, total)
        return data


class _Reporting(io.RawIOBase):
    """A file the unpickler reads through, reporting how far it got."""

    def __init__(self, f: io.BufferedReader, total: int, progress: ProgressCallback) -> None:
        self.f, self.total, self.progress = f, total, progress
        self.done = self.next_report = 0

    def readable(self) -> bool:
        return True

    def _advance(self, n: int) -> None:
        self.done += n
        if self.done >= self.next_report:
            self.progress("reading the snapshot", self.done, self.total)
            self.next_report = self.done + (1 << 22)

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self._advance(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        n = self.f.readinto(buffer)
        self._advance(n)
        return n

    def readline(self, size: int | None = -1) -> bytes:
        data = self.f.readline(-1 if size is None else size)
        self._advance(len(data))
        return data

    def peek(self, n: int = 0) -> bytes:
        return self.f.peek(n)


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


def _unpickle(path: Path, source: Any) -> Any:
    try:
        with paused_gc():
            return _PlainDataUnpickler(source).load()
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

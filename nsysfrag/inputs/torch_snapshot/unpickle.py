"""Unpickle a file that must hold plain data only: no global is ever imported.

A PyTorch memory snapshot is dicts, lists, strings, numbers and tuples. The unpickler here
refuses every global (class, function) and persistent id, so a pickle that asks for
``os.system`` is rejected before any of it runs. The file is streamed into it, never held whole
beside the objects it makes, with the cyclic garbage collector paused while they are built,
and only once ``pickle_scan`` has checked its opcodes: no tuple nested deeper than
``limits.PICKLE_NESTING`` is ever built (hashing one recurses in C until the process crashes).

A reader that turns a snapshot's trace into columns may have it unpickled in slices
(:class:`SliceTaker`): the object graph of a million trace entries is larger than everything
made of it, so the entries are handed over as they are unpickled, a slice at a time, and freed.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np

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


class _SlicingUnpickler(_PlainDataUnpickler):
    """Hands each sliced list to ``take`` where the spliced stream asks for it (BINPERSID):
    ``pickle_scan`` found no persistent id in the file, so every one is a slice's end."""

    def __init__(self, source: io.RawIOBase, take: Callable[[Any], None]) -> None:
        super().__init__(source)
        self.take = take

    def persistent_load(self, pid: Any) -> Any:
        self.take(pid)


class SliceTaker(Protocol):
    """Takes a list's items as the pickle is unpickled: ``items`` at a time (at least), from
    each list that grows by that many (a trace: nothing else in a snapshot is that long)."""

    items: int

    def begin(self, pickle_bytes: int) -> None:
        """The pass found slices: ``take`` will be called (the pickle is ``pickle_bytes``)."""

    def take(self, items: Any) -> None:
        """``items`` (the list, as unpickled so far) at a slice's end; may empty it. Must not
        raise: an exception here is the pickle's to the caller."""


def load_plain_pickle(path: Path, progress: ProgressCallback | None = None) -> Any:
    """Unpickle ``path`` without importing anything; raise :class:`InputError` otherwise."""
    return load_pickle_bytes(path, progress)[0]


def load_pickle_bytes(
    path: Path, progress: ProgressCallback | None = None, taker: SliceTaker | None = None
) -> tuple[Any, int]:
    """Unpickle ``path`` without importing anything, and how many bytes the pickle is (up to
    its STOP: what expansion limits count, whatever the file's size); InputError otherwise.
    ``taker``: unpickled in slices when the pass found where (``taker.begin`` is then called).

    The file is streamed into the unpickler (never held whole beside the objects it makes),
    with the cyclic garbage collector paused: a snapshot is millions of small containers, and
    the collector would otherwise rescan them all, again and again, while they are built. The
    pass of ``pickle_scan`` checks the whole pickle first; one it passes is unpickled straight
    from the file. Alongside the unpickler, on a thread, the pass cost more than it saved: at
    a million entries 1.72-2.08 s CPU against 1.50 s one after the other (the two threads hand
    the GIL back and forth). A pickle the pass stops in is unpickled through ``_Checked``, only
    as far as the pass got, so that the unpickler fails there in its own words.

    In slices: after each slice's end the unpickler is handed opcodes of its own (``_Spliced``)
    that call ``taker.take`` with the list and then empty the memo slots that nothing names
    again, so that what the taker dropped is freed: the memo holds every container otherwise.
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
        scanner = Scanner(f.fileno(), total, limit, taker.items if taker is not None else 0)
        source: _Counted | _Spliced = _Counted(f, progress, total)

        def scanned_and_loaded() -> Any:
            nonlocal source
            while not scanner.done:
                scanner.step()
                if progress is not None:  # the pass is the bar's first half, unpickling its second
                    progress("reading the snapshot", min(scanner.pos, total) // 2, total)
            if scanner.status != OK:
                source = _Checked(f, scanner, progress, total)
            ends = scanner.slice_ends()
            if taker is None or not len(ends):
                return _PlainDataUnpickler(source).load()
            taker.begin(scanner.pos)
            source = _Spliced(f, progress, total, ends, scanner.memo_last_use())
            del ends
            scanner.last_use = scanner.bounds = np.zeros(0, np.int64)  # the source has them now
            return _SlicingUnpickler(source, taker.take).load()

        data = _unpickle(path, scanned_and_loaded, limit)
        if progress is not None:
            progress("reading the snapshot", source.position, source.position)
        pickle_bytes = scanner.pos if scanner.status == OK else source.position
        return data, pickle_bytes


def _read_into(read: Callable[[int], bytes], buffer: Any) -> int:
    """``readinto`` through ``read``: the C unpickler reads long items with it."""
    view = memoryview(buffer).cast("B")
    data = read(len(view))
    view[: len(data)] = data
    return len(data)


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
        return _read_into(self.read, buffer)

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


class _Spliced(io.RawIOBase):
    """The file as the unpickler reads it in slices: at each slice's end (just after an
    append), DUP BINPERSID POP hand the list on top of the stack to the taker, then NONE,
    LONG_BINPUT per memo slot whose last use was in that slice, POP: an overwritten slot
    (never a new one: MEMOIZE numbers slots by how many are filled) frees its object once
    nothing else holds it. ``position`` counts the file's bytes only."""

    def __init__(
        self,
        f: io.BufferedReader,
        progress: ProgressCallback | None,
        total: int,
        ends: np.ndarray,
        last_use: np.ndarray,
    ) -> None:
        self.f, self.progress, self.total = f, progress, total
        self.ends = ends.tolist()
        # Slots by the slice they die in; LONG_BINPUT names 32-bit slots only (a later one
        # stays filled: memory, not a wrong result).
        slots = np.flatnonzero((last_use >= 0) & (last_use < len(self.ends)))
        slots = slots[slots < (1 << 32)]
        dies = last_use[slots]
        order = np.argsort(dies, kind="stable")
        self.slots = slots[order].astype(np.uint32)
        self.cuts = np.searchsorted(dies[order], np.arange(len(self.ends) + 1)).tolist()
        self.buffer = bytearray()
        self.offset = 0  # of the next byte to hand on, in buffer
        self.next_end = 0  # the next slice end to splice in
        self.position = self.next_report = 0  # the file's bytes read

    def readable(self) -> bool:
        return True

    def _spliced(self, k: int) -> bytes:
        dead = self.slots[self.cuts[k] : self.cuts[k + 1]]
        if not len(dead):
            return b"2Q0"
        puts = np.empty(len(dead), dtype=[("op", "u1"), ("slot", "<u4")])
        puts["op"] = ord("r")
        puts["slot"] = dead
        return b"2Q0N" + puts.tobytes() + b"0"

    def _fill(self, want: int) -> None:
        """At least ``want`` bytes ahead in the buffer, unless the file ends first."""
        if self.offset > (1 << 20) and 2 * self.offset > len(self.buffer):
            del self.buffer[: self.offset]
            self.offset = 0
        while len(self.buffer) - self.offset < want:
            if self.next_end < len(self.ends) and self.position == self.ends[self.next_end]:
                self.buffer += self._spliced(self.next_end)
                self.next_end += 1
                continue
            stop = self.ends[self.next_end] if self.next_end < len(self.ends) else self.total
            data = self.f.read(min(max(want, 1 << 17), stop - self.position))
            if not data:
                return
            self.buffer += data
            self.position += len(data)
            if self.progress is not None and self.position >= self.next_report:
                self.progress("reading the snapshot", (self.total + self.position) // 2, self.total)
                self.next_report = self.position + (1 << 22)

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0:
            n = 1 << 62
        self._fill(n)
        data = bytes(self.buffer[self.offset : self.offset + n])
        self.offset += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        return _read_into(self.read, buffer)

    def readline(self, size: int | None = -1) -> bytes:
        limit = 1 << 62 if size is None or size < 0 else size
        while True:
            end = self.buffer.find(b"\n", self.offset, self.offset + limit)
            ahead = len(self.buffer) - self.offset
            if end >= 0 or ahead >= limit:
                return self.read(end + 1 - self.offset if end >= 0 else limit)
            self._fill(ahead + (1 << 16))
            if len(self.buffer) - self.offset == ahead:
                return self.read(ahead)

    def peek(self, n: int = 0) -> bytes:
        self._fill(max(n, 1))
        return bytes(self.buffer[self.offset : self.offset + max(n, 1)])


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

"""A pass over a pickle's opcodes before it is unpickled: how deep it nests, where it ends.

CPython unpickles iteratively, but hashing a tuple recurses in C without a bound: a 1 MB pickle
whose dict key is a tuple nested a million deep crashes the interpreter (SIGSEGV) when the key
is inserted, with nothing on stderr. So before the restricted unpickler sees a file, a compiled
loop walks its opcodes and keeps, for each value on pickle's stack and in its memo, how many
tuples deep it nests (a tuple's depth is fixed when it is built: tuples are immutable; a list
or a dict ends a chain of tuples, since hashing stops there). A pickle whose tuples nest, or
whose marks are open, deeper than ``limits.PICKLE_NESTING`` is refused, and so is a memo index
beyond the file (the unpickler would allocate the memo that large). Lists and dicts may nest
without bound here: every walk of them is Python code, which stops at its recursion limit.

The pass also finds the ``STOP`` opcode: the bytes up to it are the bytes the pickle is made of,
which the expansion limits count (``limits.py``), not the file's size (a sparse tail of a
terabyte holds nothing). The opcode grammar is pickle's own (``pickletools.opcodes``); a stream
the pass cannot follow is left to the unpickler, which then fails on it in its own words.
"""

from __future__ import annotations

import os
import pickletools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nsysfrag import interpreted, jit


# What an opcode does to the depths on the stack (OTHER: pop its inputs, push non-tuples).
OTHER, TUPLE_TO_MARK, TUPLE_N, EMPTY_TUPLE, MARK, GET, PUT, MEMOIZE, DUP, STOP = range(10)
# How its argument is laid out: none, fixed bytes, a length then bytes, one or two lines.
NO_ARG, FIXED, LENGTH, LINE, TWO_LINES = range(5)
# What the pass found.
OK, TRUNCATED, UNKNOWN_OPCODE, MALFORMED, TUPLES_TOO_DEEP, MARKS_TOO_DEEP, MEMO_BEYOND, GROW, NEED = range(9)
REFUSED = (TUPLES_TOO_DEEP, MARKS_TOO_DEEP, MEMO_BEYOND)
# A stack item's flags (``Scanner.info``), above the count of items appended to it.
_SHARED = np.int64(1) << np.int64(48)  # named twice (memo get, DUP): never sliced, never changed
_SLICED = np.int64(1) << np.int64(49)  # a list whose items were taken: only appended to after
_COUNT = _SHARED - np.int64(1)
_SPECIAL = {
    "TUPLE": TUPLE_TO_MARK, "TUPLE1": TUPLE_N, "TUPLE2": TUPLE_N, "TUPLE3": TUPLE_N,
    "EMPTY_TUPLE": EMPTY_TUPLE, "MARK": MARK, "GET": GET, "BINGET": GET, "LONG_BINGET": GET,
    "PUT": PUT, "BINPUT": PUT, "LONG_BINPUT": PUT, "MEMOIZE": MEMOIZE, "DUP": DUP, "STOP": STOP,
}  # fmt: skip


def _tables() -> tuple[np.ndarray, ...]:
    """Per opcode byte: action, argument layout, its size (fixed bytes, or the length's bytes;
    negative: a signed length), items popped before a mark, after it, pushed; known at all."""
    # int64: interpreted (nsysfrag.interpreted), ``pos += size[op]`` would make pos an int8.
    action = np.zeros(256, np.int64)
    layout = np.zeros(256, np.int64)
    size = np.zeros(256, np.int64)
    before = np.zeros(256, np.int64)  # items below the mark (APPENDS: the list), or all popped
    marked = np.zeros(256, np.bool_)
    after = np.zeros(256, np.int64)
    known = np.zeros(256, np.bool_)
    lengths = {pickletools.TAKEN_FROM_ARGUMENT1: 1, pickletools.TAKEN_FROM_ARGUMENT4: -4,
               pickletools.TAKEN_FROM_ARGUMENT4U: 4, pickletools.TAKEN_FROM_ARGUMENT8U: 8}  # fmt: skip
    for op in pickletools.opcodes:
        code = ord(op.code)
        known[code] = True
        action[code] = _SPECIAL.get(op.name, OTHER)
        arg = op.arg
        if arg is None:
            layout[code] = NO_ARG
        elif arg.n > 0:
            layout[code], size[code] = FIXED, arg.n
        elif arg.n == pickletools.UP_TO_NEWLINE:
            layout[code] = TWO_LINES if arg.name == "stringnl_noescape_pair" else LINE
        else:
            layout[code], size[code] = LENGTH, lengths[arg.n]
        stack = list(op.stack_before)
        if pickletools.markobject in stack:
            marked[code] = True
            before[code] = stack.index(pickletools.markobject)
        else:
            before[code] = len(stack)
        after[code] = len(op.stack_after)
    return action, layout, size, before, marked, after, known


ACTION, LAYOUT, SIZE, BEFORE, MARKED, AFTER, KNOWN = _tables()


@jit.njit(cache=True, nogil=True)
def _uint(data, at, n):  # type: ignore[no-untyped-def]
    value = np.uint64(0)
    for k in range(n):
        value |= np.uint64(data[at + k]) << np.uint64(8 * k)
    return value


@jit.njit(cache=True, nogil=True)
def _line_end(data, at):  # type: ignore[no-untyped-def]
    for k in range(at, len(data)):
        if data[k] == 10:  # "\n"
            return k
    return -1


@jit.njit(cache=True, nogil=True)
def _decimal(data, start, end):  # type: ignore[no-untyped-def]
    """The memo index of a text opcode (``g12\\n``); -1 when it is not one."""
    value = 0
    if end <= start or end - start > 18:
        return -1
    for k in range(start, end):
        c = data[k]
        if c < 48 or c > 57:
            return -1
        value = value * 10 + (c - 48)
    return value


@jit.njit(cache=True, nogil=True)
def _scan(data, base, stack, sp, marks, mp, filled, tuples, memo_len, table_keys, table_values, table_used, limit, tables, slicing):  # type: ignore[no-untyped-def]
    """Walk the opcodes in ``data`` (the file's bytes from offset ``base``) from its start;
    return (status, pos, sp, mp, memo_len, deepest tuple). NEED: the next opcode (at ``pos``)
    is not whole in ``data``; ``pos`` may be past its end when the last opcode's bytes were a
    string or bytes that need not be read.

    ``slicing`` (see :class:`Scanner`): per stack item its flags and the items appended to it
    since its last slice end; per memo slot the slice its last use falls in; slice ends; state."""
    action, layout, size, before, marked, after, known = tables
    info, last_use, bounds, state = slicing
    n = len(data)
    deepest = 0
    pos = 0
    while pos < n:
        start = pos
        op = data[pos]
        pos += 1
        # The opcodes that make up most of a snapshot first, without the tables: BINGET and
        # LONG_BINGET of a non-tuple, MEMOIZE of one, SHORT_BINUNICODE, BININT1, EMPTY_DICT.
        if (op == 104 or op == 106) and sp + 1 < len(stack):  # h, j
            width = 1 if op == 104 else 4
            if pos + width <= n:
                index = np.int64(_uint(data, pos, width))
                word, bit = index >> 6, np.uint64(1) << np.uint64(index & 63)
                if word < len(filled) and filled[word] & bit and not tuples[word] & bit:
                    stack[sp] = 0
                    info[sp] = _SHARED
                    last_use[index] = state[0]
                    sp += 1
                    pos += width
                    continue
        elif op == 148 and sp >= 1 and stack[sp - 1] == 0 and memo_len < len(filled) * 64:
            word, bit = memo_len >> 6, np.uint64(1) << np.uint64(memo_len & 63)
            if not filled[word] & bit:
                filled[word] |= bit
                last_use[memo_len] = state[0]
                memo_len += 1
                continue
        elif op == 140 and pos < n and sp + 1 < len(stack):  # SHORT_BINUNICODE
            stack[sp] = 0
            info[sp] = 0
            sp += 1
            pos += 1 + data[pos]
            continue
        elif (op == 75 or op == 125) and sp + 1 < len(stack):  # BININT1, EMPTY_DICT
            if op == 125 or pos < n:
                stack[sp] = 0
                info[sp] = 0
                sp += 1
                pos += 1 if op == 75 else 0
                continue
        if not known[op]:
            return 2, start, sp, mp, memo_len, deepest
        kind = layout[op]
        arg_at, arg_end = pos, pos
        if kind == 1:  # FIXED
            pos += size[op]
            arg_end = pos
            if pos > n:
                return 8, start, sp, mp, memo_len, deepest
        elif kind == 2:  # LENGTH: its bytes need not be here
            width = abs(size[op])
            if pos + width > n:
                return 8, start, sp, mp, memo_len, deepest
            length = _uint(data, pos, width)
            if size[op] < 0 and length >= np.uint64(1 << 31):  # a negative signed length
                return 3, start, sp, mp, memo_len, deepest
            if length > np.uint64(1 << 62):
                return 1, start, sp, mp, memo_len, deepest
            pos += width + np.int64(length)
        elif kind == 3 or kind == 4:  # LINE, TWO_LINES
            end = _line_end(data, pos)
            if end < 0:
                return 8, start, sp, mp, memo_len, deepest
            arg_end = end
            pos = end + 1
            if kind == 4:
                end = _line_end(data, pos)
                if end < 0:
                    return 8, start, sp, mp, memo_len, deepest
                pos = end + 1
        if sp + 4 > len(stack) or mp + 1 > len(marks) or state[0] >= len(bounds):
            return 7, start, sp, mp, memo_len, deepest
        act = action[op]
        if act == 9:  # STOP
            if sp < 1 or mp > 0 and marks[mp - 1] >= sp:
                return 3, start, sp, mp, memo_len, deepest
            return 0, pos, sp - 1, mp, memo_len, deepest
        if act == 4:  # MARK
            marks[mp] = sp
            mp += 1
            if mp > limit:
                return 5, start, sp, mp, memo_len, deepest
            continue
        if act == 5 or act == 6 or act == 7:  # GET, PUT, MEMOIZE: the memo index
            if act == 7:
                index = memo_len
            elif kind == 1:
                index = np.int64(_uint(data, arg_at, size[op]))
            else:
                index = _decimal(data, arg_at, arg_end)
                if index < 0:
                    return 3, start, sp, mp, memo_len, deepest
            if act != 5 and index > base + start:  # more slots than opcodes so far
                return 6, start, sp, mp, memo_len, deepest
            if index >= len(filled) * 64:
                if act == 5:
                    return 3, start, sp, mp, memo_len, deepest
                return 7, start, sp, mp, memo_len, deepest
            word, bit = index >> 6, np.uint64(1) << np.uint64(index & 63)
            if act == 5:
                if not filled[word] & bit:
                    return 3, start, sp, mp, memo_len, deepest
                stack[sp] = _table_get(table_keys, table_values, index) if tuples[word] & bit else 0
                info[sp] = _SHARED
                last_use[index] = state[0]
                sp += 1
                continue
            if sp < 1:
                return 3, start, sp, mp, memo_len, deepest
            if stack[sp - 1] > 0 and 2 * (table_used[0] + 1) > len(table_keys):
                return 7, start, sp, mp, memo_len, deepest  # the table of tuples grows first
            memo_len = _memo_put(filled, tuples, table_keys, table_values, table_used, index,
                                 stack[sp - 1], memo_len)  # fmt: skip
            last_use[index] = state[0]
            continue
        if act == 8:  # DUP
            if sp < 1:
                return 3, start, sp, mp, memo_len, deepest
            stack[sp] = stack[sp - 1]
            info[sp - 1] |= _SHARED  # two references: neither may be sliced or changed
            info[sp] = info[sp - 1]
            sp += 1
            continue
        depth = 0
        appended = 1  # items an APPEND(S) adds
        if marked[op]:
            if mp < 1:
                return 3, start, sp, mp, memo_len, deepest
            mp -= 1
            top = marks[mp]
            for k in range(top, sp):
                depth = max(depth, stack[k])
            appended = sp - top
            sp = top - before[op]
        else:
            for k in range(sp - before[op], sp):
                if k >= 0:
                    depth = max(depth, stack[k])
            sp -= before[op]
        if sp < 0 or mp > 0 and marks[mp - 1] > sp:
            return 3, start, sp, mp, memo_len, deepest
        kept = _slice_mark(op, info, sp, appended, base + pos, bounds, state)
        if act == 1 or act == 2 or act == 3:  # a tuple: one deeper than its deepest item
            depth = 1 if act == 3 else depth + 1
            deepest = max(deepest, depth)
            if depth > limit:
                return 4, start, sp, mp, memo_len, deepest
        else:
            depth = 0
        for _ in range(after[op]):
            stack[sp] = depth
            info[sp] = kept
            sp += 1
    return 8, pos, sp, mp, memo_len, deepest


@jit.njit(cache=True, nogil=True)
def _slice_mark(op, info, target, appended, end, bounds, state):  # type: ignore[no-untyped-def]
    """The flags of what opcode ``op`` pushes, the container it changed (at ``target``, its
    items popped) or else nothing; a slice ends after it (at ``end``, in the file) when it
    appended to a list that holds ``state[2]`` items since its last. ``state[1]`` becomes 1
    for what slicing cannot follow: a persistent id, a change to a container named twice, or
    anything but an append to one already sliced."""
    if op == 80 or op == 81:  # PERSID, BINPERSID: the load calls back (slicing's own way)
        state[1] = 1
    if not (op == 97 or op == 101 or op == 115 or op == 117 or op == 144 or op == 98):
        return 0  # APPEND, APPENDS, SETITEM, SETITEMS, ADDITEMS, BUILD change their target
    kept = info[target]
    if kept & _SHARED:
        state[1] = 1
    if not (op == 97 or op == 101):
        if kept & _SLICED:
            state[1] = 1
        return kept
    count = (kept & _COUNT) + appended
    if count >= state[2] and not kept & _SHARED:
        bounds[state[0]] = end
        state[0] += 1
        return (kept & ~_COUNT) | _SLICED
    return (kept & ~_COUNT) | count


@jit.njit(cache=True, nogil=True)
def _memo_put(filled, tuples, keys, values, used, index, depth, memo_len):  # type: ignore[no-untyped-def]
    """Memo slot ``index`` now holds a value ``depth`` tuples deep; the memo's new length.
    Only tuples are in the table (rare in a snapshot); a bit says which slots are tuples."""
    word, bit = index >> 6, np.uint64(1) << np.uint64(index & 63)
    if not filled[word] & bit:
        filled[word] |= bit
        memo_len += 1
    if depth > 0:
        tuples[word] |= bit
        used[0] += _table_set(keys, values, index, depth)
    elif tuples[word] & bit:
        tuples[word] &= ~bit
        _table_set(keys, values, index, 0)  # kept as a key of depth 0: no tombstones needed
    return memo_len


@jit.njit(cache=True, nogil=True)
def _slot(keys, index):  # type: ignore[no-untyped-def]
    """Where ``index`` is, or goes, in an open-addressing table (-1: an empty slot)."""
    mask = len(keys) - 1
    # Unsigned: the product wraps, in compiled code and interpreted alike.
    at = np.int64((np.uint64(index) * np.uint64(0x9E3779B97F4A7C15)) & np.uint64(mask))
    while keys[at] != -1 and keys[at] != index:
        at = (at + 1) & mask
    return at


@jit.njit(cache=True, nogil=True)
def _table_set(keys, values, index, depth):  # type: ignore[no-untyped-def]
    """Set ``index`` to ``depth``; 1 when it took an empty slot (the caller counts them)."""
    at = _slot(keys, index)
    new = 1 if keys[at] == -1 else 0
    keys[at] = index
    values[at] = depth
    return new


@jit.njit(cache=True, nogil=True)
def _table_get(keys, values, index):  # type: ignore[no-untyped-def]
    at = _slot(keys, index)
    return values[at] if keys[at] == index else 0


@jit.njit(cache=True, nogil=True)
def _rehash(keys, values, new_keys, new_values):  # type: ignore[no-untyped-def]
    for k in range(len(keys)):
        if keys[k] != -1 and values[k] > 0:
            _table_set(new_keys, new_values, keys[k], values[k])


@dataclass(frozen=True, slots=True)
class Scan:
    """What the pass found: a status (``OK`` when the pickle is whole and within the limit),
    where it stopped (just after ``STOP`` when OK), and the deepest chain of tuples."""

    status: int
    end: int
    deepest_tuple: int


# A snapshot's pickle takes about this many bytes per trace entry (what interpreted.chosen counts).
BYTES_PER_ITEM = 64


class Scanner:
    """The pass over a pickle file, read a chunk at a time (never more of it than the pickle's
    own bytes, whatever the file's size): :meth:`step` walks the next chunk's opcodes; ``pos``
    is then the end of the last opcode checked.

    With ``slice_items``, the pass also finds where the pickle may be unpickled in slices: the
    ends of the appends after which a list (a trace) holds ``slice_items`` more items than at
    its last such end (:meth:`slice_ends`), and for each memo slot the slice of its last use
    (:meth:`memo_last_use`): after that slice's end nothing names the slot again."""

    CHUNK = 1 << 20

    def __init__(self, fd: int, file_bytes: int, limit: int, slice_items: int = 0) -> None:
        self.fd, self.file_bytes, self.limit = fd, file_bytes, limit
        self.stack = np.zeros(1 << 12, np.int32)
        self.info = np.zeros(len(self.stack), np.int64)  # per stack item: _SHARED, _SLICED, count
        self.marks = np.zeros(min(limit + 2, 1 << 20), np.int64)
        self.filled = np.zeros(1 << 10, np.uint64)  # which memo slots hold a value
        self.tuples = np.zeros(len(self.filled), np.uint64)  # which of them hold a tuple
        self.last_use = np.full(64 * len(self.filled), -1, np.int32)  # -1: never filled
        self.table_keys = np.full(1 << 6, -1, np.int64)  # memo slots of tuples, their depths
        self.table_values = np.zeros(1 << 6, np.int32)
        self.table_used = np.zeros(1, np.int64)  # slots taken (a depth of 0 too)
        self.bounds = np.zeros(1 << 8, np.int64)  # where slices end, in the file
        # Slice ends found, 1 when slicing cannot follow the pickle, items per slice.
        self.state = np.array([0, 0, slice_items if slice_items > 0 else 1 << 62], np.int64)
        self.pos = self.sp = self.mp = self.memo_len = self.deepest = 0
        self.status = NEED
        self._read = self.CHUNK

    def slice_ends(self) -> np.ndarray:
        """Where each slice ends in the file (empty when the pickle cannot be sliced)."""
        if self.status != OK or self.state[1]:
            return self.bounds[:0]
        return self.bounds[: int(self.state[0])]

    def memo_last_use(self) -> np.ndarray:
        """Per memo slot, the slice its last use falls in (-1: a slot never filled)."""
        return self.last_use

    @property
    def done(self) -> bool:
        return self.status != NEED

    def step(self) -> None:
        """Walk the opcodes of the next chunk (or say the pickle ended, or why it stopped)."""
        if self.pos >= self.file_bytes:
            self.status = TRUNCATED
            return
        chunk = os.pread(self.fd, self._read, self.pos)
        tables = (ACTION, LAYOUT, SIZE, BEFORE, MARKED, AFTER, KNOWN)
        # Interpreted, the bytes themselves: their items are Python ints, which never wrap
        # as numpy's uint8 would (compiled code widens them to int64 first).
        interpret = interpreted.interpret(self.file_bytes // BYTES_PER_ITEM, _scan)
        slicing = (self.info, self.last_use, self.bounds, self.state)
        args = (
            self.pos, self.stack, self.sp, self.marks, self.mp, self.filled, self.tuples,
            self.memo_len, self.table_keys, self.table_values, self.table_used, self.limit, tables,
            slicing,
        )  # fmt: skip
        if interpret:  # noted as the compiled scan takes them, for a compile after the run
            interpreted.note(_scan, (np.frombuffer(chunk, dtype=np.uint8), *args))
            scanned = interpreted.twin(_scan)(chunk, *args)
        else:
            scanned = _scan(np.frombuffer(chunk, dtype=np.uint8), *args)
        status, pos, self.sp, self.mp, self.memo_len, found = scanned
        self.deepest = max(self.deepest, int(found))
        self.pos += int(pos)
        if status == GROW:
            if 2 * (int(self.table_used[0]) + 1) > len(self.table_keys):
                keys = np.full(4 * len(self.table_keys), -1, np.int64)
                values = np.zeros(len(keys), np.int32)
                rehash = interpreted.chosen(_rehash, self.file_bytes // BYTES_PER_ITEM)
                rehash(self.table_keys, self.table_values, keys, values)
                self.table_keys, self.table_values = keys, values
                self.table_used[0] = int(np.count_nonzero(values))
            elif self.state[0] >= len(self.bounds):
                self.bounds = np.concatenate([self.bounds, np.zeros(len(self.bounds), np.int64)])
            elif self.sp + 4 > len(self.stack):
                self.stack = np.concatenate([self.stack, np.zeros(len(self.stack), np.int32)])
                self.info = np.concatenate([self.info, np.zeros(len(self.info), np.int64)])
            else:
                self.filled = np.concatenate([self.filled, np.zeros(len(self.filled), np.uint64)])
                self.tuples = np.concatenate([self.tuples, np.zeros(len(self.tuples), np.uint64)])
                unused = np.full(len(self.last_use), -1, np.int32)
                self.last_use = np.concatenate([self.last_use, unused])
            return
        if status == NEED:
            if self.pos > self.file_bytes or (pos == 0 and len(chunk) < self._read):
                self.status = TRUNCATED  # an argument past the end of the file
            elif pos == 0:
                self._read *= 2  # one opcode longer than a chunk: a long line
            else:
                self._read = self.CHUNK
            return
        self.status = int(status)

    def run(self) -> Scan:
        while not self.done:
            self.step()
        return self.result()

    def result(self) -> Scan:
        return Scan(self.status, int(self.pos), self.deepest)


def scan_bytes(data: bytes, limit: int) -> Scan:
    """The whole pass over ``data`` (a pickle in memory, for tests)."""
    return scanned_bytes(data, limit).result()


def scanned_bytes(data: bytes, limit: int, slice_items: int = 0) -> Scanner:
    """The pass over ``data`` done, slicing after ``slice_items`` (tests read its findings)."""
    import tempfile

    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.flush()
        scanner = Scanner(f.fileno(), len(data), limit, slice_items)
        scanner.run()
        return scanner


def scan_pickle(path: Path, limit: int) -> Scan:
    """The whole pass over the pickle in ``path``."""
    with open(path, "rb") as f:
        return Scanner(f.fileno(), os.fstat(f.fileno()).st_size, limit).run()

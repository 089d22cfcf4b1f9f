"""A PyTorch memory snapshot as columns: each device's trace parsed once into numpy arrays.

The record reader (``reader``) turns every trace entry into a Python object; at a million entries that
object churn is most of the time. Here the entries go straight from the unpickled lists into
columns (action code, address, size, stream, time, stack id), a chunk at a time and mostly in
C (``map`` over the dicts, ``numpy.fromiter``); a chunk holding anything unusual (a missing
key, a bool where an int belongs, an unknown action) is parsed entry by entry with the very
checks the record reader applies, so both readers accept, skip and refuse the same entries.
Stacks become ids (``stacks``); only the OOM entries keep their frames.

The final ``segments`` (a few thousand blocks at most) stay records. Nothing of the unpickled
object graph outlives :func:`read_snapshot_columns`: it is dropped as soon as the columns exist.
A long trace is never whole as objects at all: it is unpickled in slices (``unpickle``), and
:class:`TraceSlices` makes each CHUNK of entries columns as soon as it is unpickled, exactly as
the whole read would, so that they are freed while the rest is unpickled. Whatever the slices
cannot show to be the same as the whole read (a trace list named twice, entries changed after
they were taken, a malformed entry, an error) is read again whole, which then decides.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress, repeat
from pathlib import Path
from typing import Any

import numpy as np

from nsysfrag.errors import InputError
from nsysfrag.events import FAILED_ALLOC, I8, I64, MARK, ProgressCallback
from nsysfrag.inputs.torch_snapshot.limits import ExpansionLimit
from nsysfrag.inputs.torch_snapshot.reader import (
    ACTION_KINDS,
    INT64,
    MAX_INT,
    MAX_TIME_US,
    SITE_ACTIONS,
    BadField,
    Segment,
    _max_split_size,
    _str_or_none,
    entry_fields,
    load_pickle_bytes,
    paused_gc,
    snapshot_parts,
)
from nsysfrag.inputs.torch_snapshot.stacks import StackTable, frames_of
from nsysfrag.models.snapshot_entries import NO_TIME, HistoryColumns

# The history's columns are defined beside the model that replays them; read from here too.
__all__ = ["NO_TIME", "HistoryColumns"]

# The action column holds the event model's kinds (``nsysfrag.events``) as they are.
_SITE_KINDS = np.array(sorted(ACTION_KINDS[a] for a in SITE_ACTIONS), dtype=np.int8)
CHUNK = 1 << 16


@dataclass(frozen=True)
class SnapshotColumns:
    """Everything the pytorch-segments model reads from a snapshot, in columns."""

    path: str
    layout: str
    segments: list[Segment]
    histories: dict[int, HistoryColumns]
    stack_site: I64  # stack id -> site code
    site_names: list[str]  # site code -> the site; 0 is "(no stack recorded)"
    allocator_conf: str | None = None
    max_split_size: int | None = None
    roundup_power2_divisions: dict[int, int] = field(default_factory=dict)
    expandable_segments: bool = False
    unknown_actions: Counter[str] = field(default_factory=Counter)
    skipped_entries: int = 0
    time_origin_us: int | None = None
    warnings: list[str] = field(default_factory=list)

    def devices(self) -> list[int]:
        """Devices with a segment or a trace entry, ascending."""
        found = {s.device for s in self.segments} | {d for d, h in self.histories.items() if len(h)}
        return sorted(found)

    def site(self, stack: int) -> str:
        return self.site_names[int(self.stack_site[stack])]


def read_snapshot_columns(
    path: str | Path, progress: ProgressCallback | None = None
) -> SnapshotColumns:
    """Read the snapshot at ``path`` into columns; raise :class:`InputError` if unusable."""
    path = Path(path)
    slices = TraceSlices(str(path), progress)
    # The collector stays off until the object graph is gone: turned on while millions of new
    # containers are alive, it would scan them all once before they are freed anyway.
    with paused_gc():
        try:
            data, pickle_bytes = load_pickle_bytes(path, progress, slices)
        except InputError:
            if slices.stacks is None:
                raise
            data, slices.failed = None, True  # the whole read says what is wrong, in its words
        if slices.stacks is not None and (slices.failed or not slices.placed(data)):
            del data
            slices = None
            data, pickle_bytes = load_pickle_bytes(path, progress)
        # The graph is ours alone: its entries are freed as they become columns.
        columns = snapshot_columns(data, str(path), pickle_bytes, progress, True, slices)
        del data  # the only reference to what is left of the object graph
    return columns


def snapshot_columns(
    data: Any,
    path: str,
    file_bytes: int | None = None,
    progress: ProgressCallback | None = None,
    consume: bool = False,
    slices: TraceSlices | None = None,
) -> SnapshotColumns:
    """Columns from an unpickled snapshot (``file_bytes`` bounds its expansion). ``consume``:
    empty each trace list as it is read (``data`` is the caller's no more), so that the entries
    and the columns made of them are never all alive at once: at a million entries that is the
    difference between the object graph's peak and the graph's plus the columns'. ``slices``:
    what was taken out of the trace lists while they were unpickled (``TraceSlices.placed``)."""
    with paused_gc():
        taken = slices.taken() if slices is not None else {}
        parts = snapshot_parts(data, path, file_bytes, taken)
        if slices is not None and slices.stacks is not None and slices.reader is not None:
            stacks, reader = slices.stacks, slices.reader
            reader.progress = progress
        else:
            limit = ExpansionLimit.for_file(path, file_bytes) if file_bytes is not None else None
            stacks = StackTable(limit)
            reader = _TraceReader(path, stacks, progress)
        reader.total = sum(map(len, parts.raw_traces)) + sum(taken.values())
        # A list named twice (through the memo) must be read whole the second time too.
        consume = consume and len(set(map(id, parts.raw_traces))) == len(parts.raw_traces)
        lists = slices.lists if slices is not None else {}
        histories = {
            d: reader.device(d, entries, consume, lists.get(id(entries)))
            for d, entries in enumerate(parts.raw_traces)
        }
        if progress is not None:  # a trace taken whole while it was unpickled shows as done
            progress("parsing trace entries", reader.total, reader.total)
    times = [h.time_us[h.time_us != NO_TIME] for h in histories.values()]
    timed = [t for t in times if len(t)]
    return SnapshotColumns(
        path=path,
        layout=parts.layout(bool(timed)),
        segments=parts.segments,
        histories=histories,
        stack_site=stacks.stack_site,
        site_names=stacks.site_names,
        allocator_conf=_str_or_none(parts.settings.get("PYTORCH_CUDA_ALLOC_CONF")),
        max_split_size=_max_split_size(parts.settings.get("max_split_size")),
        roundup_power2_divisions=parts.divisions(),
        expandable_segments=parts.expandable(),
        unknown_actions=reader.unknown,
        skipped_entries=reader.skipped,
        time_origin_us=min(int(t.min()) for t in timed) if timed else None,
        warnings=parts.warnings,
    )


@dataclass
class _Chunk:
    action: I8
    address: I64
    size: I64
    stream: I64
    time_us: I64
    frames: list[Any]  # per entry whose action keeps a stack, in order
    oom_entries: list[tuple[int, Any]]  # the OOM entries themselves (index in the trace, entry)


@dataclass
class _Taken:
    """A trace list that entries were taken out of while it was unpickled."""

    entries: list[Any]  # the list itself, held: its id is the key it is found by
    chunks: list[tuple[_Chunk, I64]]  # the columns of the entries taken, CHUNK each
    count: int = 0  # entries taken
    closed: bool = False  # a later list was sliced, so this one was taken whole then


class TraceSlices:
    """Takes each sliced trace list's entries, CHUNK at a time, as ``unpickle`` hands the list
    over, and makes them columns with the very chunks and stack table of the whole read: a
    list's last entries are taken when the next list is first sliced (the whole read parses
    the devices one after the other; stacks get their ids in that order).

    Entries taken are complete and stay as they were taken: ``pickle_scan`` slices only where
    no container is changed through a second name (a memo get, a DUP), so nothing reaches a
    taken entry to change it, and a sliced list is only appended to. :meth:`placed` checks
    the rest once the pickle is unpickled: the sliced lists are the device traces, in order,
    each named nowhere else. ``failed``: the slices cannot stand in for the whole read."""

    def __init__(self, path: str, progress: ProgressCallback | None) -> None:
        self.path, self.progress = path, progress
        self.lists: dict[int, _Taken] = {}  # id of a sliced list -> what was taken from it
        self.stacks: StackTable | None = None  # once slicing began
        self.reader: _TraceReader | None = None
        self.failed = False

    @property
    def items(self) -> int:
        """Entries per slice: a chunk's (a list that grows by fewer is never sliced)."""
        return CHUNK

    def begin(self, pickle_bytes: int) -> None:
        try:
            limit = ExpansionLimit.for_file(self.path, pickle_bytes)
        except InputError:  # a bad NSYSFRAG_SNAPSHOT_MAX_ITEMS: the whole read says so
            limit, self.failed = None, True
        self.stacks = StackTable(limit)
        self.reader = _TraceReader(self.path, self.stacks, None)

    def take(self, items: Any) -> None:
        if self.failed:
            return
        try:
            self._take(items)
        except Exception:  # noqa: BLE001 - a bad field, a limit: the whole read says which
            self.failed = True

    def _take(self, items: Any) -> None:
        if type(items) is not list:
            raise TypeError("not a list")
        taken = self.lists.get(id(items))
        if taken is None:
            first = items[0] if items else None
            if type(first) is not dict or "action" not in first:
                return  # a long list of segments, blocks or frames: left as it is
            for other in self.lists.values():
                if not other.closed:
                    self._chunks(other, whole=True)
                    other.closed = True
            taken = self.lists[id(items)] = _Taken(items, [])
        self._chunks(taken, whole=False)

    def _chunks(self, taken: _Taken, whole: bool) -> None:
        assert self.reader is not None
        entries = taken.entries
        while len(entries) >= CHUNK or (whole and entries):
            part = entries[:CHUNK]
            del entries[:CHUNK]
            taken.chunks.append(self.reader.chunk(part, -1, taken.count))
            taken.count += len(part)

    def taken(self) -> dict[int, int]:
        """Entries taken out of each sliced list, by its id."""
        return {key: t.count for key, t in self.lists.items()}

    def placed(self, data: Any) -> bool:
        """Whether the sliced lists are ``data``'s device traces, in the order they were
        sliced, each named there once and nowhere else (no reference to it but the trace
        list's and this table's), with every trace that has entries left and is not sliced
        after them: then the columns are those of the whole read."""
        if not self.lists:
            return True  # nothing was taken: the data is pickle's own
        traces = data.get("device_traces") if type(data) is dict else None
        if type(traces) is not list:
            return False
        probe_taken = _Taken([], [])
        probe_list = [probe_taken.entries]
        probe = probe_list[0]
        alone = sys.getrefcount(probe)  # a list, a _Taken and a name hold it: as each trace
        order = iter(self.lists.values())
        found = 0
        for d in range(len(traces)):
            trace = traces[d]
            taken = self.lists.get(id(trace))
            if taken is None:
                if type(trace) is list and trace and found < len(self.lists):
                    return False  # the whole read parses it before a sliced list
                continue
            if taken is not next(order, None) or sys.getrefcount(trace) != alone:
                return False
            if taken.closed and trace:
                return False  # appended to after it was taken whole
            found += 1
        return found == len(self.lists)


class _TraceReader:
    def __init__(self, path: str, stacks: StackTable, progress: ProgressCallback | None) -> None:
        self.path = path
        self.stacks = stacks
        self.progress = progress
        self.total = 0
        self.done = 0
        self.unknown: Counter[str] = Counter()
        self.skipped = 0

    def device(
        self, device: int, entries: list[Any], consume: bool, taken: _Taken | None = None
    ) -> HistoryColumns:
        """The columns of ``entries`` (after those ``taken`` while it was unpickled);
        ``consume``: emptying the list a chunk at a time. The stack table's keys (frame
        identities) stay valid as entries are freed: it holds each stack's first list."""
        chunks = list(taken.chunks) if taken is not None else []
        first = taken.count if taken is not None else 0
        self.done += first
        total = len(entries)
        for start in range(0, total, CHUNK):
            if consume:
                part = entries[:CHUNK]
                del entries[:CHUNK]
            else:
                part = entries[start : start + CHUNK]
            try:
                chunks.append(self.chunk(part, device, first + start))
            except BadField as err:
                raise InputError(
                    f"{self.path}: not a usable PyTorch memory snapshot: {err}"
                ) from None
            self.done += len(part)
            if self.progress is not None:
                self.progress("parsing trace entries", self.done, self.total)
        return _columns(chunks, device, self.path)

    def chunk(self, part: list[Any], device: int, start: int) -> tuple[_Chunk, I64]:
        """Entries ``start`` on of a device's trace as columns, and their stack ids."""
        chunk = _fast_chunk(part, start)
        if chunk is None:
            chunk = self._careful_chunk(part, device, start)
        ids = self.stacks.intern(chunk.frames)
        chunk.frames = []  # the stacks are ids now: their lists may go with the entries
        return chunk, ids

    def _careful_chunk(self, part: list[Any], device: int, start: int) -> _Chunk:
        """Entry by entry, with the record reader's checks: skips, unknown actions, errors."""
        rows = []
        frames = []
        ooms = []
        for k, entry in enumerate(part):
            fields = entry_fields(entry, device, start + k)
            if isinstance(fields, tuple):
                rows.append(fields)
                if fields[0] in SITE_ACTIONS:
                    frames.append(fields[6])
                if fields[0] == "oom":
                    ooms.append((start + k, entry))
            elif fields is None:
                self.skipped += 1
            else:
                self.unknown[fields] += 1
        n = len(rows)
        codes = np.fromiter((ACTION_KINDS[r[0]] for r in rows), dtype=np.int8, count=n)
        times = (NO_TIME if r[4] is None else r[4] for r in rows)
        return _Chunk(
            codes,
            np.fromiter((r[1] for r in rows), dtype=np.int64, count=n),
            np.fromiter((r[2] for r in rows), dtype=np.int64, count=n),
            np.fromiter((r[3] for r in rows), dtype=np.int64, count=n),
            np.fromiter(times, dtype=np.int64, count=n),
            frames,
            ooms,
        )


def _fast_chunk(part: list[Any], start: int) -> _Chunk | None:
    """The chunk parsed in bulk, or None when any entry needs a closer look."""
    n = len(part)
    if set(map(type, part)) != {dict}:
        return None
    get = dict.get
    code_of: Any = ACTION_KINDS.get
    try:
        codes = np.fromiter(map(code_of, map(get, part, repeat("action")), repeat(-1)), np.int8, n)
    except TypeError:  # an unhashable action
        return None
    if (codes < 0).any():
        return None
    addresses = list(map(get, part, repeat("addr")))
    no_address = (codes == FAILED_ALLOC) | (codes == MARK)
    for i in np.flatnonzero(no_address).tolist():  # oom and snapshot entries have none
        addresses[i] = 0
    address = _int_column(addresses, 0, MAX_INT)
    size = _int_column(list(map(get, part, repeat("size"), repeat(0))), 0, MAX_INT)
    stream = _int_column(list(map(get, part, repeat("stream"), repeat(0))), -INT64, INT64)
    times = list(map(get, part, repeat("time_us")))
    types = set(map(type, times))
    time_us: I64 | None
    if types == {type(None)}:
        time_us = np.full(n, NO_TIME, dtype=np.int64)
    else:
        if type(None) in types:
            times = [NO_TIME if t is None else t for t in times]
            types.discard(type(None))
        time_us = (
            _int_column(times, -MAX_TIME_US, MAX_TIME_US, allow=NO_TIME) if types == {int} else None
        )
    if address is None or size is None or stream is None or time_us is None:
        return None
    keeps_stack = np.isin(codes, _SITE_KINDS)
    frames = list(compress(map(get, part, repeat("frames")), keeps_stack.tolist()))
    ooms = [(start + i, part[i]) for i in np.flatnonzero(codes == FAILED_ALLOC).tolist()]
    return _Chunk(codes, address, size, stream, time_us, frames, ooms)


def _int_column(values: list[Any], low: int, high: int, allow: int | None = None) -> I64 | None:
    """``values`` as int64 when every one is a plain int in [low, high) (or ``allow``)."""
    if set(map(type, values)) != {int}:
        return None
    try:
        out = np.fromiter(values, dtype=np.int64, count=len(values))
    except OverflowError:
        return None
    bad = (out < low) | (out >= high)
    if allow is not None:
        bad &= out != allow
    return None if bad.any() else out


def _columns(chunks: list[tuple[_Chunk, I64]], device: int, path: str) -> HistoryColumns:
    def join(name: str) -> Any:
        parts = [getattr(c, name) for c, _ in chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    action = join("action").astype(np.int8)
    stack = np.zeros(len(action), dtype=np.int64)
    keeps = np.isin(action, _SITE_KINDS)
    ids = [s for _, s in chunks]
    if ids:
        stack[keeps] = np.concatenate(ids)
    oom_rows = np.flatnonzero(action == FAILED_ALLOC)
    oom_entries = [e for c, _ in chunks for e in c.oom_entries]
    free = np.full(len(oom_rows), -1, dtype=np.int64)
    frames = []
    for k, (index, entry) in enumerate(oom_entries):
        try:
            fields = entry_fields(entry, device, index)
        except BadField as err:
            raise InputError(f"{path}: not a usable PyTorch memory snapshot: {err}") from None
        assert isinstance(fields, tuple)
        if fields[5] is not None:
            free[k] = fields[5]
        frames.append(frames_of(fields[6]))
    return HistoryColumns(
        action=action,
        address=join("address"),
        size=join("size"),
        stream=join("stream"),
        time_us=join("time_us"),
        stack=stack,
        oom_rows=oom_rows.astype(np.int64),
        oom_device_free=free,
        oom_frames=tuple(frames),
    )


_NONE = np.zeros(0, dtype=np.int64)
EMPTY_HISTORY = HistoryColumns(np.zeros(0, np.int8), _NONE, _NONE, _NONE, _NONE, _NONE, _NONE, _NONE, ())

"""The stacks of a snapshot's trace entries, interned: one id per distinct stack, a site per id.

torch writes a frames list per traceback it gathered (``py_symbolize``): the alloc entry of a
block and its free entries share that list, frame dicts are shared by every list that holds
the frame, and lists of the same call site are equal element for element. So a stack is
recognised cheaply, without walking its frames in Python:

1. by identity — a list shared through the pickle memo is looked at once, however many entries
   name it (this is what defuses a 100,000-frame stack shared by 100,000 entries);
2. then by content — lists are grouped by a hash of their length and their middle frame's
   identity, and each list is compared with its group's first list by ``==`` (C code that
   passes over identical items); those that differ are grouped again, a few rounds, and what
   is left is interned by its frames' identities. Lists that compare equal share a stack:
   their frames hold equal values, so they name the same site.

Only one list per distinct stack is walked, to render its site (``reader.site_of``).
An OOM entry's stack is kept whole (file, line, function per frame): a report may show it.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import compress, repeat
from typing import cast

import numpy as np

from nsysfrag.events import I64, NameCodes
from nsysfrag.inputs.torch_snapshot.limits import ExpansionLimit
from nsysfrag.inputs.torch_snapshot.reader import (
    NO_STACK,
    describe,
    frame_text,
    outside_torch,
    site_of,
)
from nsysfrag.models.snapshot_entries import Frame

__all__ = ["Frame"]  # defined beside the model that replays a snapshot; read from here too

NO_STACK_ID = 0
MAX_STACK_FRAMES = 64  # of an OOM's stack a report keeps
ROUNDS = 4  # of grouping by content before the remaining lists are interned one by one


class StackTable:
    """Every distinct stack met so far, its site, and the site names."""

    def __init__(self, limit: ExpansionLimit | None) -> None:
        self.limit = limit
        self._sites = NameCodes([NO_STACK])
        self.site_names = self._sites.names
        self._stack_site: list[int] = [0]  # stack id -> site code
        # Frame identities of each distinct stack's first list -> its id. The first lists are
        # held, so those frames' ids stay theirs even as the entries are freed (a trace read
        # in slices frees frames no later entry names).
        self._by_frames: dict[tuple[int, ...], int] = {}
        self._first_lists: list[list[object]] = []

    @property
    def stack_site(self) -> I64:
        return np.asarray(self._stack_site, dtype=np.int64)

    def intern(self, frames: Sequence[object]) -> I64:
        """The stack id of each frames object (a list of frame dicts, or anything else)."""
        n = len(frames)
        out = np.zeros(n, dtype=np.int64)
        if n == 0:
            return out
        # 1. By identity: each distinct object once.
        ids = np.fromiter(map(id, frames), dtype=np.int64, count=n)
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        objects = list(map(frames.__getitem__, first.tolist()))
        is_list = np.fromiter(
            map(operator.is_, map(type, objects), repeat(list)), dtype=np.bool_, count=len(objects)
        )
        lists = cast(list[list[object]], list(compress(objects, is_list.tolist())))
        distinct = np.zeros(len(objects), dtype=np.int64)  # NO_STACK for non-lists
        if lists:
            distinct[is_list] = self._intern_lists(lists)
        out[:] = distinct[inverse.reshape(-1)]
        return out

    def _intern_lists(self, lists: list[list[object]]) -> I64:
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        if self.limit is not None and len(lengths):
            self.limit.check(int(lengths.max()), "frames in one stack")
        out = np.zeros(len(lists), dtype=np.int64)  # empty lists: NO_STACK
        full = np.flatnonzero(lengths > 0)
        if len(full) == 0:
            return out
        candidates = list(map(lists.__getitem__, full.tolist()))
        # 2. By content: groups by a hash of the length and the middle frame's identity; in
        # each group the lists equal (==) to its first are that stack, the rest try again.
        n = len(full)
        size = lengths[full]
        middle = np.fromiter(
            map(id, map(operator.getitem, candidates, (size // 2).tolist())), np.int64, count=n
        ).view(np.uint64)
        key = (size.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ middle  # wraps: a hash
        ids = np.full(n, NO_STACK_ID, dtype=np.int64)
        pending = np.arange(n)
        for _ in range(ROUNDS):
            _, leader, group = np.unique(key[pending], return_index=True, return_inverse=True)
            group = group.reshape(-1)
            leaders = [candidates[i] for i in pending[leader].tolist()]
            leader_ids = np.asarray([self._stack_id(f) for f in leaders], dtype=np.int64)
            members = map(candidates.__getitem__, pending.tolist())
            try:
                same = np.fromiter(
                    map(operator.eq, members, map(leaders.__getitem__, group.tolist())),
                    dtype=np.bool_,
                    count=len(pending),
                )
            except (RecursionError, TypeError, ValueError, MemoryError):
                break  # frames that do not compare: each list by its frames' identities
            ids[pending[same]] = leader_ids[group[same]]
            pending = pending[~same]
            if len(pending) == 0:
                break
        for k in pending.tolist():
            ids[k] = self._stack_id(candidates[k])
        out[full] = ids
        return out

    def _stack_id(self, frames: list[object]) -> int:
        key = tuple(map(id, frames))
        found = self._by_frames.get(key)
        if found is None:
            found = self._by_frames[key] = len(self._stack_site)
            self._stack_site.append(self.site_code(site_of(frames)))
            self._first_lists.append(frames)
        return found

    def site_code(self, site: str) -> int:
        return self._sites.code(site)


def frames_of(value: object) -> tuple[Frame, ...]:
    """A stack kept whole, as text: an OOM's request, for a report to show."""
    if not isinstance(value, list):
        return ()
    out = []
    for frame in value:
        if isinstance(frame, dict):
            out.append(tuple(map(_text, map(frame.get, ("filename", "line", "name"), repeat("?")))))
        else:
            out.append(("?", "?", "?"))
    return tuple(out)  # type: ignore[arg-type]


def _text(value: object) -> str:
    return value if isinstance(value, str) else describe(value) if isinstance(value, int) else "?"


def program_stack(frames: tuple[Frame, ...]) -> tuple[str, ...]:
    """An OOM request's path through the program, for a report: its Python frames outside
    torch/, innermost first (the first is the request's site), as ``dir/file.py:line function``;
    its Python frames inside torch when it has no other (as ``site_of`` chooses)."""
    python = [f for f in frames if f[0].endswith(".py")]
    program = [f for f in python if outside_torch(f[0])] or python
    return tuple(frame_text(*f) for f in program[:MAX_STACK_FRAMES])

"""The treap's queries in plain Python, over a sorted list: what the interpreted twins run.

A model's kernel keeps its free blocks in a treap (:mod:`nsysfrag.allocators.treap`), a struct
of arrays numba compiles. Run by CPython (an interpreted twin, :mod:`nsysfrag.interpreted`),
the same treap costs a Python call and a dozen numpy scalar reads per node on the way down,
some 30 µs an insert, which made the treap two fifths of a first ``whatif``. So each treap
operation is two functions: the compiled treap, which compiled code calls, and the one here,
which the twins call: the set's keys ``(K1, K2, id)`` in a ``sortedcontainers.SortedList``,
the same order, so every query answers with the same node.

The treap's array still holds each node's ``K1``, ``K2`` and ``VAL`` (the models read them
there); the sorted list lives beside the array, one per array for the array's life. A treap is
worked on by one side only: a run is either compiled or interpreted from its first event.
"""

from __future__ import annotations

import weakref
from typing import Any

from sortedcontainers import SortedList

K1, K2, VAL = 0, 1, 4  # the treap's rows (nsysfrag.allocators.treap: K1, K2, LT, RT, VAL …)
_LT, _RT = 2, 3


class _Keys:
    """The nodes of one treap, in key order, and their values."""

    __slots__ = ("keys", "values", "by_value")

    def __init__(self) -> None:
        self.keys: Any = SortedList()  # (K1, K2, id)
        self.values: dict[int, int] = {}  # id -> VAL
        self.by_value: Any = None  # VALs in order, made when the largest is first asked for


_sets: dict[int, _Keys] = {}


def _keys(t: Any) -> _Keys:
    found = _sets.get(id(t))
    if found is None:
        found = _sets[id(t)] = _Keys()
        weakref.finalize(t, _sets.pop, id(t), None)  # an id outlives its array
        _adopt(t, found)
    return found


def _adopt(t: Any, into: _Keys) -> None:
    """The nodes a compiled run left in the array's own tree (the root is nil's K1)."""
    stack = [int(t[0, K1])]
    while stack:
        a = stack.pop()
        if a != 0:
            into.keys.add((int(t[a, K1]), int(t[a, K2]), a))
            into.values[a] = int(t[a, VAL])
            stack += [int(t[a, _LT]), int(t[a, _RT])]


def t_insert(t: Any, n: int, k1: int, k2: int, val: int) -> None:
    s = _keys(t)
    n, k1, k2, val = int(n), int(k1), int(k2), int(val)
    t[n, K1] = k1
    t[n, K2] = k2
    t[n, VAL] = val
    s.keys.add((k1, k2, n))
    s.values[n] = val
    if s.by_value is not None:
        s.by_value.add(val)


def t_erase(t: Any, n: int) -> None:
    s = _keys(t)
    n = int(n)
    s.keys.remove((int(t[n, K1]), int(t[n, K2]), n))
    val = s.values.pop(n)
    if s.by_value is not None:
        s.by_value.remove(val)


def t_before(t: Any, k1: int, k2: int, kid: int) -> int:
    """The last node whose key is < (k1, k2, kid), or 0."""
    keys = _keys(t).keys
    i = keys.bisect_left((int(k1), int(k2), int(kid)))
    return keys[i - 1][2] if i else 0


def t_lower_bound(t: Any, k1: int, k2: int) -> int:
    """The first node whose key is >= (k1, k2), or 0."""
    keys = _keys(t).keys
    i = keys.bisect_left((int(k1), int(k2), 0))
    return keys[i][2] if i < len(keys) else 0


def t_next(t: Any, n: int) -> int:
    keys = _keys(t).keys
    i = keys.bisect_left((int(t[n, K1]), int(t[n, K2]), int(n) + 1))
    return keys[i][2] if i < len(keys) else 0


def t_prev(t: Any, n: int) -> int:
    return t_before(t, t[n, K1], t[n, K2], n)


def t_last(t: Any) -> int:
    keys = _keys(t).keys
    return keys[-1][2] if keys else 0


def t_count(t: Any) -> int:
    return len(_keys(t).keys)


def t_max_value(t: Any) -> int:
    """The largest value in the tree, 0 when it is empty."""
    s = _keys(t)
    if s.by_value is None:
        s.by_value = SortedList(s.values.values())
    return max(0, s.by_value[-1]) if s.by_value else 0


def t_first_value_at_least(t: Any, v: int) -> int:
    """The first node in key order whose value is >= v, or 0 (first fit)."""
    if t_max_value(t) < v or not _keys(t).keys:
        return 0
    values = _sets[id(t)].values
    return next((n for _, _, n in _sets[id(t)].keys if values[n] >= v), 0)


def t_prefix(t: Any, k1: int) -> tuple[int, int]:
    """(count, max value) over the nodes whose K1 < k1."""
    s = _keys(t)
    count = s.keys.bisect_left((int(k1),))
    values = s.values
    best = max((values[n] for _, _, n in s.keys.islice(0, count)), default=-1)
    return count, best

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

The treap answers first fit and a prefix's largest value from subtree maxima, which a sorted
list does not keep. A set asked about values keeps its nodes in value order too
(``(VAL, K1, K2, id)``), and each of those two queries walks both orders at once, one step
each, until either walk alone has the answer: O(log n) plus the shorter walk, where a scan of
key order alone was the whole prefix before the answer.
"""

from __future__ import annotations

import weakref
from itertools import zip_longest
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
        # (VAL, K1, K2, id) in order, made when a query about values is first asked
        self.by_value: Any = None


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
        s.by_value.add((val, k1, k2, n))


def t_erase(t: Any, n: int) -> None:
    s = _keys(t)
    n = int(n)
    key = (int(t[n, K1]), int(t[n, K2]), n)
    s.keys.remove(key)
    val = s.values.pop(n)
    if s.by_value is not None:
        s.by_value.remove((val, *key))


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


def _by_value(s: _Keys) -> Any:
    if s.by_value is None:
        s.by_value = SortedList((s.values[n], k1, k2, n) for k1, k2, n in s.keys)
    return s.by_value


def t_max_value(t: Any) -> int:
    """The largest value in the tree, 0 when it is empty."""
    by_value = _by_value(_keys(t))
    return max(0, by_value[-1][0]) if by_value else 0


def t_first_value_at_least(t: Any, v: int) -> int:
    """The first node in key order whose value is >= v, or 0 (first fit)."""
    s = _keys(t)
    v = int(v)
    by_value = _by_value(s)
    if not by_value or by_value[-1][0] < v:
        return 0
    # Key order from the front stops at the first fit; the nodes of value >= v (a bisect in
    # value order) hold it as their least key. Either walk alone answers: stop at the first.
    values = s.values
    fits = by_value.irange(minimum=(v,))
    least: tuple[int, int, int] | None = None
    for key, fit in zip_longest(s.keys, fits):
        if key is not None and values[key[2]] >= v:
            return int(key[2])
        if fit is None:
            break
        if least is None or fit[1:] < least:
            least = fit[1:]
    return int(least[2]) if least is not None else 0


def t_prefix(t: Any, k1: int) -> tuple[int, int]:
    """(count, max value) over the nodes whose K1 < k1."""
    s = _keys(t)
    k1 = int(k1)
    count = s.keys.bisect_left((k1,))
    if count == 0:
        return 0, -1
    # The prefix's values, or value order from the top, which stops at the first node in
    # the prefix: its value is the prefix's largest.
    values = s.values
    best = -1
    prefix = s.keys.islice(0, count)
    for key, top in zip_longest(prefix, reversed(_by_value(s))):
        if top is not None and top[1] < k1:
            return count, int(top[0])
        if key is None:
            break
        best = max(best, values[key[2]])
    return count, best

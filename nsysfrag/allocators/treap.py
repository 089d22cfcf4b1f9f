"""A compiled ordered set (a treap) the allocator models keep their free blocks in.

The treap is a struct of arrays so that numba can compile it: one ``int64[n, ROWS]`` array per
set, node 0 is the empty tree, node ids are the caller's block ids. Keys are ``(K1, K2, id)``
compared in that order, so keys are unique and ties fall to the lower key ``K2`` (an address)
and then to the lower id. Every node also carries a value whose subtree maximum (``AGG``) and a
subtree count (``CNT``) are maintained, which gives first-fit search and prefix queries.

Each query a model calls (``t_insert`` … ``t_prefix``) is compiled code in a kernel and plain
Python in an interpreted twin: :func:`_compiled_as` registers this module's compiled treap as
the function's numba implementation (``numba.extending.overload``, inlined), and the twins,
which call the function itself, run :mod:`nsysfrag.allocators.ordered_set` (a sorted list, the
same answers at a fraction of the interpreted treap's cost).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

import nsysfrag.allocators.ordered_set as python_side
from nsysfrag import jit
from nsysfrag.allocators.base import I64, kernel_step, kernel_step_inline

K1, K2, LT, RT, VAL, AGG, CNT, PRI = range(8)
ROWS = 8


def new_treap(capacity: int, seed: int = 0x5EED) -> I64:
    """An empty treap with room for node ids 1 .. capacity - 1."""
    t = np.zeros((capacity, ROWS), dtype=np.int64)
    t[:, PRI] = np.random.default_rng(seed).integers(1, 1 << 62, capacity, dtype=np.int64)
    t[0, AGG] = -1  # the empty tree's maximum: below every value
    t[0, K1] = 0  # the root lives in the nil node's K1
    return t


@kernel_step_inline
def _before(t: I64, a: int, k1: int, k2: int, kid: int) -> bool:
    """Is key(a) < (k1, k2, kid)?"""
    x = t[a, K1]
    if x != k1:
        return bool(x < k1)
    y = t[a, K2]
    if y != k2:
        return bool(y < k2)
    return a < kid


@kernel_step_inline
def _update(t: I64, a: int) -> None:
    left = t[a, LT]
    right = t[a, RT]
    m = t[a, VAL]
    m = max(m, t[left, AGG])
    m = max(m, t[right, AGG])
    t[a, AGG] = m
    t[a, CNT] = t[left, CNT] + t[right, CNT] + 1


@kernel_step
def _split(t: I64, a: int, k1: int, k2: int, kid: int) -> tuple[int, int]:
    """(keys < (k1, k2, kid), keys >= it) of the subtree ``a``."""
    if a == 0:
        return 0, 0
    if _before(t, a, k1, k2, kid):
        left, right = _split(t, t[a, RT], k1, k2, kid)
        t[a, RT] = left
        _update(t, a)
        return a, right
    left, right = _split(t, t[a, LT], k1, k2, kid)
    t[a, LT] = right
    _update(t, a)
    return left, a


@kernel_step
def _merge(t: I64, a: int, b: int) -> int:
    """Join two subtrees, every key of ``a`` below every key of ``b``."""
    if a == 0:
        return b
    if b == 0:
        return a
    if t[a, PRI] > t[b, PRI]:
        t[a, RT] = _merge(t, t[a, RT], b)
        _update(t, a)
        return a
    t[b, LT] = _merge(t, a, t[b, LT])
    _update(t, b)
    return b


@kernel_step_inline
def _side(t: I64, a: int, n: int) -> int:
    """The subtree of ``a`` that node ``n``'s key falls in: LT or RT."""
    return LT if _before(t, n, t[a, K1], t[a, K2], a) else RT


@kernel_step
def _insert_at(t: I64, a: int, n: int) -> int:
    if a == 0:
        return n
    if t[n, PRI] > t[a, PRI]:
        left, right = _split(t, a, t[n, K1], t[n, K2], n)
        t[n, LT] = left
        t[n, RT] = right
        _update(t, n)
        return n
    side = _side(t, a, n)
    t[a, side] = _insert_at(t, t[a, side], n)
    _update(t, a)
    return a


@kernel_step
def _erase_at(t: I64, a: int, n: int) -> int:
    if a == 0:
        return 0  # not in the tree: the callers keep membership flags, so never reached
    if a == n:
        return _merge(t, t[a, LT], t[a, RT])
    side = _side(t, a, n)
    t[a, side] = _erase_at(t, t[a, side], n)
    _update(t, a)
    return a


@kernel_step
def _t_insert(t: I64, n: int, k1: int, k2: int, val: int) -> None:
    t[n, K1] = k1
    t[n, K2] = k2
    t[n, VAL] = val
    t[n, LT] = 0
    t[n, RT] = 0
    t[n, AGG] = val
    t[n, CNT] = 1
    t[0, K1] = _insert_at(t, t[0, K1], n)


@kernel_step
def _t_erase(t: I64, n: int) -> None:
    """Remove node ``n`` (it must be in the tree, with the keys it was inserted with)."""
    t[0, K1] = _erase_at(t, t[0, K1], n)


@kernel_step
def _around(t: I64, k1: int, k2: int, kid: int) -> tuple[int, int]:
    """(the last node whose key is < (k1, k2, kid), the first whose key is >=), 0 for none:
    one descent finds both, the one from the turns right, the other from the turns left."""
    a = t[0, K1]
    last_before = 0
    first_from = 0
    while a != 0:
        if _before(t, a, k1, k2, kid):
            last_before = a
            a = t[a, RT]
        else:
            first_from = a
            a = t[a, LT]
    return last_before, first_from


@kernel_step
def _t_lower_bound(t: I64, k1: int, k2: int) -> int:
    """The first node whose key is >= (k1, k2), or 0."""
    return _around(t, k1, k2, 0)[1]  # ids start at 1: every (k1, k2, id) is >= (k1, k2, 0)


@kernel_step
def _t_before(t: I64, k1: int, k2: int, kid: int) -> int:
    """The last node whose key is < (k1, k2, kid), or 0."""
    return _around(t, k1, k2, kid)[0]


@kernel_step
def _t_next(t: I64, n: int) -> int:
    """The node right after ``n`` in key order, or 0."""
    return _around(t, t[n, K1], t[n, K2], n + 1)[1]


@kernel_step
def _t_prev(t: I64, n: int) -> int:
    """The node right before ``n`` in key order, or 0."""
    return _t_before(t, t[n, K1], t[n, K2], n)


@kernel_step
def _t_last(t: I64) -> int:
    a = t[0, K1]
    if a == 0:
        return 0
    while t[a, RT] != 0:
        a = t[a, RT]
    return int(a)


@kernel_step
def _t_max_value(t: I64) -> int:
    """The largest value in the tree, 0 when it is empty."""
    m = t[t[0, K1], AGG]
    return int(max(0, m))


@kernel_step
def _t_count(t: I64) -> int:
    return int(t[t[0, K1], CNT])


@kernel_step
def _t_first_value_at_least(t: I64, v: int) -> int:
    """The first node in key order whose value is >= v, or 0 (first fit)."""
    a = t[0, K1]
    if t[a, AGG] < v:
        return 0
    while True:
        left = t[a, LT]
        if left != 0 and t[left, AGG] >= v:
            a = left
        elif t[a, VAL] >= v:
            return int(a)
        else:
            a = t[a, RT]


@kernel_step
def _t_prefix(t: I64, k1: int) -> tuple[int, int]:
    """(count, max value) over the nodes whose K1 < k1."""
    a = t[0, K1]
    count = 0
    best = -1
    while a != 0:
        if t[a, K1] < k1:
            left = t[a, LT]
            count += t[left, CNT] + 1
            best = max(best, t[left, AGG])
            best = max(best, t[a, VAL])
            a = t[a, RT]
        else:
            a = t[a, LT]
    return count, best


Function = TypeVar("Function", bound=Callable[..., Any])


def _compiled_as(kernel: Any, python: Function) -> Function:
    """``python``, which compiled code calls as ``kernel`` (inlined: no call between them)."""

    def implementation(*types: Any) -> Any:
        return kernel.py_func

    # numba holds the typing function's signature to the implementation's.
    implementation.__signature__ = inspect.signature(kernel.py_func)  # type: ignore[attr-defined]

    def register() -> None:  # when numba is imported: a run of interpreted twins never imports it
        from numba.extending import overload

        overload(python, inline="always")(implementation)

    jit.when_made(register)
    return python


t_insert = _compiled_as(_t_insert, python_side.t_insert)
t_erase = _compiled_as(_t_erase, python_side.t_erase)
t_lower_bound = _compiled_as(_t_lower_bound, python_side.t_lower_bound)
t_before = _compiled_as(_t_before, python_side.t_before)
t_next = _compiled_as(_t_next, python_side.t_next)
t_prev = _compiled_as(_t_prev, python_side.t_prev)
t_last = _compiled_as(_t_last, python_side.t_last)
t_max_value = _compiled_as(_t_max_value, python_side.t_max_value)
t_count = _compiled_as(_t_count, python_side.t_count)
t_first_value_at_least = _compiled_as(_t_first_value_at_least, python_side.t_first_value_at_least)
t_prefix = _compiled_as(_t_prefix, python_side.t_prefix)


@kernel_step
def ceil_log2(n: int) -> int:
    k = 0
    while (1 << k) < n:
        k += 1
    return k


# Node ids: each model hands out ids 1, 2, … and recycles the ids of removed nodes through a
# stack. ``counters`` is any record with ``next_id`` (the highest id handed out so far) and
# ``recycled`` (how many ids wait on the stack).


@kernel_step
def take_id(free_ids: I64, counters: Any) -> int:
    """A recycled id if one waits, else the next new one (which may be past the table's end:
    the caller checks)."""
    if counters.recycled > 0:
        counters.recycled -= 1
        return int(free_ids[counters.recycled])
    counters.next_id += 1
    return int(counters.next_id)


@kernel_step
def give_id(free_ids: I64, counters: Any, n: int) -> None:
    """Put id ``n`` back for reuse."""
    free_ids[counters.recycled] = n
    counters.recycled += 1

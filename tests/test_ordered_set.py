"""The interpreted twins' ordered set answers every treap query as a plain scan of the keys in
order would, and as the compiled treap does: random inserts and erases, then each query.

Small by default; ``NSYSFRAG_FUZZ_EXAMPLES`` (or ``--hypothesis-profile fuzz``) runs more."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysfrag.allocators import ordered_set, treap
from tests.conftest import fuzz_examples

CAPACITY = 64  # node ids 1 .. 63
SETTINGS = settings(max_examples=max(60, fuzz_examples()), deadline=None)

# (insert?, node id, K1, K2, value): small ranges, so that keys and values tie often; mostly
# inserts, so that sets grow large enough for either walk of a query to finish first.
_op = st.tuples(
    st.sampled_from([True, True, True, False]),
    st.integers(1, CAPACITY - 1),
    st.integers(0, 12),
    st.integers(0, 4),
    st.integers(-1, 40),
)
_ops = st.lists(_op, max_size=150)
_queries = st.lists(st.integers(-2, 45), min_size=1, max_size=8)


def _linear_first_value_at_least(live: dict[int, tuple[int, int, int]], v: int) -> int:
    """The first-fit scan over the keys in order (what ordered_set did before)."""
    for k1, k2, n in sorted((k1, k2, n) for n, (k1, k2, _) in live.items()):
        if live[n][2] >= v:
            return n
    return 0


def _linear_prefix(live: dict[int, tuple[int, int, int]], k1: int) -> tuple[int, int]:
    inside = [val for key1, _, val in live.values() if key1 < k1]
    return len(inside), max(inside, default=-1)


def _apply(ops: list[tuple[bool, int, int, int, int]], insert: Any, erase: Any) -> dict[int, Any]:
    """The ops on a set through ``insert`` and ``erase``; the live nodes (id -> K1, K2, VAL).
    An insert of a live id or an erase of a dead one is skipped, as no model does either."""
    live: dict[int, tuple[int, int, int]] = {}
    for is_insert, n, k1, k2, val in ops:
        if is_insert and n not in live:
            insert(n, k1, k2, val)
            live[n] = (k1, k2, val)
        elif not is_insert and n in live:
            erase(n)
            del live[n]
    return live


@SETTINGS
@given(ops=_ops, queries=_queries, ask_early=st.booleans())
def test_value_queries_answer_as_the_linear_scan(
    ops: list[tuple[bool, int, int, int, int]], queries: list[int], ask_early: bool
) -> None:
    t = treap.new_treap(CAPACITY)
    if ask_early:  # the value order then follows every insert and erase, else is made late
        ordered_set.t_max_value(t)
    live = _apply(
        ops,
        lambda n, k1, k2, val: ordered_set.t_insert(t, n, k1, k2, val),
        lambda n: ordered_set.t_erase(t, n),
    )
    for q in queries:
        assert ordered_set.t_first_value_at_least(t, q) == _linear_first_value_at_least(live, q)
        assert ordered_set.t_prefix(t, q % 14) == _linear_prefix(live, q % 14)
    values = [val for _, _, val in live.values()]
    assert ordered_set.t_max_value(t) == max([0, *values])
    assert ordered_set.t_count(t) == len(live)


@settings(max_examples=max(20, fuzz_examples() // 3), deadline=None)
@given(ops=_ops, queries=_queries)
def test_value_queries_answer_as_the_compiled_treap(
    ops: list[tuple[bool, int, int, int, int]], queries: list[int]
) -> None:
    """The other way the same queries run: the treap's compiled kernels (subtree maxima)."""
    twin = treap.new_treap(CAPACITY)
    compiled = treap.new_treap(CAPACITY)
    _apply(
        ops,
        lambda n, k1, k2, val: (
            ordered_set.t_insert(twin, n, k1, k2, val),
            treap._t_insert(compiled, n, k1, k2, val),
        ),
        lambda n: (ordered_set.t_erase(twin, n), treap._t_erase(compiled, n)),
    )
    for q in queries:
        assert ordered_set.t_first_value_at_least(twin, q) == treap._t_first_value_at_least(compiled, q)
        assert ordered_set.t_prefix(twin, q % 14) == tuple(treap._t_prefix(compiled, q % 14))
    # A set the compiled side built and the twin side then adopts answers the same too.
    adopted = np.array(compiled)
    for q in queries:
        assert ordered_set.t_first_value_at_least(adopted, q) == treap._t_first_value_at_least(compiled, q)

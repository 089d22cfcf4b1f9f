"""The observed replay's sets of live slots against a plain Python set: after every add or
remove, the member below every probed slot is the largest smaller member, or -1; on sizes that
take one level of words up to four, so every climb and descent between levels is walked."""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysfrag import interpreted
from nsysfrag.models.observed.slot_set import level_starts, set_add, set_below, set_remove
from tests.kernel_modes import both_kernels  # noqa: F401  (every test both ways)

# CI runs the default; set NSYSFRAG_PROPERTY_EXAMPLES=5000 for a deeper local check.
EXAMPLES = int(os.environ.get("NSYSFRAG_PROPERTY_EXAMPLES", "60"))


def _way(kernel: Callable[..., Any], mode: str) -> Callable[..., Any]:
    return interpreted.twin(kernel) if mode == "interpreted" else kernel


@pytest.mark.parametrize(
    ("slots", "levels"), [(1, 1), (32, 1), (33, 2), (1024, 2), (1025, 3), (40_000, 4)]
)
def test_level_starts_give_one_word_per_32_below(
    slots: int, levels: int, both_kernels: str
) -> None:
    starts = _way(level_starts, both_kernels)(slots)
    assert len(starts) == levels + 1
    words = np.diff(starts)
    assert words[0] * 32 >= slots > (words[0] - 1) * 32
    assert words[-1] == 1
    for lower, upper in zip(words[:-1], words[1:], strict=True):
        assert upper * 32 >= lower > (upper - 1) * 32


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    slots=st.sampled_from([1, 31, 32, 33, 1000, 1025, 40_000]),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 2**31)), min_size=1, max_size=80),
    probes=st.lists(st.integers(0, 2**31), min_size=1, max_size=8),
)
def test_below_is_the_largest_smaller_member(
    slots: int, ops: list[tuple[bool, int]], probes: list[int], both_kernels: str
) -> None:
    add, remove, below = (_way(k, both_kernels) for k in (set_add, set_remove, set_below))
    starts = level_starts(slots)
    bits = np.zeros((2, starts[-1]), dtype=np.int64)
    members: list[int] = []
    for is_add, raw in ops:
        # Clustered and spread slots alike: half land near the ends of a word or of the set.
        slot = raw % slots if raw & 1 else min(slots - 1, (raw >> 1) % 70)
        where = bisect.bisect_left(members, slot)
        present = where < len(members) and members[where] == slot
        if is_add and not present:
            add(bits, 1, starts, slot)
            members.insert(where, slot)
        elif not is_add and present:
            remove(bits, 1, starts, slot)
            members.pop(where)
        for probe in [slot, *(p % slots for p in probes)]:
            at = bisect.bisect_left(members, probe)
            assert below(bits, 1, starts, probe) == (members[at - 1] if at else -1)
    assert not bits[0].any()  # another set's row is never written

"""The health rule on hand-made state series (docs/metrics.md, "Health"): materiality, the
basis, and how ties are broken. Each test is one GIVEN/WHEN/THEN on the pure function."""

from __future__ import annotations

import numpy as np

from nsysfrag.analysis.metrics import (
    Health,
    HealthBasis,
    global_frag,
    local_frag,
    material,
    rate_health,
)

C = 1000


def rate(free: list[int], largest: list[int], blocks: list[int]) -> tuple[Health, HealthBasis | None]:
    f = np.asarray(free, dtype=np.int64)
    lg = np.asarray(largest, dtype=np.int64)
    t = np.arange(len(free), dtype=np.int64) * 10
    g, loc = global_frag(f, lg, C), local_frag(f, lg)
    return rate_health(g, loc, np.asarray(blocks, dtype=np.int64), material(f, C), t)


def test_five_percent_free_is_material() -> None:
    """GIVEN exactly 5 % of the device free, in two blocks of 25 (local_frag 0.5)
    WHEN the space is rated
    THEN local_frag counts (the boundary is included) and rates it warn."""
    health, basis = rate([50], [25], [2])
    assert health is Health.WARN
    assert basis == HealthBasis("local_frag", 0.5, 0, 0)


def test_below_five_percent_local_frag_and_free_blocks_do_not_rate() -> None:
    """GIVEN 4.9 % of the device free in 600 holes (local_frag 0.98)
    WHEN the space is rated
    THEN neither local_frag nor free_blocks counts: ok, no basis."""
    assert rate([49], [1], [600]) == (Health.OK, None)


def test_the_basis_is_the_maximum_over_material_moments() -> None:
    """GIVEN local_frag 0.7 while 40 % is free, then 0.95 while 1 % is free
    WHEN the space is rated
    THEN the basis is 0.7 at the first moment: the 0.95 was not material."""
    health, basis = rate([400, 10], [120, 1], [3, 9])
    assert health is Health.CRITICAL
    assert basis is not None and basis.metric == "local_frag"
    assert basis.time_ns == 0 and abs(basis.value - 0.7) < 1e-12


def test_the_metric_whose_maximum_came_first_is_the_basis() -> None:
    """GIVEN local_frag critical (0.75) at the first moment and global_frag critical (0.45)
    only at the second
    WHEN the space is rated
    THEN both are critical and local_frag, whose maximum came first, is the basis."""
    health, basis = rate([200, 900], [50, 450], [4, 2])
    assert health is Health.CRITICAL
    assert basis is not None and (basis.metric, basis.time_ns) == ("local_frag", 0)


def test_at_the_same_moment_global_frag_comes_first() -> None:
    """GIVEN global_frag 0.45 and local_frag 0.9 critical at the same moment
    WHEN the space is rated
    THEN global_frag is the basis (the table order)."""
    health, basis = rate([500], [50], [10])
    assert health is Health.CRITICAL
    assert basis is not None and basis.metric == "global_frag" and basis.time_ns == 0


def test_a_worse_level_wins_over_an_earlier_one() -> None:
    """GIVEN local_frag warn (0.5) first, then free_blocks critical (501) later, 60 % free
    WHEN the space is rated
    THEN the level is critical and its basis free_blocks, an int."""
    health, basis = rate([600, 600], [300, 590], [2, 501])
    assert health is Health.CRITICAL
    assert basis == HealthBasis("free_blocks", 501, 10, 1)
    assert isinstance(basis.value, int)


def test_the_first_moment_of_an_equal_maximum() -> None:
    """GIVEN global_frag 0.25 twice
    WHEN the space is rated
    THEN the basis is the first of the two moments."""
    health, basis = rate([900, 100, 900], [650, 100, 650], [2, 1, 2])
    assert health is Health.WARN
    assert basis is not None and (basis.metric, basis.time_ns) == ("global_frag", 0)

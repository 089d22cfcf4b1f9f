"""Every policy ``whatif`` can replay, in the order reports and ``--help`` list them.

Adding a policy: write its model as a module that defines a
:class:`~nsysfrag.allocators.family.PolicyFamily`, and add that family to :data:`FAMILIES`
(and to :data:`DEFAULT_POLICIES` when every ``whatif`` should run it).
"""

from __future__ import annotations

from nsysfrag.allocators import arena, buddy, cuda_async, driver, heap, slab, small_pool, torch
from nsysfrag.allocators.family import PolicyFamily

FAMILIES: tuple[PolicyFamily, ...] = (
    torch.FAMILY,
    cuda_async.FAMILY,
    heap.BEST_FIT_FAMILY,
    heap.FIRST_FIT_FAMILY,
    buddy.FAMILY,
    slab.FAMILY,
    arena.FAMILY,
    small_pool.FAMILY,
    driver.FAMILY,
)

# What runs without --policy: every family (whatif adds the torch settings each input
# suggests, nsysfrag.models.tried_settings, on top of the run's own).
DEFAULT_POLICIES = (
    "torch",
    "cuda-async",
    "best-fit",
    "first-fit",
    "buddy",
    "slab",
)

# What runs without --policy on an nsys trace of a program that calls the driver directly: the
# remedies analyze's advice names for such a program (a stream-ordered pool, per-size free
# lists, one arena up front, each for every request; and a pool of their own for the buffers
# under a page, the advice itself), against the recorded driver behaviour (``driver``).
DRIVER_REMEDIES = ("cuda-async", "slab", "arena", "small-pool")

_BY_NAME = {f.name: f for f in FAMILIES}
_BY_SPELLING = {spelling.lower(): f for f in FAMILIES for spelling in (f.name, *f.aliases)}


def family(name: str) -> PolicyFamily:
    """The family called ``name`` (its canonical name)."""
    return _BY_NAME[name]


def lookup(spelling: str) -> PolicyFamily | None:
    """The family ``--policy`` means by ``spelling`` (a name or an alias, any case)."""
    return _BY_SPELLING.get(spelling.lower())

"""Every policy ``whatif`` can replay, in the order reports and ``--help`` list them.

Adding a policy: write its model as a module that defines a
:class:`~nsysfrag.allocators.family.PolicyFamily`, and add that family to :data:`FAMILIES`
(and to :data:`DEFAULT_POLICIES` when every ``whatif`` should run it).
"""

from __future__ import annotations

# Each family from its own module, never through the package: the package's __init__ re-exports
# this registry, so importing the package from here would close a circle.
from nsysfrag.allocators.arena import FAMILY as ARENA
from nsysfrag.allocators.buddy import FAMILY as BUDDY
from nsysfrag.allocators.cuda_async import FAMILY as CUDA_ASYNC
from nsysfrag.allocators.driver import FAMILY as DRIVER
from nsysfrag.allocators.family import PolicyFamily
from nsysfrag.allocators.heap import BEST_FIT_FAMILY, FIRST_FIT_FAMILY
from nsysfrag.allocators.slab import FAMILY as SLAB
from nsysfrag.allocators.small_pool import FAMILY as SMALL_POOL
from nsysfrag.allocators.torch import FAMILY as TORCH

FAMILIES: tuple[PolicyFamily, ...] = (
    TORCH,
    CUDA_ASYNC,
    BEST_FIT_FAMILY,
    FIRST_FIT_FAMILY,
    BUDDY,
    SLAB,
    ARENA,
    SMALL_POOL,
    DRIVER,
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

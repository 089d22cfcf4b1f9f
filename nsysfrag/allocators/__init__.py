"""Allocator models a request stream can be replayed through (``nsysfrag whatif``).

``parse_policy("torch:expandable_segments=True")`` names a model; ``Policy.simulate`` replays a
:class:`~nsysfrag.allocators.base.RequestStream` through it. One module (or package) per
family — ``torch`` (PyTorch's caching allocator, configurable as PYTORCH_CUDA_ALLOC_CONF),
``cuda_async`` (a cudaMallocAsync-style pool), ``heap`` (best fit, first fit), ``buddy``,
``slab`` and ``arena`` (one arena reserved up front), and ``driver`` (the recorded
behaviour an nsys trace's baseline is) — each defining a :class:`~nsysfrag.allocators.family.PolicyFamily`; ``registry``
lists them, ``policy`` parses ``--policy``, ``base`` and ``event_loop`` hold what the models
share, ``treap`` the ordered set they keep free blocks in.
"""

from __future__ import annotations

from nsysfrag.allocators.base import RequestStream, SimResult
from nsysfrag.allocators.family import PolicyFamily
from nsysfrag.allocators.policy import Policy, parse_policy
from nsysfrag.allocators.registry import DEFAULT_POLICIES, DRIVER_REMEDIES, FAMILIES
from nsysfrag.allocators.torch import InitialLayout, TorchConfig

__all__ = [
    "DEFAULT_POLICIES",
    "DRIVER_REMEDIES",
    "FAMILIES",
    "InitialLayout",
    "Policy",
    "PolicyFamily",
    "RequestStream",
    "SimResult",
    "TorchConfig",
    "parse_policy",
]

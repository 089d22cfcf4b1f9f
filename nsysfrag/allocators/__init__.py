"""Allocator models a request stream can be replayed through (``nsysfrag whatif``).

``parse_policy("torch:expandable_segments=True")`` names a model; ``Policy.simulate`` replays a
:class:`~nsysfrag.allocators.base.RequestStream` through it. One module per family:
``torch_caching`` (PyTorch's caching allocator, configurable as PYTORCH_CUDA_ALLOC_CONF),
``cuda_async`` (a cudaMallocAsync-style pool), ``heap`` (best fit, first fit), ``buddy`` and
``slab``; ``base`` holds what they share.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nsysfrag.allocators.base import RequestStream, SimResult
from nsysfrag.allocators.buddy import simulate_buddy
from nsysfrag.allocators.cuda_async import simulate_cuda_async
from nsysfrag.allocators.heap import BEST_FIT, FIRST_FIT, simulate_heap
from nsysfrag.allocators.slab import simulate_slab
from nsysfrag.allocators.torch_caching import InitialLayout, TorchConfig, simulate_torch
from nsysfrag.errors import InputError

TORCH = "torch"
FAMILIES = ("torch", "cuda-async", "best-fit", "first-fit", "buddy", "slab")
_ALIASES = {
    "torch": "torch",
    "pytorch": "torch",
    "native": "torch",
    "cuda-async": "cuda-async",
    "cuda_async": "cuda-async",
    "cudamallocasync": "cuda-async",
    "best-fit": "best-fit",
    "best_fit": "best-fit",
    "bestfit": "best-fit",
    "first-fit": "first-fit",
    "first_fit": "first-fit",
    "firstfit": "first-fit",
    "buddy": "buddy",
    "slab": "slab",
}
DEFAULT_POLICIES = (
    "torch",
    "torch:expandable_segments=True",
    "cuda-async",
    "best-fit",
    "first-fit",
    "buddy",
    "slab",
)
DESCRIPTIONS = {
    "torch": "PyTorch caching allocator",
    "cuda-async": "stream-ordered pool (cudaMallocAsync)",
    "best-fit": "best-fit heap (reference)",
    "first-fit": "first-fit heap (reference)",
    "buddy": "binary buddy (reference)",
    "slab": "size-class slabs (reference)",
}


@dataclass(frozen=True)
class Policy:
    """A named allocator model and its options."""

    family: str
    torch: TorchConfig | None = None
    label: str | None = None  # a name to show instead of the canonical one

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        if self.family == TORCH and self.torch is not None and self.torch.given:
            return "torch:" + ",".join(f"{k}={v}" for k, v in self.torch.given.items())
        return self.family

    @property
    def description(self) -> str:
        return DESCRIPTIONS[self.family]

    @property
    def options(self) -> dict[str, object]:
        if self.family == TORCH:
            return (self.torch or TorchConfig()).options()
        return {}

    @property
    def actionable(self) -> bool:
        """Can a PyTorch user switch to it with PYTORCH_CUDA_ALLOC_CONF?"""
        return self.family in (TORCH, "cuda-async")

    def alloc_conf(self) -> str | None:
        """The PYTORCH_CUDA_ALLOC_CONF that selects this policy ('' = the defaults)."""
        if self.family == TORCH:
            return (self.torch or TorchConfig()).conf_string()
        if self.family == "cuda-async":
            return "backend:cudaMallocAsync"
        return None

    def simulate(
        self,
        stream: RequestStream,
        capacity_bytes: int,
        initial: InitialLayout | None = None,
    ) -> SimResult:
        if self.family == TORCH:
            return simulate_torch(stream, capacity_bytes, self.torch or TorchConfig(), initial)
        if self.family == "cuda-async":
            return simulate_cuda_async(stream, capacity_bytes)
        if self.family == "best-fit":
            return simulate_heap(stream, capacity_bytes, BEST_FIT)
        if self.family == "first-fit":
            return simulate_heap(stream, capacity_bytes, FIRST_FIT)
        if self.family == "buddy":
            return simulate_buddy(stream, capacity_bytes)
        return simulate_slab(stream, capacity_bytes)


def parse_policy(text: str) -> Policy:
    """``torch``, ``torch:expandable_segments=True,max_split_size_mb=128``, ``best-fit`` …"""
    m = re.fullmatch(r"\s*([A-Za-z_-]+)\s*(?:[:=](.*))?", text, flags=re.DOTALL)
    family = _ALIASES.get(m.group(1).lower()) if m else None
    if m is None or family is None:
        raise InputError(
            f"--policy {text!r}: unknown policy; choose from {', '.join(FAMILIES)}"
            " (torch takes PYTORCH_CUDA_ALLOC_CONF options: torch:expandable_segments=True)"
        )
    rest = (m.group(2) or "").strip()
    if family != TORCH:
        if rest:
            raise InputError(f"--policy {text!r}: {family} takes no options")
        return Policy(family)
    return Policy(TORCH, TorchConfig.parse(rest) if rest else TorchConfig())


__all__ = [
    "DEFAULT_POLICIES",
    "FAMILIES",
    "InitialLayout",
    "Policy",
    "RequestStream",
    "SimResult",
    "TorchConfig",
    "parse_policy",
]

"""A policy: a family and its options, as ``--policy torch:expandable_segments=True`` names it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from nsysfrag.allocators.base import RequestStream, SimResult
from nsysfrag.allocators.family import PolicyFamily, PolicyOptions
from nsysfrag.allocators.registry import FAMILIES, family, lookup
from nsysfrag.errors import InputError


@dataclass(frozen=True)
class Policy:
    """A named allocator model and its options."""

    family: str
    options: PolicyOptions | None = None  # None: the family takes none, or its defaults
    label: str | None = None  # a name to show instead of the canonical one

    @property
    def spec(self) -> PolicyFamily:
        return family(self.family)

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        written = self.options.label() if self.options is not None else ""
        return f"{self.family}:{written}" if written else self.family

    @property
    def description(self) -> str:
        return self.spec.description

    @property
    def option_summary(self) -> dict[str, object]:
        """Every effective option, for the JSON report ({} for a family without options)."""
        spec = self.spec
        if spec.parse_options is None:
            return {}
        return (self.options or spec.parse_options("")).summary()

    @property
    def actionable(self) -> bool:
        """Can a PyTorch user switch to it with PYTORCH_CUDA_ALLOC_CONF?"""
        return self.spec.actionable

    def alloc_conf(self) -> str | None:
        """The PYTORCH_CUDA_ALLOC_CONF that selects this policy ('' = the defaults)."""
        conf = self.spec.alloc_conf
        return None if conf is None else conf(self.options)

    def same_settings(self, other: Policy) -> bool:
        """The same family with the same effective options (whatever their names)."""
        if self.family != other.family:
            return False
        parse = self.spec.parse_options
        if parse is None:
            return True
        return (self.options or parse("")) == (other.options or parse(""))

    def simulate(self, stream: RequestStream, capacity_bytes: int) -> SimResult:
        return self.spec.simulate(stream, capacity_bytes, self.options)


def parse_policy(text: str) -> Policy:
    """``torch``, ``torch:expandable_segments=True,max_split_size_mb=128``, ``best-fit`` …"""
    m = re.fullmatch(r"\s*([A-Za-z_-]+)\s*(?:[:=](.*))?", text, flags=re.DOTALL)
    spec = lookup(m.group(1)) if m else None
    if m is None or spec is None:
        raise InputError(
            f"--policy {text!r}: unknown policy; choose from"
            f" {', '.join(f.name for f in FAMILIES)}"
            " (torch takes PYTORCH_CUDA_ALLOC_CONF options: torch:expandable_segments=True)"
        )
    rest = (m.group(2) or "").strip()
    if spec.parse_options is None:
        if rest:
            raise InputError(f"--policy {text!r}: {spec.name} takes no options")
        return Policy(spec.name)
    return Policy(spec.name, spec.parse_options(rest))

"""What makes an allocator model a ``whatif`` policy: :class:`PolicyFamily`.

A family names a model (``torch``, ``best-fit`` …), the other spellings ``--policy`` accepts,
a description for the reports, the replay itself, and — for a model a PyTorch user can switch
to — the PYTORCH_CUDA_ALLOC_CONF that selects it. A family with options (``torch``) parses
them into a :class:`PolicyOptions` value. The list of families is
:mod:`nsysfrag.allocators.registry`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from nsysfrag.allocators.base import RequestStream, SimResult


class PolicyOptions(Protocol):
    """A family's options (e.g. PYTORCH_CUDA_ALLOC_CONF settings for ``torch``)."""

    def label(self) -> str:
        """The options as the user wrote them ('' for the defaults): part of the policy name."""

    def summary(self) -> dict[str, object]:
        """Every effective option, for the JSON report."""

    def conf_string(self) -> str:
        """The PYTORCH_CUDA_ALLOC_CONF that sets them ('' for the defaults)."""


# simulate(stream, capacity_bytes, options) -> SimResult; options are None or parse_options'
Simulate = Callable[[RequestStream, int, Any], SimResult]


@dataclass(frozen=True)
class PolicyFamily:
    """One allocator model, as ``whatif`` offers it."""

    name: str
    aliases: tuple[str, ...]  # other spellings --policy accepts (case does not matter)
    description: str
    simulate: Simulate
    # The PYTORCH_CUDA_ALLOC_CONF that selects the policy ('' = PyTorch's defaults), or None
    # for a reference model no PyTorch user can switch to (quoted for scale, never recommended).
    alloc_conf: Callable[[PolicyOptions | None], str] | None = None
    # KEY=VALUE,… after ``family:`` -> options ('' gives the defaults); None: takes no options.
    parse_options: Callable[[str], PolicyOptions] | None = None

    @property
    def actionable(self) -> bool:
        """Can a PyTorch user switch to it with PYTORCH_CUDA_ALLOC_CONF?"""
        return self.alloc_conf is not None

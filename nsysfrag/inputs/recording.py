"""What every input gives and takes: the options of a reading (:class:`InputOptions`), its
result (:class:`Recording`: the source and one :class:`~nsysfrag.models.space.RecordedSpace`
per address space), an input format (:class:`InputFormat`) and the bound on spaces each input
keeps. The registry (``nsysfrag.inputs``) and every reader look down to this module."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nsysfrag import limits
from nsysfrag.errors import InputError
from nsysfrag.events import InputCounts, ProgressCallback, SourceInfo
from nsysfrag.models.space import RecordedSpace


@dataclass(frozen=True, slots=True)
class InputOptions:
    """What the user asked of the reading and the models."""

    capacity_bytes: int | None = None  # device memory per space, overriding what the input says
    granularity_bytes: int = 512  # allocation rounding, where the input does not record it
    page_bytes: int = 2 << 20  # the driver's page, where the model maps blocks onto pages
    progress: ProgressCallback | None = None


@dataclass(frozen=True)
class Recording:
    """Everything an input gives the analysis."""

    source: SourceInfo
    model: str  # the name of the model its spaces are replayed in
    granularity_bytes: int
    spaces: list[RecordedSpace]
    warnings: list[str] = field(default_factory=list)
    counts: InputCounts = field(default_factory=InputCounts)
    # Said (after the path) when no space has a point to analyze.
    nothing_to_analyze: str = "there is nothing to analyze"
    page_bytes: int | None = None  # the driver's page, where the model maps blocks onto pages


@dataclass(frozen=True)
class InputFormat:
    """One kind of input: how to recognise its files and read them."""

    name: str
    description: str  # for messages: "a PyTorch memory snapshot"
    matches: Callable[[Path], bool]  # is this path one of ours? (cheap: a suffix, a few bytes)
    open: Callable[[Path, InputOptions], Recording]
    # Load the compiled code reading this file will need while the file is read (or nothing).
    warm_up: Callable[[Path], None] | None = None


def check_space_count(path: str, count: int, what: str) -> None:
    """Refuse an input of more than ``limits.MAX_SPACES`` spaces (``what``: "processes ×
    devices"): each costs its own replay, analysis and report section, so a small hostile file
    naming 100,000 of them would run for minutes."""
    most = int(limits.MAX_SPACES.value())
    if count > most:
        raise InputError(
            f"{path}: {count:,} address spaces ({what}), more than the {most:,} nsysfrag reads"
            f" from one input (each is replayed, analyzed and reported on its own); set"
            f" {limits.MAX_SPACES.env}={count} to read it anyway"
        )

"""The inputs nsysfrag reads, and the registry that picks one for a path.

Every input turns its file into a :class:`Recording`: one :class:`RecordedSpace` per address
space, each with its events in the one event model (:mod:`nsysfrag.events`) and the model that
places its blocks, plus a :class:`~nsysfrag.events.SourceInfo` that says how to speak of it.
Nothing downstream knows which input it came from. To add an input, write a module with an
``open`` function and :func:`register` it (docs/ARCHITECTURE.md walks through one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nsysfrag import limits
from nsysfrag.errors import InputError
from nsysfrag.events import AllocationEvents, InputCounts, ProgressCallback, SourceInfo

if TYPE_CHECKING:
    from nsysfrag.models import Model


@dataclass(frozen=True, slots=True)
class InputOptions:
    """What the user asked of the reading and the models."""

    capacity_bytes: int | None = None  # device memory per space, overriding what the input says
    granularity_bytes: int = 512  # allocation rounding, where the input does not record it
    page_bytes: int = 2 << 20  # the driver's page, where the model maps blocks onto pages
    progress: ProgressCallback | None = None


@dataclass(frozen=True)
class RecordedSpace:
    """One address space, as the input recorded it."""

    pid: int
    device: int
    device_name: str
    process_name: str | None
    events: AllocationEvents
    model: Model
    capacity_bytes: int | None  # None: the model estimates it from the events
    # Where capacity_bytes came from (nsysfrag.capacity.SOURCES): "--capacity", or the device's
    # own figure; a model that estimates C says where its estimate came from itself.
    capacity_source: str = "device"
    other_kind_events: int = 0  # events of memory the model does not place (pinned, managed)
    timestamps: bool = True  # False: the events' times are entry numbers, 1 ns apart


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


_FORMATS: list[InputFormat] = []


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


def formats() -> list[InputFormat]:
    """The registered formats, in the order they are tried; the nsys export comes last: it
    takes any file no other format claims, and says what is wrong with one that is not an
    export."""
    if not _FORMATS:  # the built-in formats, on first use (their readers load on use too)
        from nsysfrag.inputs.nsys import NSYS_EXPORT
        from nsysfrag.inputs.torch_snapshot import TORCH_SNAPSHOT

        _FORMATS.extend([TORCH_SNAPSHOT, NSYS_EXPORT])
    return _FORMATS


def register(fmt: InputFormat) -> None:
    """Add an input format, tried before those already registered."""
    formats().insert(0, fmt)


def unregister(name: str) -> None:
    formats()[:] = [f for f in formats() if f.name != name]


def format_of(path: Path) -> InputFormat:
    """The format that claims ``path``."""
    found = formats()
    return next((f for f in found if f.matches(path)), found[-1])


def open_input(path: Path, options: InputOptions | None = None) -> Recording:
    """Read ``path`` with the format that claims it."""
    return format_of(path).open(path, options or InputOptions())

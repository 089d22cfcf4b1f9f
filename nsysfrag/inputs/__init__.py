"""The inputs nsysfrag reads, and the registry that picks one for a path.

Every input turns its file into a :class:`Recording`: one :class:`RecordedSpace` per address
space, each with its events in the one event model (:mod:`nsysfrag.events`) and the model that
places its blocks, plus a :class:`~nsysfrag.events.SourceInfo` that says how to speak of it.
Nothing downstream knows which input it came from. To add an input, write a module with an
``open`` function and :func:`register` it (docs/ARCHITECTURE.md walks through one).
"""

from __future__ import annotations

from pathlib import Path

# re-exported: what callers of the inputs name, under the package's name
from nsysfrag.inputs.recording import InputFormat as InputFormat
from nsysfrag.inputs.recording import InputOptions as InputOptions
from nsysfrag.inputs.recording import Recording as Recording
from nsysfrag.inputs.recording import check_space_count as check_space_count
from nsysfrag.models.space import RecordedSpace as RecordedSpace

_FORMATS: list[InputFormat] = []


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

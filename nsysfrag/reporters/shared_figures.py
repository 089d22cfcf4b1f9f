"""Each figure of a space built once while several reports draw it (``--html`` and ``--png``).

Outside :func:`sharing` every report builds its own figures, as before. Inside it, the first
report to ask for a space's figure builds it and the others draw the same ``Figure``:
``figure_axes.save_figure`` puts a figure back as it was built after every save, so the second
format's file is byte for byte what a freshly built figure gives. Building is about a fifth of
the figures' time (the address map paints its image and lays itself out once to measure it).

This module imports no matplotlib, so the pipeline can open the scope on every run without
loading it for a run that draws nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from nsysfrag.analysis import SpaceAnalysis

# (id of the space, figure name) -> (the space, kept alive so its id is not reused, the figure)
_Memo = dict[tuple[int, str], tuple["SpaceAnalysis", "Figure"]]
_memo: ContextVar[_Memo | None] = ContextVar("nsysfrag_shared_figures", default=None)


@contextmanager
def sharing(enabled: bool = True) -> Iterator[None]:
    """Within: :func:`figure` builds each (space, name) once; the figures are let go on exit.
    ``enabled=False`` is a plain scope (one report drawing: nothing to share, nothing kept)."""
    if not enabled or _memo.get() is not None:
        yield
        return
    token = _memo.set({})
    try:
        yield
    finally:
        _memo.reset(token)


def figure(space: SpaceAnalysis, name: str, build: Callable[[SpaceAnalysis], Figure]) -> Figure:
    """``build(space)``, or inside :func:`sharing` the figure an earlier report built."""
    memo = _memo.get()
    if memo is None:
        return build(space)
    key = (id(space), name)
    if key not in memo:
        memo[key] = (space, build(space))
    return memo[key][1]

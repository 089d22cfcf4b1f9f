"""What every figure of a space shares: size, colours, health bands, byte and time axes,
titles and legends. The figures themselves are in ``figures`` and ``address_map``.

Time runs on an x axis of seconds since the input's first event, the time base of every table
and sentence of a report (``analysis.time_base``): :func:`seconds_since_start` and
:func:`time_axis` are the one place figures make that choice.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.text import Text
from matplotlib.textpath import TextToPath
from matplotlib.ticker import FixedFormatter, Formatter, Locator, MaxNLocator

from nsysfrag.analysis import SpaceAnalysis
from nsysfrag.analysis.metrics import F64, format_bytes
from nsysfrag.analysis.time_base import axis_label, since_start_array, since_start_s
from nsysfrag.printable import printable

FIGSIZE_IN = (10.0, 4.5)
DPI = 100

# One colour per quantity, the same in every figure.
GLOBAL_COLOR = "#1f77b4"
LOCAL_COLOR = "#ff7f0e"
LIVE_COLOR = "#2ca02c"
FREE_COLOR = "#9467bd"
LARGEST_FREE_COLOR = "#17becf"
FREE_BLOCKS_COLOR = "#3b3b3b"
CAPACITY_COLOR = "#000000"
COUNT_COLOR = "#5f6b7a"
BYTES_COLOR = "#c9a227"
HOLE_COLOR = "#c44e52"
WARN_BAND = "#fff3b0"
CRITICAL_BAND = "#ffd6d6"
OTHER_SITES_COLOR = "#c8c8c8"
# Sites: ColorBrewer Dark2 without its grey (kept for "other sites") plus two Paired tones, so
# no site takes the global (blue) or local (orange) colour.
SITE_COLORS = (
    "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e",
    "#e6ab02", "#a6761d", "#a6cee3", "#fb9a99",
)  # fmt: skip

# The health thresholds (docs/metrics.md, "Health"), in the units the figures draw.
GLOBAL_WARN_PCT, GLOBAL_CRITICAL_PCT = 20.0, 40.0
LOCAL_WARN_PCT, LOCAL_CRITICAL_PCT = 30.0, 60.0
FREE_BLOCKS_WARN, FREE_BLOCKS_CRITICAL = 100, 500

TOP_SITES = len(SITE_COLORS)
TOP_HOTSPOT_SITES = 10
SITE_LABEL_CHARS = 48

TITLE_PT = 11.0
TITLE_MARGIN_PT = 4.0  # kept clear at each side of a title line
TITLE_MAX_CHARS = 400  # of one title line, before wrapping
TITLE_ID = "figure-title"  # the title's group in an SVG (the HTML page prefixes it per figure)
# Marks a Text whose line breaks are the figure's own layout (its lines were escaped one by one).
_OWN_BREAKS = "_nsysfrag_own_breaks"

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


# ---------------------------------------------------------------- axes helpers


def _binary_unit(magnitude: float) -> tuple[float, str]:
    """The largest binary unit not above ``magnitude`` (bytes for anything under 1 KiB)."""
    scale, name = 1.0, _BINARY_UNITS[0]
    for power, unit in enumerate(_BINARY_UNITS):
        if magnitude >= float(1 << (10 * power)):
            scale, name = float(1 << (10 * power)), unit
    return scale, name


def _view_unit(axis: object) -> tuple[float, str]:
    vmin, vmax = axis.get_view_interval()  # type: ignore[attr-defined]
    return _binary_unit(max(abs(float(vmin)), abs(float(vmax))))


class BytesLocator(Locator):
    """Round ticks in the binary unit of the axis range: 0, 20, 40 GiB rather than 21.47 GB."""

    def __init__(self) -> None:
        self._inner = MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10])

    def __call__(self) -> Sequence[float]:
        vmin, vmax = self.axis.get_view_interval()  # type: ignore[union-attr]
        return self.tick_values(vmin, vmax)

    def tick_values(self, vmin: float, vmax: float) -> Sequence[float]:
        scale, _ = _binary_unit(max(abs(vmin), abs(vmax)))
        self._inner.set_axis(self.axis)
        ticks = [float(t) * scale for t in self._inner.tick_values(vmin / scale, vmax / scale)]
        return self.raise_if_exceeds(ticks)


class BytesFormatter(Formatter):
    """Tick labels in the binary unit of the axis range: ``20 GiB``, ``512 MiB``."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        scale, unit = _view_unit(self.axis)
        return f"{x / scale:.4g} {unit}"


def bytes_axis(axis: object) -> None:
    axis.set_major_locator(BytesLocator())  # type: ignore[attr-defined]
    axis.set_major_formatter(BytesFormatter())  # type: ignore[attr-defined]


def new_figure(ncols: int = 1) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    fig.set_dpi(DPI)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def space_label(space: SpaceAnalysis) -> str:
    """``pid 3310 (python3) · device 0 (NVIDIA H100 80GB HBM3, 79.65 GiB)``."""
    process = f" ({space.process_name})" if space.process_name else ""
    label = (
        f"pid {space.pid}{process} · device {space.device}"
        f" ({space.device_name}, {format_bytes(space.capacity_bytes)})"
    )
    return label


def figure_title(fig: Figure, what: str, space: SpaceAnalysis, note: str = "") -> None:
    extra = f" · {note}" if note else ""
    model = space.source.words.figure_title
    suptitle_lines(fig, f"{what} · {model}{extra}", space_label(space))


def suptitle_lines(fig: Figure, *lines: str) -> Text:
    """The figure's title, ``lines`` one under another. Each line is escaped here, so the breaks
    between them are the figure's own and stay breaks, while a line break inside a name from the
    input shows as ``\\n`` (:func:`drawing` escapes every other text whole). Each line is wrapped
    at spaces to the figure's width, so a long device name is never clipped at both ends."""
    title = fig.suptitle("", fontsize=TITLE_PT, gid=TITLE_ID)
    width_pt = fig.get_figwidth() * 72.0 - 2 * TITLE_MARGIN_PT
    drawn = [part for line in lines for part in wrapped(_shortened(printable(line)), width_pt)]
    title.set_text("\n".join(drawn))
    setattr(title, _OWN_BREAKS, True)
    return title


def _shortened(line: str) -> str:
    # A name from the input can be megabytes: a title keeps a few lines' worth of it.
    return line if len(line) <= TITLE_MAX_CHARS else line[: TITLE_MAX_CHARS - 1] + "…"


def wrapped(line: str, width_pt: float, size_pt: float = TITLE_PT) -> list[str]:
    """``line`` broken at spaces into lines at most ``width_pt`` wide as drawn in the figures'
    font (a word wider than that alone is broken where it must be). Measured here rather than
    with matplotlib's ``wrap=True``, whose measuring parses ``$…$`` as math even when the text
    asks not to be, so a site named ``$\\x$`` would fail the figure."""
    measure, font = TextToPath(), FontProperties(size=size_pt)

    def fits(text: str) -> bool:
        with _no_glyph_warnings():
            return measure.get_text_width_height_descent(text, font, ismath=False)[0] <= width_pt

    out: list[str] = []
    current = ""
    for word in line.split(" "):
        candidate = f"{current} {word}" if current else word
        if fits(candidate):
            current = candidate
            continue
        if current:
            out.append(current)
        while not fits(word) and len(word) > 1:
            cut = next((n for n in range(len(word) - 1, 1, -1) if fits(word[:n])), 1)
            out.append(word[:cut])
            word = word[cut:]
        current = word
    out.append(current)
    return out


def seconds_since_start(space: SpaceAnalysis) -> F64:
    return since_start_array(space, space.timeline.time_ns)


def time_axis(ax: Axes, space: SpaceAnalysis) -> None:
    """x from the space's first event to its last, on the report's one time base."""
    t = space.timeline.time_ns
    first, last = since_start_s(space, int(t[0])), since_start_s(space, int(t[-1]))
    ax.set_xlim(first, last if last > first else first + 1.0)
    ax.set_xlabel(axis_label(space))


def zoomed_top(highest: float, full: float) -> float:
    """The y limit: a little above the highest value, so a flat line near 0 still shows its
    shape; never above ``full``."""
    return min(full, max(highest * 1.15, full / 50.0))


def below_bands(ax: Axes, text: str) -> None:
    # The bands are drawn but out of view: say so, or a zoomed-in plot looks alarming.
    ax.text(
        0.01, 0.97, f"ok: {text}", transform=ax.transAxes, ha="left", va="top", fontsize=8,
        color="#2e7d32",
        bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "#2e7d32", "alpha": 0.9},
    )  # fmt: skip


def say_empty(ax: Axes, text: str) -> None:
    ax.text(
        0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=11,
        color="#555555",
    )  # fmt: skip
    ax.set_xticks([])
    ax.set_yticks([])


def legend_right(ax: Axes, **kw: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, **kw)


def count_of(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def short_site(site: str) -> str:
    if len(site) <= SITE_LABEL_CHARS:
        return site
    return "…" + site[-(SITE_LABEL_CHARS - 1) :]


# ---------------------------------------------------------------- saving


def save_figure(fig: Figure, target: Any, **savefig: Any) -> None:
    """``fig.savefig(target, **savefig)`` as :func:`drawing` draws: text from an input made
    safe for matplotlib, and no warning of a missing glyph. The figure is left as it was laid
    out before (:func:`_as_built`), so it can be saved again, in another format, with the bytes
    a freshly built figure would give (``shared_figures``)."""
    with drawing(fig), _as_built(fig):
        fig.savefig(target, **savefig)


@contextmanager
def _as_built(fig: Figure) -> Iterator[None]:
    # The constrained layout of a save moves the axes and the title, and the next save's
    # layout starts from where they are: its tick counts, and so its margins and pixels, would
    # differ from a fresh figure's (measured on the samples: the second of an SVG and a PNG
    # differed for most figures; with these two put back, for none: tests/test_figures.py).
    axes = [(ax, ax.get_position(original=True).frozen(), ax.get_position().frozen())
            for ax in fig.axes]  # fmt: skip
    title = fig._suptitle  # the Text itself; get_suptitle() gives only its string
    placed = (title.get_position(), title.get_verticalalignment()) if title is not None else None
    try:
        yield
    finally:
        # Not set_position, which also takes the axes out of the layout.
        for ax, original, active in axes:
            ax._set_position(original, which="original")
            ax._set_position(active, which="active")
        if title is not None and placed is not None:
            title.set_position(placed[0])
            title.set_verticalalignment(placed[1])


@contextmanager
def drawing(fig: Figure) -> Iterator[Figure]:
    """``fig`` ready to draw (each draw, a save or a layout, goes through here): every text
    and tick label escaped as a terminal shows it (``printable``: a site or frame named with
    ESC or BEL otherwise drew "Glyph 27 missing" warnings, raw character and all, onto stderr,
    and made invalid SVG), read as plain text, never as ``$math$`` (which a name like
    ``$\\foo$`` would fail to parse). A glyph a font lacks (a CJK name) draws as a box without a
    warning: stderr is one line."""
    for text in fig.findobj(Text):
        raw = str(text.get_text())
        if getattr(text, _OWN_BREAKS, False):
            text.set_text("\n".join(printable(line) for line in raw.split("\n")))
        else:
            text.set_text(printable(raw))
        text.set_parse_math(False)
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            formatter = axis.get_major_formatter()
            if isinstance(formatter, FixedFormatter):
                formatter.seq = [printable(str(s)) for s in formatter.seq]
            for label in axis.get_ticklabels(which="both"):
                label.set_parse_math(False)
    with _no_glyph_warnings():
        yield fig


@contextmanager
def _no_glyph_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from")
        yield

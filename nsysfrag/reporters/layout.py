"""Terminal layout that holds at any width, from a wide terminal down to an 80-column CI log.

- :class:`Prose` wraps a paragraph at spaces but never between a figure and its unit
  (``1.38 GiB``, ``12.5 %``, ``0.564 s``), so a number is never on one line and its unit on the
  next.
- :class:`FittedTable` lays a table out at the width it is given. It tries its usual look, the
  same table without rules between columns, then each alternative layout the caller offers;
  the first that fits as it is wins, else the one that gives way least (shortening sites,
  folding names, wrapping headers) without wrapping words, else the first that fits at all,
  else the rows become wrapped ``header value · …`` paragraphs. Figures are never wrapped or cut, no
  column gets narrower than its header's longest word, and free text (site names, labels,
  paths) wraps, folding a long name rather than cutting it.
- :class:`Site` is a site (or a path) in a table: where its column is narrow it is shortened
  from the left, its outer parts giving way to '…' while its innermost part (after the last
  '/': the frame or range the block came from) stays whole.
- :func:`outside` is how text from a trace, a snapshot, the history or a path enters a report:
  as plain text (never rich markup) with control characters escaped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rich import box
from rich.cells import cell_len, chop_cells
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from nsysfrag.printable import printable


@dataclass(frozen=True)
class Site:
    """A site in a table cell (see the module's docstring); ``after`` follows it whole, e.g.
    ``' +2 more'`` or a dim second line."""

    name: str
    after: Text = field(default_factory=Text)

    def full(self) -> str:
        return printable(self.name) + self.after.plain

    def shortened(self, width: int) -> str:
        """The longest right-hand part of the name, '…/' before it, that fits ``width`` with
        the first line of ``after``; the innermost part alone when none does."""
        name = printable(self.name)
        parts = name.split("/")
        room = width - cell_len(self.after.plain.split("\n", 1)[0])
        if cell_len(name) <= room:
            return name
        # The right-hand parts, grown one at a time with their widths summed: linear in the
        # name, however many parts it has (joining every suffix anew was quadratic).
        used = cell_len("…")  # "…/" + k parts joined by "/": 1 + sum of (1 + width of part)
        k = 0
        while k < len(parts) - 1:
            step = 1 + cell_len(parts[-1 - k])
            if used + step > room and k > 0:
                break
            used += step
            k += 1
        return name if len(parts) == 1 else "…/" + "/".join(parts[-max(k, 1):])

    def fitted(self, width: int) -> Text:
        text = Text(self.shortened(width)) + self.after
        return Text("\n").join(wrap_lines(text, width, name=True))


Cell = str | Text | Site
# A figure and its unit: "1.38 GiB", "20 %", "+0.518 points/s", "512 B", "256–512 MiB"; and
# a count of what a cell leaves out, "+3 more".
_UNIT = r"(?:[KMGTPE]i?B|[kMGTPE]B|B|%|s|ms|µs|ns|points/s|pt/s|pt|more)"
_FIGURE_GAP = re.compile(rf"(?<=\d) (?={_UNIT}(?![\w/]))")
_WORD = re.compile(r"\S+\s*")
# In a name (a site, a path, a list of them) a line may also break after '/', ',', '_', '-' or
# '+', after ':' unless a line number follows (file.py:43 stays whole), and where a CamelCase
# word starts its next part (NativeLayerNorm|Backward0): never inside a word's own letters.
_NAME_BREAK = re.compile(r"(?<=[/,_+\-])(?=\S)|(?<=:)(?=[^\d\s])|(?<=[a-z])(?=[A-Z])")
# A name column (sites, labels, paths) may fold down to this many cells, or its longest entry.
NAME_FLOOR = 12
Kind = Literal["figure", "words", "name", "site"]


def outside(text: str, style: str = "") -> Text:
    """Text that came from outside nsysfrag, ready to print: no markup, no control codes."""
    return Text(printable(text), style=style)


# ---------------------------------------------------------------------------------- prose


def _tokens(plain: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each word with its trailing spaces, a figure and its unit being one."""
    masked = _FIGURE_GAP.sub("\0", plain)  # same length: a stand-in that is not a space
    for m in _WORD.finditer(masked):
        yield m.start(), m.end()


def name_parts(word: str) -> list[str]:
    """The pieces a name may break into (``_NAME_BREAK``), in order; joined, the word."""
    return [part for part in _NAME_BREAK.split(word) if part]


def _pieces(word: str, width: int, name: bool) -> list[str]:
    """A word longer than ``width`` in pieces that fit: a name breaks where ``name_parts``
    allows, anything else (and a part still too long) is folded."""
    parts = name_parts(word) if name else [word]
    pieces: list[str] = []
    current: list[str] = []  # the last piece, in parts: joined once, not grown by copies
    used = 0
    for part in parts:
        size = cell_len(part)
        if current and used + size <= width:
            current.append(part)
            used += size
            continue
        if current:
            pieces.append("".join(current))
        chopped = chop_cells(part, width) or [""]
        pieces.extend(chopped[:-1])
        current, used = [chopped[-1]], cell_len(chopped[-1])
    if current:
        pieces.append("".join(current))
    return pieces


def wrap_lines(text: Text, width: int, *, name: bool = False) -> list[Text]:
    """``text`` broken into lines of at most ``width`` cells at spaces (see :class:`Prose`); a
    word longer than a line is broken after '/', ',' or ':' when it is a ``name``, else folded."""
    width = max(width, 1)
    lines: list[Text] = []
    for paragraph in text.split("\n", allow_blank=True):
        plain = paragraph.plain
        offsets: list[int] = []
        used = cell_len(plain) - cell_len(plain.lstrip())  # an indent counts on the first line
        for start, end in _tokens(plain):
            word = plain[start:end].rstrip()
            trailing = end - start - len(word)
            if used and used + cell_len(word) > width:
                offsets.append(start)
                used = 0
            if cell_len(word) <= width:
                used += cell_len(word) + trailing
                continue
            pieces = _pieces(word, width, name)
            for piece in pieces[:-1]:
                start += len(piece)
                offsets.append(start)
            used = cell_len(pieces[-1]) + trailing
        for line in paragraph.divide(offsets):
            line.rstrip()
            lines.append(line)
    return lines


def _widest_token(text: Text) -> int:
    plain = text.plain
    return max((cell_len(plain[s:e].rstrip()) for s, e in _tokens(plain)), default=0)


@dataclass(frozen=True)
class Prose:
    """A paragraph that wraps to the width it is given, never splitting a figure from its unit."""

    text: Text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # A word longer than a line (a path) breaks as a name does, not mid-word.
        for line in wrap_lines(self.text, options.max_width, name=True):
            line.end = "\n"
            line.no_wrap = True
            yield line

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        longest = max((cell_len(line) for line in self.text.plain.split("\n")), default=0)
        return Measurement(min(_widest_token(self.text), longest), longest)


# ---------------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Column:
    """A column: ``figure`` cells are kept whole, ``words`` wrap only at spaces, ``name``
    cells wrap and fold a long word."""

    header: str
    justify: Literal["left", "right"] = "left"
    kind: Kind = "figure"
    floor: int = NAME_FLOOR  # the narrowest a name column folds to (or its longest entry)


def right(*headers: str) -> tuple[Column, ...]:
    """Figure columns, right-justified: most of a table's columns are."""
    return tuple(Column(h, justify="right") for h in headers)


@dataclass(frozen=True)
class Layout:
    """One way to lay a table out: columns, rows, and which rows end a section."""

    columns: Sequence[Column]
    rows: Sequence[Sequence[Cell]]
    section_ends: frozenset[int] = field(default_factory=frozenset)


def _lines(cell: Cell) -> list[str]:
    return _plain(cell).split("\n")


def _stops(column: Column, cells: list[Cell]) -> list[int]:
    """The widths a column gives way to, pass by pass: first at all; then once headers wrap
    (every column, down to its widest cell); then once free text wraps (names fold down to
    NAME_FLOOR, words wrap at spaces)."""
    header_word = max((cell_len(w) for w in column.header.split()), default=0)
    lines = [line for c in cells for line in _lines(c)]
    widest = max([cell_len(column.header)] + [cell_len(line) for line in lines])
    content = max([header_word] + [cell_len(line) for line in lines])
    if column.kind == "figure":
        floor = content
    elif column.kind == "words":
        floor = max([header_word] + [cell_len(w) for line in lines for w in line.split()])
    else:  # a name or a site: down to its floor, but never below a part of a name's word
        parts = [cell_len(part) for line in lines for w in line.split() for part in name_parts(w)]
        floor = max([header_word, min(widest, column.floor), *parts])
    if column.kind == "name":  # names give way first: they fold, figures must not
        return [widest, floor, floor, floor]
    if column.kind == "site":  # sites shorten first, wrap at spaces, and fold last
        shortest = max(
            [header_word]
            + [
                cell_len(word)
                for c in cells
                if isinstance(c, Site)
                for word in (c.shortened(0) + c.after.plain).split()
            ]
        )
        return [widest, min(widest, shortest), min(widest, shortest), floor]
    return [widest, widest, content, floor]


def fit_widths(stops: Sequence[Sequence[int]], room: int) -> tuple[list[int], int] | None:
    """Column widths that add up to at most ``room`` and the pass that made them fit (0: every
    column as wide as it wants), or None when they cannot. Pass after pass, each column may
    shrink to its stop for that pass, the widest first."""
    widths = [s[0] for s in stops]
    if sum(widths) <= room:
        return widths, 0
    for step in range(1, len(stops[0])):
        floor = [s[step] for s in stops]
        excess = sum(widths) - room
        while excess > 0:
            shrinkable = [j for j in range(len(widths)) if widths[j] > floor[j]]
            if not shrinkable:
                break
            widths[max(shrinkable, key=lambda j: widths[j])] -= 1
            excess -= 1
        if excess <= 0:
            return widths, step
    return None


# A layout that must wrap words (the last pass) gives way to one that need not.
_WORDS_WRAP = 3
_COMPACT = {"box": box.SIMPLE_HEAD, "show_edge": False, "pad_edge": False, "collapse_padding": True}


@dataclass(frozen=True)
class FittedTable:
    """A table that fits the width it is given (see the module's docstring).

    ``style`` holds the keyword arguments of its usual look (rich ``Table``); ``alternatives``
    are other layouts of the same data, tried before falling back to paragraphs.
    """

    title: Text | None
    layout: Layout
    style: dict[str, object] = field(default_factory=dict)
    alternatives: Sequence[Layout] = ()

    def _table(self, layout: Layout, style: dict[str, object], widths: list[int]) -> Table:
        table = Table(title=self.title, title_justify="left", **style)  # type: ignore[arg-type]
        for column, width in zip(layout.columns, widths, strict=True):
            table.add_column(
                Text(column.header), justify=column.justify, width=width, overflow="fold"
            )
        for i, row in enumerate(layout.rows):
            cells = [
                _fitted(cell, width, column.kind)
                for column, width, cell in zip(layout.columns, widths, row, strict=True)
            ]
            table.add_row(*cells, end_section=i in layout.section_ends)
        return table

    def _attempts(self) -> Iterator[tuple[Layout, dict[str, object]]]:
        yield self.layout, self.style
        yield self.layout, {**self.style, **_COMPACT}
        for layout in self.alternatives:  # for narrow widths, where less decoration helps
            yield layout, {**self.style, **_COMPACT}
            yield layout, self.style

    def choose(self, console: Console, width: int) -> RenderableType:
        """The attempt that gives way least to fit ``width`` (the first of those), as long as
        it need not wrap words, else the first that does, else a paragraph per row."""
        fallback: Table | None = None
        best: tuple[int, Table] | None = None
        for layout, style in self._attempts():
            if not layout.rows:
                continue
            cells = [[row[i] for row in layout.rows] for i in range(len(layout.columns))]
            stops = [_stops(c, col) for c, col in zip(layout.columns, cells, strict=True)]
            probe = self._table(layout, style, [1] * len(layout.columns))
            wide = console.options.update(max_width=1 << 20)
            overhead = Measurement.get(console, wide, probe).maximum - len(layout.columns)
            fitted = fit_widths(stops, width - overhead)
            if fitted is None:
                continue
            widths, step = fitted
            if step == 0:
                return self._table(layout, style, widths)
            if step < _WORDS_WRAP and (best is None or step < best[0]):
                best = step, self._table(layout, style, widths)
            elif step >= _WORDS_WRAP:
                fallback = fallback or self._table(layout, style, widths)
        return best[1] if best is not None else fallback or self._paragraphs()

    def _paragraphs(self) -> RenderableType:
        parts: list[RenderableType] = []
        if self.title is not None:
            parts.append(Prose(self.title))
        for i, row in enumerate(self.layout.rows):
            line = Text("  " if not _plain(row[0]) else "")
            first = True
            for column, cell in zip(self.layout.columns, row, strict=True):
                if not _plain(cell):
                    continue
                if not first:
                    line.append(" · ")
                first = False
                if column.header:
                    line.append(f"{column.header} ")
                line.append(_text(cell))
            parts.append(Prose(line))
            if i in self.layout.section_ends and i != len(self.layout.rows) - 1:
                parts.append(Text(""))
        return Group(*parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.choose(console, options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.choose(console, options.max_width))


def _fitted(cell: Cell, width: int, kind: Kind) -> str | Text:
    """A cell as it shows in a column ``width`` wide: sites shortened, names wrapped."""
    if isinstance(cell, Site):
        return cell.fitted(width)
    if kind in ("name", "site"):
        return Text("\n").join(wrap_lines(_text(cell), width, name=True))
    return cell


def _text(cell: Cell) -> Text:
    if isinstance(cell, Site):
        return Text(printable(cell.name)) + cell.after
    return cell if isinstance(cell, Text) else Text(cell)


def _plain(cell: Cell) -> str:
    if isinstance(cell, Site):
        return cell.full()
    return cell.plain if isinstance(cell, Text) else cell

"""Allocation sites from run to run: each site's figure in both runs, matched by its text, and
ranked by how much it changed.

A site is its text — ``file:line function`` (a snapshot's stack frame) or an NVTX path. Sites
with the same text match. Of those left over, sites that differ only in their line number
(``model.py:150 forward`` and ``model.py:152 forward``: the file was edited) match as one
``file function``; several lines of one function on a side are added together then. What is
left appeared or vanished — unless the other run's document listed only its largest sites,
when the site may be among those it left out: *unlisted*, its value there unknown but no larger
than the smallest it listed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SAME = "same"  # the same text in both runs
MOVED = "moved"  # the same file and function, other line numbers
NEW = "new"  # only in the current run
GONE = "gone"  # only in the base run
UNLISTED = "unlisted"  # in one run's list; the other's list was cut short before it

# ``dir/file.py:123 function``: a snapshot's frame text (nsysfrag.inputs.torch_snapshot).
_FRAME = re.compile(r"^(?P<file>\S+):(?P<line>\d+) (?P<function>.+)$")


@dataclass(frozen=True, slots=True)
class SiteList:
    """One run's figure per site, as its document gives it."""

    bytes_by_site: Mapping[str, int]
    other_sites: int = 0  # sites the document left out (their total: other_bytes)
    other_bytes: int = 0
    total_bytes: int | None = None  # the figure over every site, where the document has it

    @property
    def complete(self) -> bool:
        return self.other_sites == 0

    @property
    def smallest_listed(self) -> int:
        return min(self.bytes_by_site.values(), default=0)


@dataclass(frozen=True, slots=True)
class SiteChange:
    """One site's figure in the base run and the current one."""

    site: str  # its text in the current run (the base's when it vanished), or ``file function``
    base: int | None  # None: not in the base's list, which was cut short (see UNLISTED)
    current: int | None
    status: str  # SAME, MOVED, NEW, GONE or UNLISTED
    base_site: str | None = None  # MOVED: the base's text(s), when they differ from ``site``
    merged: bool = False  # MOVED: several lines of one function on a side, added together

    @property
    def delta(self) -> int:
        return (self.current or 0) - (self.base or 0)


def site_changes(base: SiteList, current: SiteList) -> list[SiteChange]:
    """Every site of either run, largest change first (then by site); unchanged sites too."""
    b, c = base.bytes_by_site, current.bytes_by_site
    out = [SiteChange(s, b[s], c[s], SAME) for s in c if s in b]
    rest_b = {s: v for s, v in b.items() if s not in c}
    rest_c = {s: v for s, v in c.items() if s not in b}
    out += _moved(rest_b, rest_c)
    out += [
        SiteChange(s, None if not base.complete else 0, v, NEW if base.complete else UNLISTED)
        for s, v in rest_c.items()
    ]
    out += [
        SiteChange(
            s, v, None if not current.complete else 0, GONE if current.complete else UNLISTED
        )
        for s, v in rest_b.items()
    ]
    out.sort(key=lambda x: (-abs(x.delta), x.site))
    return out


def _moved(base: dict[str, int], current: dict[str, int]) -> list[SiteChange]:
    """Match the sites left over by file and function alone; take them out of both dicts. As
    many lines on each side: an edit moved them, so they pair in line order; else the
    function's lines on each side add up to one change, named ``file function``."""
    by_key_b = _group(base)
    by_key_c = _group(current)
    out = []
    for key in sorted(by_key_b.keys() & by_key_c.keys()):
        names_b, names_c = by_key_b[key], by_key_c[key]
        if len(names_b) == len(names_c):
            out += [
                SiteChange(c, base.pop(b), current.pop(c), MOVED, base_site=b)
                for b, c in zip(names_b, names_c, strict=True)
            ]
            continue
        out.append(
            SiteChange(
                key,
                sum(base.pop(s) for s in names_b),
                sum(current.pop(s) for s in names_c),
                MOVED,
                base_site=", ".join(names_b),
                merged=True,
            )
        )
    return out


def _group(sites: Iterable[str]) -> dict[str, list[str]]:
    """The ``file:line function`` sites by ``file function``, each group in line order."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for s in sites:
        m = _FRAME.match(s)
        if m is not None:
            groups.setdefault(f"{m['file']} {m['function']}", []).append((int(m["line"]), s))
    return {key: [s for _, s in sorted(lines)] for key, lines in groups.items()}

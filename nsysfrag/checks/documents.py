"""JSON documents read back — a ``--baseline``, ``compare``'s inputs, a job's document, a Dask
scheduler file — read within bounds and checked against their schema before anything uses them.

A document may come from anywhere (a CI artifact, a hand edit), so every value the comparison,
the job report or the cluster connection reads is checked here first, and anything else is one
line naming the file, the place in it (``spaces[2].health``) and what was there: a number of
10^400 (JSON says nothing of ranges; Python reads it as ``inf``), a 5,000-digit integer (which
Python refuses to read at all), a health that is not a level, a list where a number belongs.
The file is read only up to ``limits.JSON_BYTES``, and must be a regular file (a FIFO would
block). What its sites cost to show is bounded too: each site's text is cut to
``limits.DOCUMENT_SITE_CHARS`` (a 1 MB site took 40 s and 550 MB to lay out), and the sites of a
document are at most ``limits.DOCUMENT_SITES``, their texts at most ``limits.DOCUMENT_SITE_BYTES``
together; a lone surrogate (``"\ud800"``, which JSON can spell but no UTF-8 output can hold)
reads as U+FFFD. Hand-written rather than a schema library: the schema is a few dozen paths, each check
one line, and the messages name the option and the fix in the words of the rest of nsysfrag.
"""

from __future__ import annotations

import json
import math
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from nsysfrag import limits
from nsysfrag.errors import InputError
from nsysfrag.inputs.files import display_path, stat_path

HEALTH_LEVELS = ("ok", "warn", "critical")
# More digits than any count, size or address (2^64 has 20): a longer integer is refused as it
# is read, before Python spends time (or refuses) to convert it.
MAX_DIGITS = 40
INT64 = (-(2**63), 2**63 - 1)
UINT64_END = 2**64


class _TooLong(ValueError):
    pass


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise _TooLong(len(text.lstrip("-")))
    return int(text)


# A JSON escape of a UTF-16 surrogate: the only way a document's text can hold a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_lone_surrogates(doc: Any) -> Any:
    """``doc`` with every lone surrogate in its texts (keys too) as U+FFFD."""

    def clean(text: str) -> str:
        return _SURROGATE.sub("\ufffd", text)

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return clean(node)
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, dict):
            return {clean(k): walk(v) for k, v in node.items()}
        return node

    return walk(doc)


def read_json(path: Path, *, what: str = "JSON written by `nsysfrag analyze --json`") -> Any:
    """The JSON in ``path`` (a regular file of at most ``limits.JSON_BYTES``); InputError with
    a fix when there is none. ``what`` says what to pass instead."""
    shown = display_path(path)
    st = stat_path(path, f"pass {what}")
    if st is None:
        raise InputError(f"{shown}: no such file; pass {what}")
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise InputError(f"{shown}: is {kind}; pass {what}")
    most = int(limits.JSON_BYTES.value())
    try:
        with open(path, "rb") as f:
            data = f.read(most + 1)
    except OSError as err:
        raise InputError(f"{shown}: cannot read it ({err.strerror}); check the path") from None
    if len(data) > most:
        raise InputError(
            f"{shown}: larger than {most:,} bytes, more than any document nsysfrag writes; pass"
            f" {what} (or raise {limits.JSON_BYTES.env})"
        )
    try:
        text = data.decode("utf-8")
        doc = json.loads(text, parse_int=_integer)
        return _without_lone_surrogates(doc) if _SURROGATE_ESCAPE.search(text) else doc
    except RecursionError:  # nesting deeper than any document nsysfrag writes
        raise InputError(f"{shown}: JSON nested too deeply to be an nsysfrag document") from None
    except _TooLong as err:
        raise InputError(
            f"{shown}: holds an integer of {err.args[0]:,} digits, which no document nsysfrag"
            f" writes has; pass {what}"
        ) from None
    except UnicodeDecodeError:
        raise InputError(f"{shown}: not UTF-8 text, so not JSON; pass {what}") from None
    except ValueError as err:  # json.JSONDecodeError among them
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError(f"{shown}: not JSON ({first}); pass {what}") from None


def describe_value(value: Any) -> str:
    """``value`` as an error message shows it: short, and never a whole list or object."""
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= 24 else f"a number of {len(text)} characters"
    if isinstance(value, str):
        return repr(value[:40] + ("…" if len(value) > 40 else ""))
    if value is None:
        return "null"
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


class Checker:
    """Checks values of one document, each error naming the file and the place."""

    def __init__(self, path: Path, fix: str) -> None:
        self.path, self.fix = path, fix
        self.sites = 0
        self.site_bytes = 0
        self.site_chars = int(limits.DOCUMENT_SITE_CHARS.value())

    def site(self, node: dict[str, Any], where: str) -> None:
        """``node["site"]``, a text, cut to ``limits.DOCUMENT_SITE_CHARS`` in place (with
        '…'), counted against the document's bounds on sites."""
        text = self.text(self.at(node, "site", where), f"{where}.site")
        if len(text) > self.site_chars:
            text = node["site"] = text[: self.site_chars - 1] + "…"
        self.sites += 1
        self.site_bytes += len(text.encode("utf-8", "surrogatepass"))
        most, most_bytes = limits.DOCUMENT_SITES.value(), limits.DOCUMENT_SITE_BYTES.value()
        if self.sites > most:
            raise InputError(
                f"{display_path(self.path)}: more than {most:,.0f} sites (hotspots and sites at"
                f" the memory peak), more than nsysfrag writes for any trace; {self.fix} (or"
                f" raise {limits.DOCUMENT_SITES.env})"
            )
        if self.site_bytes > most_bytes:
            raise InputError(
                f"{display_path(self.path)}: its sites' texts hold more than {most_bytes:,.0f}"
                f" bytes, more than nsysfrag writes for any trace; {self.fix} (or raise"
                f" {limits.DOCUMENT_SITE_BYTES.env})"
            )

    def fail(self, where: str, value: Any, expected: str) -> InputError:
        return InputError(
            f"{display_path(self.path)}: {where} is {describe_value(value)}, not {expected}; {self.fix}"
        )

    def mapping(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, value, "an object")
        return value

    def listing(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(where, value, "a list")
        return value

    def integer(self, value: Any, where: str, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.fail(where, value, f"an integer from {lo:,} to {hi:,}")
        return value

    def number(self, value: Any, where: str, *, negative: bool = True) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(where, value, "a number")
        if not math.isfinite(value) or abs(value) >= UINT64_END:
            raise self.fail(where, value, "a finite number below 2^64")
        if not negative and value < 0:
            raise self.fail(where, value, "a number of at least 0 (a size or a count)")
        return float(value)

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise self.fail(where, value, "text")
        return value

    def level(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or value not in HEALTH_LEVELS:
            raise self.fail(where, value, "a health level (" + ", ".join(HEALTH_LEVELS) + ")")
        return value

    def at(self, node: Mapping[str, Any], dotted: str, where: str) -> Any:
        """``node["peak"]["global_frag"]`` for ``"peak.global_frag"``, each level checked."""
        for part in dotted.split("."):
            node = self.mapping(node, where)
            if part not in node:
                raise InputError(
                    f"{display_path(self.path)}: {where} has no {part!r}; {self.fix}"
                )
            node, where = node[part], f"{where}.{part}"
        return node


ANALYSIS_FIX = "re-run `nsysfrag analyze --json` to write it again"


def check_analysis(
    doc: Any, path: Path, numbers: Iterable[str], schema: str, where: str = "",
    check: Checker | None = None,
) -> dict[str, Any]:
    """``doc`` when it is an analysis document (``schema``) whose spaces hold every value the
    comparison reads: pid and device (64-bit integers), health (a level), each path in
    ``numbers`` (a finite number), the capacity (a positive integer) and the counts (integers
    of at least 0). ``check``: the checker of the document this analysis is part of (a job's),
    whose bounds on sites it shares."""
    check = check or Checker(path, ANALYSIS_FIX)
    prefix = f"{where}." if where else ""
    if not isinstance(doc, dict) or doc.get("schema") != schema or not isinstance(doc.get("spaces"), list):
        raise InputError(
            f"{display_path(path)}: {where + ' is ' if where else ''}not an nsysfrag analysis"
            f" (schema {schema}); {ANALYSIS_FIX}"
        )
    trace = _check_trace(check, doc.get("trace", {}), f"{prefix}trace")
    origin = "first_event_ns" in trace
    paths = tuple(numbers)
    for i, space in enumerate(doc["spaces"]):
        at = f"{prefix}spaces[{i}]"
        node = check.mapping(space, at)
        check.integer(check.at(node, "pid", at), f"{at}.pid", *INT64)
        check.integer(check.at(node, "device", at), f"{at}.device", *INT64)
        check.level(check.at(node, "health", at), f"{at}.health")
        if "capacity_bytes" in node:
            check.integer(node["capacity_bytes"], f"{at}.capacity_bytes", 1, INT64[1])
        if "counts" in node:
            for name, value in check.mapping(node["counts"], f"{at}.counts").items():
                check.integer(value, f"{at}.counts.{name}", 0, INT64[1])
        for dotted in paths:
            check.number(check.at(node, dotted, at), f"{at}.{dotted}")
        _check_compared_parts(check, node, at, origin)
    return doc


MOMENTS = ("peak", "memory_peak", "final", "max")


def _check_trace(check: Checker, trace: Any, at: str) -> Mapping[str, Any]:
    """What a comparison reads of ``trace``: its clock and the words of its input's kind."""
    trace = check.mapping(trace, at)
    if "first_event_ns" in trace:
        check.integer(trace["first_event_ns"], f"{at}.first_event_ns", *INT64)
    if "input" in trace:
        check.text(trace["input"], f"{at}.input")
    if "words" in trace:
        for name, value in check.mapping(trace["words"], f"{at}.words").items():
            check.text(value, f"{at}.words.{name}")
    return trace


def _check_compared_parts(check: Checker, space: Mapping[str, Any], at: str, origin: bool) -> None:
    """The optional parts of a space a comparison reads, where the document has them: each
    moment's state (``time_ns`` an integer, every figure a finite number), the sites at the
    memory peak and the hotspots' hole bytes; the timeline's first time when the document
    does not record its clock's origin."""
    for key in MOMENTS:
        if key not in space:
            continue
        state = check.mapping(space[key], f"{at}.{key}")
        for name, value in state.items():
            if name == "time_ns":
                check.integer(value, f"{at}.{key}.time_ns", *INT64)
            else:  # sizes and counts are never negative; a fraction's sign is its own
                size = name.endswith("_bytes") or name.endswith("_blocks")
                check.number(value, f"{at}.{key}.{name}", negative=not size)
    if "memory_peak_sites" in space:
        sites_at = f"{at}.memory_peak_sites"
        sites = check.mapping(space["memory_peak_sites"], sites_at)
        for part in ("live", "stranded"):
            entry = check.mapping(check.at(sites, part, sites_at), f"{sites_at}.{part}")
            where = f"{sites_at}.{part}"
            for name in ("total_bytes", "other_sites", "other_bytes"):
                if name in entry:
                    check.integer(entry[name], f"{where}.{name}", *INT64)
            listed = check.listing(check.at(entry, "sites", where), f"{where}.sites")
            for i, site in enumerate(listed):
                _site_entry(check, site, f"{where}.sites[{i}]", "bytes")
    if "hotspots" in space and isinstance(space["hotspots"], list):
        for i, hotspot in enumerate(space["hotspots"]):
            _site_entry(check, hotspot, f"{at}.hotspots[{i}]", "hole_bytes")
    if not origin and "timeline" in space:
        timeline = check.mapping(space["timeline"], f"{at}.timeline")
        times = check.listing(check.at(timeline, "time_ns", f"{at}.timeline"), f"{at}.timeline.time_ns")
        if times:
            check.integer(times[0], f"{at}.timeline.time_ns[0]", *INT64)


def _site_entry(check: Checker, entry: Any, at: str, figure: str) -> None:
    node = check.mapping(entry, at)
    check.site(node, at)
    check.integer(check.at(node, figure, at), f"{at}.{figure}", *INT64)


def check_job(
    doc: dict[str, Any], path: Path, numbers: Iterable[str], analysis_schema: str
) -> dict[str, Any]:
    """A job's document: its ranks (numbers from 0 to ``limits.MAX_RANK``, each once), each
    with its analysis (checked as :func:`check_analysis`) or the error it failed with."""
    check = Checker(path, "re-run `nsysfrag analyze --json` on the job's inputs")
    ranks = check.listing(doc.get("ranks"), "ranks")
    seen: set[int] = set()
    paths = tuple(numbers)
    for i, entry in enumerate(ranks):
        at = f"ranks[{i}]"
        node = check.mapping(entry, at)
        rank = check.integer(check.at(node, "rank", at), f"{at}.rank", 0, limits.MAX_RANK)
        if rank in seen:
            raise check.fail(f"{at}.rank", rank, "a rank no other entry has")
        seen.add(rank)
        if "analysis" in node:
            check_analysis(node["analysis"], path, paths, analysis_schema, f"{at}.analysis", check)
        else:
            check.text(node.get("error", "not analyzed"), f"{at}.error")
    return doc


def scheduler_address(path: Path) -> str:
    """The scheduler's address in a file ``dask scheduler --scheduler-file`` wrote."""
    what = "the file `dask scheduler --scheduler-file` wrote"
    doc = read_json(path, what=what)
    check = Checker(path, f"pass {what}")
    address = check.text(check.at(check.mapping(doc, "the file"), "address", "the file"), "address")
    if not address.strip() or len(address) > 4096 or any(c in address for c in "\r\n\x00"):
        raise check.fail("address", address, "a scheduler address such as tcp://host:8786")
    return address

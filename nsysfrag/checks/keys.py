"""The numeric keys of a space of the analyze JSON document: every one is a metric that
``--fail-on`` gates and ``history --trend``/``--check`` accept.

A key is the dotted path to a number in the space (``peak.global_frag``,
``memory_peak.reserved_bytes``, ``counts.overlaps``, ``reserved_bytes_peak``); a boolean counts as
0 or 1; a list is counted, ``PATH.count`` (``ooms.count``, ``hotspots.count``). A bare name of a
per-event figure means its maximum over the trace, else its value at the fragmentation peak,
else a count (``global_frag`` is ``max.global_frag``, ``reserved_bytes`` ``peak.reserved_bytes``,
``overlaps`` ``counts.overlaps``).

:func:`numeric_keys` walks any space document; :data:`KNOWN` is every key a space of this
version can have (nsys or snapshot), read off the values that make the document, so that a
gate fails before the analysis when its key is none of them, with the nearest keys named.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from nsysfrag.analysis.results import Counts, PoolState, State
from nsysfrag.errors import InputError

HEALTH = "health"  # the one key compared as a level (ok < warn < critical), not a number
BARE_IN = ("max", "peak", "counts")  # where a bare name is looked up, in order
COUNT = "count"  # PATH.count: the length of a list

# The moments a space's document holds as a state (``memory_peak``: the moment of the most
# reserved memory, where the document has it).
STATE_SECTIONS = ("peak", "final", "memory_peak")
_MAX = ("global_frag", "local_frag", "free_blocks", "live_bytes")
_TOP = ("pid", "device", "capacity_bytes", "base_address", "arena_end_address", "span_mode",
        "alloc_failure_rate", "internal_frag", "growth_per_s", "out_of_order_frees",
        "hole_creating_frees", "caching_allocator_suspected")  # fmt: skip
_LISTS = ("ooms", "hotspots", "size_histogram", "free_block_histogram", "advice", "oom_events",
          "unrated_maxima",
          *(f"timeline.{k}" for k in ("time_ns", "global_frag", "local_frag", "free_blocks",
                                      "largest_free_bytes", "live_bytes")))  # fmt: skip
# A PyTorch snapshot's own figures (reporters.json_report.snapshot_document).
_SNAPSHOT = ("expandable_segments", "time_origin_unix_us", "reserved_bytes_peak",
             "allocated_bytes_peak", "active_bytes_peak", "requested_bytes_peak",
             "reserved_bytes_at_frag_peak", "releasable_bytes_at_frag_peak",
             "reserved_bytes_final", "allocated_bytes_final", "active_bytes_final",
             "requested_bytes_final")  # fmt: skip
# Each site's live and stranded bytes at the memory peak (reporters.json_report.peak_sites_document).
_PEAK_SITES = tuple(
    f"memory_peak_sites.{part}.{k}"
    for part in ("live", "stranded")
    for k in ("total_bytes", "other_sites", "other_bytes", f"sites.{COUNT}")
)
_WINDOW = ("trace_entries", "initial_blocks", "initial_reserved_bytes", "timestamps", "conflicts",
           "final_mismatches")  # fmt: skip


def _names(kind: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(kind) if f.name != "pool")


def _known() -> frozenset[str]:
    state = _names(State) + _names(PoolState)
    return frozenset(
        (
            *_TOP,
            HEALTH,
            *(f"{section}.{k}" for section in STATE_SECTIONS for k in state),
            *(f"max.{k}" for k in _MAX),
            *(f"counts.{k}" for k in _names(Counts)),
            "health_basis.value",
            "health_basis.time_ns",
            *(f"{k}.{COUNT}" for k in _LISTS),
            *_SNAPSHOT,
            *(f"window.{k}" for k in _WINDOW),
            *_PEAK_SITES,
        )
    )


KNOWN = _known()


def numeric_keys(space: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Every number of ``space`` by its dotted path; booleans as 0/1; lists as ``PATH.count``."""
    out: dict[str, float] = {}
    for key, value in space.items():
        path = f"{prefix}{key}"
        if isinstance(value, (int, float)):  # bool is an int: 0 or 1
            out[path] = int(value) if isinstance(value, bool) else value
        elif isinstance(value, Mapping):
            out.update(numeric_keys(value, f"{path}."))
        elif isinstance(value, list):
            out[f"{path}.{COUNT}"] = float(len(value))
    return out


def resolve(name: str, known: Iterable[str] = KNOWN) -> str:
    """The dotted path ``name`` means (a bare name: its maximum, else its value at the peak,
    else a count); InputError naming the nearest keys when it is none of ``known``."""
    keys = set(known)
    if name in keys:
        return name
    for section in BARE_IN:
        if f"{section}.{name}" in keys:
            return f"{section}.{name}"
    near = nearest(name, keys)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise InputError(
        f"{name!r} is not a numeric metric of a space{hint} (every numeric key of a space of the"
        " analyze JSON is one, as a dotted path: memory_peak.reserved_bytes, final.stranded_bytes,"
        " ooms.count; `nsysfrag analyze --help` lists them)"
    )


def nearest(name: str, keys: Iterable[str], n: int = 3) -> list[str]:
    """The keys most like ``name``: by the whole path, and by its last part."""
    keys = sorted(set(keys))
    found = difflib.get_close_matches(name, keys, n=n, cutoff=0.6)
    leaf = name.rsplit(".", 1)[-1]
    for key in keys:
        if len(found) >= n:
            break
        if key not in found and key.rsplit(".", 1)[-1] == leaf:
            found.append(key)
    return found[:n]


def key_list() -> str:
    """Every known key, for --help and the docs: sections collapsed (``peak.``/``final.`` …)."""
    top = sorted(k for k in KNOWN if "." not in k)
    state = sorted({k.split(".", 1)[1] for k in KNOWN if k.split(".", 1)[0] in STATE_SECTIONS})
    rest = sorted(k for k in KNOWN if "." in k and k.split(".", 1)[0] not in STATE_SECTIONS)
    return (
        f"{', '.join(top)}; {'/'.join(STATE_SECTIONS)}.{{{', '.join(state)}}}; {', '.join(rest)}"
    )

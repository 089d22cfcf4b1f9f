"""The one event model every input is read into, and what reports need to know of the input.

No I/O here. An input (``nsysfrag.inputs``) turns its own records — nsys memory-event rows, a
PyTorch snapshot's history entries — into one :class:`AllocationEvents` per address space, and
describes itself in a :class:`SourceInfo`; models read nothing else. Arrays rather than
per-event objects: inputs run to millions of events and the replay walks them in compiled code.
Each row is a change: the state it leads to holds until the next row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

# progress(phase, done, total): how library code reports long work; the CLI draws the bar.
ProgressCallback = Callable[[str, int, int], None]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
I8 = npt.NDArray[np.int8]
BoolArray = npt.NDArray[np.bool_]

# What an event did: the ``kind`` column. Plain integers, so compiled code can read them; in
# the order of a block's life (PyTorch's snapshot actions map onto them one to one).
ALLOC = 0  # a block of ``bytes`` at ``address`` became live
FREE_REQUESTED = 1  # freed by the program, but another stream still uses it: not reusable yet
FREE_COMPLETED = 2  # the end of a requested free: now reusable
FREE = 3  # the block at ``address`` was freed and can be reused at once
SEGMENT_ALLOC = 4  # an allocator reserved ``bytes`` at ``address`` from the driver
SEGMENT_FREE = 5  # ... and gave that segment back
SEGMENT_MAP = 6  # pages mapped into an expandable segment
SEGMENT_UNMAP = 7  # ... and unmapped
FAILED_ALLOC = 8  # an allocation that failed (a cudaMalloc error, PyTorch's OOM); ``bytes`` asked
UNKNOWN_BYTES = -1  # the ``bytes`` of a failed allocation whose input records no size
MARK = 9  # a moment with no change (the moment a snapshot was taken)
KIND_NAMES = (
    "alloc", "free_requested", "free_completed", "free", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "failed_alloc", "mark",
)  # fmt: skip


class SiteTable(Protocol):
    """Where each event's allocation was made: a code per event into a list of names."""

    def codes(self, events: I64) -> tuple[I64, list[str]]:
        """The site codes of ``events`` (indices) and the names they index; code 0 is the
        input's word for "no site known"."""
        ...


class NameCodes:
    """Names numbered in the order first seen: a site's, a stack's or a range's text gets one
    code however often it recurs, so per-event columns hold small integers, not strings."""

    __slots__ = ("_codes", "names")

    def __init__(self, names: Sequence[str] = ()) -> None:
        self.names: list[str] = list(names)
        self._codes = {name: code for code, name in enumerate(self.names)}

    def code(self, name: str) -> int:
        found = self._codes.get(name)
        if found is None:
            found = self._codes[name] = len(self.names)
            self.names.append(name)
        return found


@dataclass(frozen=True, slots=True)
class KnownSites:
    """Sites known for every event when the input is read."""

    code: I64
    names: list[str]

    def codes(self, events: I64) -> tuple[I64, list[str]]:
        return self.code[events], self.names


@dataclass(frozen=True, slots=True)
class MemoryPools:
    """Per event: the memory pool (cudaMallocAsync) its block came from, and the pool's figures
    as that event recorded them."""

    pool: I64  # an index into the space's pools, or -1: not from a pool
    size_bytes: I64  # the memory the pool held
    kept_bytes: I64  # what a trim keeps: max(bytes in use, the pool's release threshold)


@dataclass(frozen=True, slots=True)
class AllocationEvents:
    """One address space's events, in order."""

    time_ns: I64  # since the input's time origin; entry numbers where it records no time
    kind: I8  # ALLOC, FREE, ... above
    address: U64  # unsigned: nsys stores addresses >= 2**63 as negative integers
    bytes: I64  # block bytes (alloc and frees), segment bytes, or the bytes a failure asked for
    sites: SiteTable
    stream: I64 | None = None  # the CUDA stream, where the input records one
    device_free_bytes: I64 | None = None  # FAILED_ALLOC: what the driver had free, -1 unknown
    # Per FAILED_ALLOC event, in order: the request's stack, innermost frame first, where the
    # input records one (a snapshot's OOM entries).
    failure_stacks: tuple[tuple[str, ...], ...] | None = None
    pools: MemoryPools | None = None  # where the input records memory pools

    def __len__(self) -> int:
        return len(self.time_ns)


@dataclass(frozen=True, slots=True)
class InputCounts:
    """What the input held that no space's model places: counted and reported, never fatal."""

    skipped_rows: int = 0  # records the input could not use
    vmm_calls: int = 0  # virtual-memory calls, whose memory nsys may not record
    unattributed_failures: int = 0  # failed allocations no space takes
    unassigned_other_kind_events: int = 0  # other-kind memory events of processes with no space


@dataclass(frozen=True, slots=True)
class Words:
    """How reports name this input's things. Reports read these and never branch on the
    input or the model, so teaching them another input's language is a data change."""

    space_title: str  # what one space's figures describe, e.g. "observed address space"
    figure_title: str  # the same on a figure
    version_label: str = "nsys version"  # the heading of the recording tool's version
    no_version: str = "unknown nsys version"  # said when the input names no version
    no_version_short: str = "unknown"  # the same where space is short
    input_noun: str = "trace"  # what the file is called in a report's header
    site_label: str = "allocation site"  # the axis of sites on a figure
    # What "free" and "largest free" mean in the rated metrics, for the reports' legends.
    free_meaning: str = "free"
    largest_meaning: str = "largest free block"
    # The rated metrics' formulas in a figure's legend (the glossary defines the symbols).
    global_formula: str = "(F − L) / C"
    local_formula: str = "1 − L / F"
    # Whether the input has memory kinds it does not model (nsys: pinned, managed, ...), whose
    # events the reports count.
    other_kinds: bool = True
    # A failure whose input records no request size says so in these words.
    size_unknown: str = "size not recorded"
    # The memory between reserved and allocated, on a figure's shading.
    unallocated: str = "cached (reserved − allocated)"
    # A moment of a space whose input recorded no times is its entry (event) number: "entry 17".
    untimed: str = "entry"
    untimed_axis: str = "time (trace entries since the first; the snapshot records no times)"
    # The definitions of this input's own terms (name, meaning) that a report's glossary
    # lists before the terms every input shares.
    terms: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """What was read, and how to speak of it."""

    kind: str  # the input's name in the registry, e.g. "nsys-export"
    path: str
    version: str | None  # the recording tool's version, where the input says
    words: Words
    # Blocks are driver allocations (cudaMalloc): a caching allocator above them would hide
    # its own fragmentation, which is worth saying when every block looks like its segment.
    driver_allocations: bool = False
    # The time of the input's first event, the origin of every time a report shows (set by
    # the analysis, which sees every space).
    first_event_ns: int = 0

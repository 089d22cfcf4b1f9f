"""The PYTORCH_CUDA_ALLOC_CONF settings nsysfrag tries on an input: what ``whatif`` replays by
default, each on top of the run's own settings, and so the only settings ``analyze`` may
advise (advice names a setting only when ``nsysfrag whatif`` evaluates it on that input).

One knob changed at a time, never one the run already uses, never one that conflicts with its
settings: ``expandable_segments:True`` (unless on), ``max_split_size_mb`` at sizes read from the
input's own large blocks (not under expandable segments, not when set), ``garbage_collection_
threshold`` and ``roundup_power2_divisions`` (unless set). ``backend:cudaMallocAsync`` is the
``cuda-async`` policy, which every ``whatif`` runs.

Pure data over what the input records, so ``analyze`` and ``whatif`` derive the same list.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from nsysfrag.events import ALLOC, I64

MiB = 1 << 20
# PyTorch refuses max_split_size_mb at or below kLargeBuffer (20 MiB): a block that size is
# a large-pool segment for small requests, which must split.
MIN_SPLIT_MB = 21
MAX_SPLIT_CANDIDATES = 2
# A threshold PyTorch's documentation uses as its example; the collector then runs once
# reserved memory passes 80 % of the device.
GC_THRESHOLD = "0.8"
DIVISIONS = "4"  # four size steps between powers of two: PyTorch's documented example


@dataclass(frozen=True, slots=True)
class RunSettings:
    """What the run's allocator was configured with, as far as the input says."""

    expandable_segments: bool = False
    max_split_size_set: bool = False
    roundup_power2_divisions_set: bool = False
    garbage_collection_threshold_set: bool = False

    @classmethod
    def of(
        cls,
        conf: str | None,
        expandable: bool,
        max_split_size: int | None,
        divisions: dict[int, int],
    ) -> RunSettings:
        """From a snapshot's ``allocator_settings`` (only the conf string names the collector)."""
        return cls(
            expandable_segments=expandable,
            max_split_size_set=max_split_size is not None,
            roundup_power2_divisions_set=any(d > 1 for d in divisions.values()),
            garbage_collection_threshold_set="garbage_collection_threshold" in (conf or ""),
        )


@dataclass(frozen=True, slots=True, order=True)
class Setting:
    """One PYTORCH_CUDA_ALLOC_CONF option, as PyTorch spells it: ``expandable_segments:True``."""

    key: str
    value: str

    def __str__(self) -> str:
        return f"{self.key}:{self.value}"


def tried_settings(run: RunSettings, request_sizes: I64) -> tuple[Setting, ...]:
    """The settings to try on an input whose run used ``run``, given the sizes its program
    asked for (``request_sizes``: every recorded allocation's requested bytes)."""
    out: list[Setting] = []
    if not run.expandable_segments:
        out.append(Setting("expandable_segments", "True"))
        if not run.max_split_size_set:
            out += [Setting("max_split_size_mb", str(mb)) for mb in max_split_sizes(request_sizes)]
    if not run.garbage_collection_threshold_set:
        out.append(Setting("garbage_collection_threshold", GC_THRESHOLD))
    if not run.roundup_power2_divisions_set:
        out.append(Setting("roundup_power2_divisions", DIVISIONS))
    return tuple(out)


def recorded_requests(
    kind: npt.NDArray[np.int8], size: I64, live_at_end: Iterable[int]
) -> I64:
    """Every allocation a snapshot's device records: the requested bytes of its trace's
    ``alloc`` entries (``kind``, ``size``: its history as events) and of the blocks still live
    at the snapshot (``live_at_end``), which a state-only snapshot has alone."""
    return np.concatenate(
        [np.asarray(size)[np.asarray(kind) == ALLOC], np.fromiter(live_at_end, dtype=np.int64)]
    ).astype(np.int64)


def max_split_sizes(request_sizes: I64) -> list[int]:
    """max_split_size_mb values worth trying, in MB, ascending: the lower bounds of the (at most
    two) power-of-two size classes holding the most bytes of the requests above 20 MiB, so
    that the large blocks of those classes are never split by smaller requests. None when no
    request is that large (the option would change nothing)."""
    sizes = np.asarray(request_sizes, dtype=np.int64)
    large = sizes[sizes > (MIN_SPLIT_MB - 1) * MiB]
    if not len(large):
        return []
    classes = np.floor(np.log2(large / MiB)).astype(np.int64)
    found, where = np.unique(classes, return_inverse=True)
    held = np.bincount(where, weights=large.astype(np.float64))
    top = found[np.argsort(-held, kind="stable")[:MAX_SPLIT_CANDIDATES]]
    return sorted({max(int(1 << int(k)), MIN_SPLIT_MB) for k in top})

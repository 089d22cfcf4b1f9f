"""A snapshot device's request stream, from the columns: what ``whatif`` replays.

The blocks live at the window's start (rebuilt by the compiled backward walk) are allocated
first, in address order, at the first entry's time; then every ``alloc`` is a request, freed by
the ``free_completed`` (or legacy ``free``) of its address, or by the next ``alloc`` of that
address when its free went missing; an ``oom`` is a request that lives no longer than its own
entry (other policies get to try it); where the program called ``empty_cache()`` (whatif reads
where from the record), an EMPTY_CACHE event. Times are the entries' ``time_us`` in ns since
an origin (never decreasing), or entry numbers for a trace without times. A validation replay
starts instead from blocks already placed (``PlacedBlocks``), which are requests without
events.
``tests/test_snapshot_requests.py`` holds this to a plain reference over the record reader's
entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from nsysfrag import interpreted, jit
from nsysfrag.events import ALLOC, FAILED_ALLOC, FREE, FREE_COMPLETED, I64
from nsysfrag.models.segments.compiled import WindowLayout
from nsysfrag.models.snapshot_entries import HistoryColumns, history_times

EVENT_ALLOC = 0  # allocators.base.ALLOC
EVENT_FREE = 1  # allocators.base.FREE
EVENT_EMPTY_CACHE = 2  # allocators.base.EMPTY_CACHE
_NONE = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class SnapshotRequests:
    """One device's requests and their events, in order."""

    kind: npt.NDArray[np.int8]  # per event: EVENT_ALLOC, EVENT_FREE or EVENT_EMPTY_CACHE
    request: I64  # per event: the request it allocates or frees
    time_ns: I64  # per event
    entry: I64  # per event: the trace entry behind it, -1 for a block live at the window's start
    size: I64  # per request: requested bytes (> 0)
    stream: I64  # per request: index into stream_values, numbered by first request
    stream_values: I64  # the raw cudaStream_t of each stream index
    unmatched_frees: int  # frees of blocks the snapshot never shows
    entry_time_ns: I64  # per trace entry: its time as above
    timestamps: bool  # False: times are entry numbers


@dataclass(frozen=True)
class PlacedBlocks:
    """Blocks already in place before the first event (a validation replay's initial layout):
    requests 0 .. n - 1, in this order, with no event of their own."""

    address: I64
    size: I64  # requested bytes
    stream: I64  # raw cudaStream_t


def snapshot_requests(
    history: HistoryColumns,
    window: WindowLayout,
    empty_cache_at: I64 = _NONE,
    placed: PlacedBlocks | None = None,
    streams_first: I64 = _NONE,
    origin_us: int = 0,
) -> SnapshotRequests:
    """The request stream of a device with ``history`` whose window starts with ``window``
    (empty arrays for a device without any). ``empty_cache_at``: the history entries before
    which the program called empty_cache() (an EMPTY_CACHE event, request 0, there).
    ``placed``: the blocks live at the start, already placed (default: the window's live
    blocks, allocated by events at the first entry's time). ``streams_first``: raw streams
    numbered before any request's (a validation replay's segments). ``origin_us``: the time
    every event's time counts from (analyze's: the snapshot's earliest entry)."""
    action, address, size, stream = history.action, history.address, history.size, history.stream
    times, timestamps = history_times(history.time_us, origin_us)
    if placed is None:
        placed = _window_blocks(window)
        announce = True
    else:
        announce = False
    # Addresses -> slots, so the kernel keys live requests by a dense index.
    keys = np.unique(np.concatenate([placed.address, address]))
    n = len(action)
    cap = len(placed.address) + 3 * n + 1
    out = np.zeros((4, cap), np.int64)  # kind, request, time, entry
    req = np.zeros((2, cap), np.int64)  # size, raw stream
    empty_at = np.zeros(n, dtype=np.bool_)
    empty_at[empty_cache_at] = True
    counts = interpreted.chosen(_requests, n)(
        np.searchsorted(keys, placed.address), placed.size, placed.stream, announce,
        times[0] if n else 0, action, np.searchsorted(keys, address), size, stream, times,
        empty_at, len(keys), out, req,
    )  # fmt: skip
    events, requests, unmatched = (int(c) for c in counts)
    numbers, values = first_seen(np.concatenate([streams_first, req[1, :requests]]))
    return SnapshotRequests(
        kind=out[0, :events].astype(np.int8),
        request=out[1, :events].copy(),
        time_ns=out[2, :events].copy(),
        entry=out[3, :events].copy(),
        size=req[0, :requests].copy(),
        stream=numbers[len(streams_first) :],
        stream_values=values,
        unmatched_frees=unmatched,
        entry_time_ns=times,
        timestamps=timestamps,
    )


def first_seen(raw: I64) -> tuple[I64, I64]:
    """Each value of ``raw`` numbered in the order values first appear: (numbers, the values
    in that order)."""
    values, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    rank = np.empty(len(values), np.int64)
    rank[by_first] = np.arange(len(values))
    return rank[inverse.reshape(-1)], values[by_first]


def segment_of(window: WindowLayout, address: I64) -> I64:
    """The index of the window's segment holding each address, -1 for none."""
    k = np.searchsorted(window.segment_start, address, side="right") - 1
    ends = np.append(window.segment_end, np.iinfo(np.int64).min)  # k = -1: no segment below
    return np.where(address < ends[k], k, -1)


def _window_blocks(window: WindowLayout) -> PlacedBlocks:
    """The window's live blocks, in address order, with their requested bytes (or their size)
    and their segment's stream (0 outside every segment)."""
    size = np.where(
        window.block_requested > 0, window.block_requested, np.maximum(window.block_size, 0)
    )
    streams = np.append(window.segment_stream, 0)  # index -1: outside every segment
    stream = streams[segment_of(window, window.block_address)]
    return PlacedBlocks(window.block_address, size, stream)


@jit.njit(cache=True, nogil=True)
def _event(out, i, kind, request, t, entry):  # type: ignore[no-untyped-def]
    """Write event ``i`` into ``out`` (kind, request, time, entry rows); return i + 1."""
    out[0, i], out[1, i], out[2, i], out[3, i] = kind, request, t, entry
    return i + 1


@jit.njit(cache=True, nogil=True)
def _requests(  # type: ignore[no-untyped-def]
    initial_slot, initial_size, initial_stream, announce, t0, action, slot, size, stream, times,
    empty_at, n_keys, out, req,
):  # fmt: skip
    live = np.full(n_keys, -1, dtype=np.int64)
    events = 0
    requests = 0
    unmatched = 0
    for i in range(len(initial_slot)):
        if initial_size[i] > 0:
            req[0, requests], req[1, requests] = initial_size[i], initial_stream[i]
            live[initial_slot[i]] = requests
            if announce:
                events = _event(out, events, EVENT_ALLOC, requests, t0, -1)
            requests += 1
    for j in range(len(action)):
        a = action[j]
        k = slot[j]
        t = times[j]
        if empty_at[j]:  # the program called empty_cache() here
            events = _event(out, events, EVENT_EMPTY_CACHE, 0, t, j)
        if (a == ALLOC or a == FAILED_ALLOC) and size[j] > 0:
            if a == ALLOC and live[k] >= 0:  # its free went missing
                events = _event(out, events, EVENT_FREE, live[k], t, j)
            req[0, requests], req[1, requests] = size[j], stream[j]
            events = _event(out, events, EVENT_ALLOC, requests, t, j)
            if a == ALLOC:
                live[k] = requests
            else:  # the run could not place it: other policies try, and it lives no longer
                events = _event(out, events, EVENT_FREE, requests, t, j)
            requests += 1
        elif a == FREE_COMPLETED or a == FREE:
            if live[k] < 0:
                unmatched += 1
            else:
                events = _event(out, events, EVENT_FREE, live[k], t, j)
                live[k] = -1
    return events, requests, unmatched

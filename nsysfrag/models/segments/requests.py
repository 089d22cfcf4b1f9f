"""A snapshot device's request stream, from the columns: what ``whatif`` replays.

The blocks live at the window's start (rebuilt by the compiled backward walk) are allocated
first, in address order, at the first entry's time; then every ``alloc`` is a request, freed by
the ``free_completed`` (or legacy ``free``) of its address, or by the next ``alloc`` of that
address when its free went missing; an ``oom`` is a request that lives no longer than its own
entry (other policies get to try it). Times are the entries' ``time_us`` in ns (never
decreasing), or entry numbers for a trace without times. This is, array for array, what
``whatif.snapshot_sources`` builds from the record reader (``tests/test_snapshot_requests.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

from nsysfrag.events import (
    ALLOC,
    FAILED_ALLOC,
    FREE,
    FREE_COMPLETED,
    I64,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
)
from nsysfrag.inputs.torch_snapshot.columns import EMPTY_HISTORY, NO_TIME, SnapshotColumns
from nsysfrag.inputs.torch_snapshot.spaces import columns_events
from nsysfrag.models.segments.compiled import WindowLayout, window_start
from nsysfrag.models.segments.rules import AllocatorSettings

EVENT_ALLOC = 0  # allocators.base.ALLOC
EVENT_FREE = 1  # allocators.base.FREE
EVENT_EMPTY_CACHE = 2  # allocators.base.EMPTY_CACHE


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
    recorded_reserved: I64  # per trace entry: reserved bytes after it, from the segment entries
    window: WindowLayout  # the layout at the window's start


def snapshot_requests(
    columns: SnapshotColumns, device: int, empty_cache_at: Iterable[int] = ()
) -> SnapshotRequests:
    """The request stream of ``device`` (empty arrays for a device without any);
    ``empty_cache_at``: the history entries before which the program called empty_cache()
    (an EMPTY_CACHE event, request 0, there)."""
    history = columns.histories.get(device, EMPTY_HISTORY)
    settings = AllocatorSettings(
        columns.roundup_power2_divisions, columns.max_split_size, columns.expandable_segments
    )
    final = [s for s in columns.segments if s.device == device]
    window = window_start(columns_events(columns, device)[0], final, settings)
    action, address, size, stream = history.action, history.address, history.size, history.stream
    times, timestamps = _times(history.time_us)
    # Addresses -> slots, so the kernel keys live requests by a dense index.
    keys = np.unique(np.concatenate([window.block_address, address]))
    initial_size = np.where(
        window.block_requested > 0, window.block_requested, np.maximum(window.block_size, 0)
    )
    starts = window.segment_start
    k = np.searchsorted(starts, window.block_address, side="right") - 1
    inside = (k >= 0) & (window.block_address < window.segment_end[np.maximum(k, 0)])
    initial_stream = np.where(inside, window.segment_stream[np.maximum(k, 0)], 0)
    n = len(action)
    cap = len(window.block_address) + 3 * n + 1
    out = np.zeros((4, cap), np.int64)  # kind, request, time, entry
    req = np.zeros((2, cap), np.int64)  # size, raw stream
    empty_at = np.zeros(n, dtype=np.bool_)
    empty_at[np.asarray(list(empty_cache_at), dtype=np.int64)] = True
    counts = _requests(
        np.searchsorted(keys, window.block_address), initial_size, initial_stream,
        times[0] if n else 0, action, np.searchsorted(keys, address), size, stream, times,
        empty_at, len(keys), out, req,
    )  # fmt: skip
    events, requests, unmatched = (int(c) for c in counts)
    raw = req[1, :requests]
    # Streams numbered by the first request on each, as whatif numbers them.
    values, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    rank = np.empty(len(values), np.int64)
    rank[by_first] = np.arange(len(values))
    initial_reserved = int((window.segment_end - window.segment_start).sum())
    grows = np.isin(action, [SEGMENT_ALLOC, SEGMENT_MAP])
    shrinks = np.isin(action, [SEGMENT_FREE, SEGMENT_UNMAP])
    reserved = initial_reserved + np.cumsum(np.where(grows, size, 0) - np.where(shrinks, size, 0))
    return SnapshotRequests(
        kind=out[0, :events].astype(np.int8),
        request=out[1, :events].copy(),
        time_ns=out[2, :events].copy(),
        entry=out[3, :events].copy(),
        size=req[0, :requests].copy(),
        stream=rank[inverse.reshape(-1)],
        stream_values=values[by_first],
        unmatched_frees=unmatched,
        entry_time_ns=times,
        timestamps=timestamps,
        recorded_reserved=reserved.astype(np.int64),
        window=window,
    )


def _times(time_us: I64) -> tuple[I64, bool]:
    """ns per entry, never decreasing (an entry without a time takes the one before it, the
    first ones the first time there is); entry numbers when the trace has no times at all."""
    present = time_us != NO_TIME
    if not present.any():
        return np.arange(len(time_us), dtype=np.int64), False
    t = np.where(present, time_us, np.iinfo(np.int64).min)
    t[0] = max(int(t[0]), int(time_us[np.argmax(present)]))
    return np.maximum.accumulate(t) * 1000, True


@numba.njit(cache=True, nogil=True)
def _event(out, i, kind, request, t, entry):  # type: ignore[no-untyped-def]
    """Write event ``i`` into ``out`` (kind, request, time, entry rows); return i + 1."""
    out[0, i], out[1, i], out[2, i], out[3, i] = kind, request, t, entry
    return i + 1


@numba.njit(cache=True, nogil=True)
def _requests(  # type: ignore[no-untyped-def]
    initial_slot, initial_size, initial_stream, t0, action, slot, size, stream, times,
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

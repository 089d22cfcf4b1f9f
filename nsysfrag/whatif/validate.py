"""The ``torch`` model against a snapshot's own history (``whatif --validate``).

``validate_snapshot`` starts from the layout at the start of the recorded window (rebuilt by
:func:`nsysfrag.segments_model.window_start`), replays the recorded requests with the
snapshot's allocator settings, and compares the ``segment_alloc`` (``segment_map`` for
expandable segments) sizes and the peak reserved bytes with what the allocator recorded.
The device's capacity is not in the snapshot, so the replay runs on an unlimited device and
takes the device's refusals from the record: a run of ``segment_free``/``segment_unmap``
right before a request's segment allocation marks that request (its first device allocation
fails, unless a cached block fits it — then the release was an ``empty_cache()`` just before
it); an ``oom`` entry is a request every attempt fails for; a release anywhere else is an
``empty_cache()``. Garbage collection inside a malloc would be read as an OOM retry.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np

from nsysfrag.allocators import TorchConfig
from nsysfrag.allocators.base import (
    EMPTY_CACHE,
    FAIL_ALL,
    FAIL_NONE,
    FAIL_RELEASE,
    FREE,
    I64,
    LOG_SEGMENT_ALLOC,
    LOG_SEGMENT_MAP,
    UNLIMITED,
)
from nsysfrag.allocators.torch import simulate_torch
from nsysfrag.segments_model import window_start
from nsysfrag.snapshot_reader import Snapshot, TraceEntry
from nsysfrag.whatif.layout import ES_VA_VALIDATION, layout_of
from nsysfrag.whatif.streams import (
    StreamBuilder,
    recorded_reserved,
    snapshot_times,
    stream_index,
    stream_names,
)

VALIDATION_TARGET_MATCH = 0.95
VALIDATION_TARGET_PEAK = 0.01


@dataclass(frozen=True)
class DeviceValidation:
    device: int
    recorded_segment_allocs: int
    simulated_segment_allocs: int
    matched_segment_allocs: int
    action: str  # segment_alloc, or segment_map for expandable segments
    peak_reserved_recorded_bytes: int
    peak_reserved_simulated_bytes: int
    initial_reserved_bytes: int
    requests: int
    forced_failures: int  # requests on which the recorded run took its OOM path
    empty_cache_calls: int
    note: str | None = None

    @property
    def segment_alloc_match(self) -> float | None:
        if self.recorded_segment_allocs == 0:
            return None
        return self.matched_segment_allocs / self.recorded_segment_allocs

    @property
    def peak_error(self) -> float | None:
        if self.peak_reserved_recorded_bytes == 0:
            return None
        return (
            self.peak_reserved_simulated_bytes - self.peak_reserved_recorded_bytes
        ) / self.peak_reserved_recorded_bytes


@dataclass(frozen=True)
class Validation:
    """The torch model against a snapshot's recorded segment history, all devices together."""

    settings: str
    devices: list[DeviceValidation]

    @property
    def recorded(self) -> int:
        return sum(d.recorded_segment_allocs for d in self.devices)

    @property
    def segment_alloc_match(self) -> float | None:
        if self.recorded == 0:
            return None
        return sum(d.matched_segment_allocs for d in self.devices) / self.recorded

    @property
    def peak_reserved_simulated_bytes(self) -> int:
        return sum(d.peak_reserved_simulated_bytes for d in self.devices)

    @property
    def peak_reserved_recorded_bytes(self) -> int:
        return sum(d.peak_reserved_recorded_bytes for d in self.devices)

    @property
    def peak_error(self) -> float | None:
        rec = self.peak_reserved_recorded_bytes
        return None if rec == 0 else (self.peak_reserved_simulated_bytes - rec) / rec

    @property
    def meets_target(self) -> bool | None:
        match, err = self.segment_alloc_match, self.peak_error
        if match is None or err is None:
            return None
        return match >= VALIDATION_TARGET_MATCH and abs(err) <= VALIDATION_TARGET_PEAK


@numba.njit(cache=True)
def _lcs_length(a: I64, b: I64) -> int:
    """Length of the longest common subsequence (two-row dynamic programme)."""
    m = len(b)
    prev = np.zeros(m + 1, dtype=np.int64)
    cur = np.zeros(m + 1, dtype=np.int64)
    for i in range(len(a)):
        ai = a[i]
        for j in range(m):
            if ai == b[j]:
                cur[j + 1] = prev[j] + 1
            else:
                cur[j + 1] = max(prev[j + 1], cur[j])
        prev, cur = cur, prev
    return int(prev[m])


def matched_in_order(recorded: Sequence[int], simulated: Sequence[int]) -> int:
    """How many recorded sizes the simulation reproduced, same size and same order (LCS)."""
    if not recorded or not simulated:
        return 0
    if len(recorded) * len(simulated) <= 400_000_000:
        return _lcs_length(np.asarray(recorded, np.int64), np.asarray(simulated, np.int64))
    # Too long for the exact programme: matching blocks are a common subsequence (a lower bound).
    blocks = difflib.SequenceMatcher(None, list(recorded), list(simulated), autojunk=False)
    return sum(m.size for m in blocks.get_matching_blocks())


def validate_snapshot(snap: Snapshot) -> Validation:
    """Replay each device's recorded requests through ``torch`` with the snapshot's settings,
    from the layout at the start of its window, and compare with the recorded segments."""
    config = TorchConfig.from_settings(
        snap.max_split_size, snap.roundup_power2_divisions,
        snap.expandable_segments, snap.allocator_conf,
    )  # fmt: skip
    devices = [_validate_device(snap, d, config) for d in snap.devices()]
    return Validation(config.conf_string() or "defaults", [d for d in devices if d is not None])


def _validate_device(snap: Snapshot, device: int, config: TorchConfig) -> DeviceValidation | None:
    final = [s for s in snap.segments if s.device == device]
    trace = snap.traces.get(device, [])
    if not trace:
        return None
    start = window_start(final, trace)
    names: dict[int, int] = {}
    b = StreamBuilder()
    layout, live, _ = layout_of(start, config, names, b)
    times = snapshot_times(trace)
    fail_at, empty_cache_at = _release_paths(trace)
    recorded_action = "segment_map" if config.expandable_segments else "segment_alloc"
    other = "segment_alloc" if config.expandable_segments else "segment_map"
    if not any(e.action == recorded_action for e in trace) and any(e.action == other for e in trace):
        recorded_action = other  # expandable segments were toggled at run time
    recorded = [e.size for e in trace if e.action == recorded_action]
    forced = 0
    for j, (e, t) in enumerate(zip(trace, times, strict=True)):
        if j in empty_cache_at:
            b.event(EMPTY_CACHE, 0, t)
        a = e.action
        if a == "alloc" and e.size > 0:
            if e.address in live:
                b.event(FREE, live.pop(e.address), t)
            fail = FAIL_RELEASE if j in fail_at else FAIL_NONE
            forced += fail != FAIL_NONE
            live[e.address] = b.alloc(e.size, stream_index(names, e.stream), t, fail)
        elif a in ("free_completed", "free"):
            r_id = live.pop(e.address, None)
            if r_id is not None:
                b.event(FREE, r_id, t)
        elif a == "oom" and e.size > 0:
            forced += 1
            r_id = b.alloc(e.size, stream_index(names, e.stream), t, FAIL_ALL)
    if not b.kind:
        b.event(EMPTY_CACHE, 0, times[0] if times else 0)  # a no-op: keeps the arrays non-empty
    if not b.size:
        b.new_request(1, 0)  # EMPTY_CACHE events name request 0
    stream = b.build(stream_names(names))
    result = simulate_torch(stream, UNLIMITED, config, layout, es_va_bytes=ES_VA_VALIDATION)
    kind_wanted = LOG_SEGMENT_MAP if recorded_action == "segment_map" else LOG_SEGMENT_ALLOC
    simulated = result.segment_log["size"][result.segment_log["kind"] == kind_wanted].tolist()
    initial_reserved = layout.reserved_bytes
    series = recorded_reserved(initial_reserved, trace)
    recorded_peak = max([initial_reserved, *series])
    simulated_peak = max(initial_reserved, int(result.reserved_bytes.max()) if stream.n_events else 0)
    note = None
    if not recorded:
        note = f"the trace has no {recorded_action} event to compare"
    return DeviceValidation(
        device=device,
        recorded_segment_allocs=len(recorded),
        simulated_segment_allocs=len(simulated),
        matched_segment_allocs=matched_in_order(recorded, simulated),
        action=recorded_action,
        peak_reserved_recorded_bytes=recorded_peak,
        peak_reserved_simulated_bytes=simulated_peak,
        initial_reserved_bytes=initial_reserved,
        requests=stream.n_requests,
        forced_failures=forced,
        empty_cache_calls=len(empty_cache_at),
        note=note,
    )


def _release_paths(trace: Sequence[TraceEntry]) -> tuple[set[int], set[int]]:
    """Where the recorded run released memory: (entries of allocations whose malloc took the
    OOM path first, entries where an empty_cache() began).

    A run of segment_free/segment_unmap followed (through segment_alloc/segment_map only) by an
    alloc is that malloc's OOM retry; followed by an oom, the failed malloc's own release
    (the oom entry itself forces that); followed by anything else, an empty_cache() call —
    the one release no allocator model can predict.
    """
    fail_at: set[int] = set()
    empty_at: set[int] = set()
    n = len(trace)
    j = 0
    while j < n:
        a = trace[j].action
        if a not in ("segment_free", "segment_unmap"):
            j += 1
            continue
        first = j
        while j < n and trace[j].action in ("segment_free", "segment_unmap"):
            j += 1
        k = j
        while k < n and trace[k].action in ("segment_alloc", "segment_map"):
            k += 1
        nxt = trace[k].action if k < n else None
        if nxt == "alloc":
            fail_at.add(k)
        elif nxt != "oom":
            empty_at.add(first)
    return fail_at, empty_at

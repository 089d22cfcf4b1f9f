"""The ``torch`` model against a snapshot's own history (``whatif --validate``, and the model
error every what-if of a snapshot quotes).

``validate_snapshot`` starts from the layout at the start of the recorded window (rebuilt by
the compiled backward walk, laid out for the model by :mod:`nsysfrag.whatif.layout`), replays
the recorded requests with the snapshot's allocator settings on the device the record implies
(:mod:`nsysfrag.whatif.capacity`), and compares the ``segment_alloc`` (``segment_map`` for
expandable segments) sizes and the peak reserved bytes with what the allocator recorded. The
model meets the device's limit on its own and takes PyTorch's OOM path there (garbage
collection, then releasing cached blocks and retrying); only the program's own
``empty_cache()`` calls come from the record.

Where the record cannot say how the run was set up, each reading is replayed and the one that
leaves the fewest of the recorded releases to the program, then reproduces the most, is kept
(its note says which): ``garbage_collection_threshold`` collects only under a memory fraction
(``torch.cuda.set_per_process_memory_fraction``), which no snapshot records, so a run with the
threshold is replayed with the collector, on the allowed maximum its collections imply, and
without it, on the capacity its OOM retries imply.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from nsysfrag import interpreted, jit
from nsysfrag.allocators import TorchConfig
from nsysfrag.allocators.base import (
    ALLOC,
    EMPTY_CACHE,
    FREE,
    I64,
    LOG_SEGMENT_ALLOC,
    LOG_SEGMENT_FREE,
    LOG_SEGMENT_MAP,
    LOG_SEGMENT_UNMAP,
    RequestStream,
)
from nsysfrag.allocators.torch import simulate_torch
from nsysfrag.events import FREE_COMPLETED, FREE_REQUESTED, SEGMENT_ALLOC, SEGMENT_MAP
from nsysfrag.inputs.torch_snapshot.columns import HistoryColumns, SnapshotColumns
from nsysfrag.models.segments.requests import (
    PlacedBlocks,
    SnapshotRequests,
    first_seen,
    segment_of,
    snapshot_requests,
)
from nsysfrag.releases import KIND_NAMES
from nsysfrag.whatif.capacity import Record, RecordedDevice, recorded_devices, replay_capacity
from nsysfrag.whatif.layout import ES_VA_VALIDATION, StartLayout, start_layout
from nsysfrag.whatif.streams import snapshot_config, stream_names

VALIDATION_TARGET_MATCH = 0.95
_NEW_SEGMENT = {"segment_alloc": SEGMENT_ALLOC, "segment_map": SEGMENT_MAP}
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
    capacity_bytes: int  # the device the replay ran on (UNLIMITED: no limit)
    capacity_source: str
    recorded_oom_paths: int  # mallocs that released cached memory first (OOM retry, GC, OOM)
    simulated_oom_paths: int  # mallocs that released cached memory first in the model
    empty_cache_calls: int  # the program's own releases, replayed as such
    note: str | None = None
    # garbage_collection_threshold set: whether the replay kept ran the collector (the record
    # read as a run under a memory fraction); None when the threshold is not set
    collector: bool | None = None
    # Each recorded burst of segment frees / unmaps by whose it was, in the order of
    # nsysfrag.releases.KIND_NAMES: empty_cache(), OOM retry, garbage collection, unknown.
    release_bursts: tuple[int, ...] = (0, 0, 0, 0)

    @property
    def release_counts(self) -> dict[str, int]:
        """The bursts by kind, with the JSON's names."""
        return dict(zip(KIND_NAMES, self.release_bursts, strict=True))

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


@jit.njit(cache=True)
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


_PAIRS_PER_ITEM = 20  # pairs of the LCS programme per event of a replay, in interpreted time


def matched_in_order(recorded: Sequence[int], simulated: Sequence[int]) -> int:
    """How many recorded sizes the simulation reproduced, same size and same order (LCS)."""
    if not recorded or not simulated:
        return 0
    if len(recorded) * len(simulated) <= 400_000_000:
        # The programme takes a step per pair: interpreted, only a few thousand pairs' worth.
        lcs = interpreted.chosen(_lcs_length, len(recorded) * len(simulated) // _PAIRS_PER_ITEM)
        return lcs(np.asarray(recorded, np.int64), np.asarray(simulated, np.int64))
    # Too long for the exact programme: matching blocks are a common subsequence (a lower bound).
    blocks = difflib.SequenceMatcher(None, list(recorded), list(simulated), autojunk=False)
    return sum(m.size for m in blocks.get_matching_blocks())


def validate_snapshot(
    columns: SnapshotColumns,
    capacity: int | None = None,
    devices: Sequence[RecordedDevice] | None = None,
) -> Validation:
    """Replay each device's recorded requests through ``torch`` with the snapshot's settings,
    from the layout at the start of its window, and compare with the recorded segments.
    ``capacity`` (--capacity) is the device when the record implies none; ``devices``: the
    snapshot's devices, where already read."""
    config = snapshot_config(columns)
    if devices is None:
        devices = recorded_devices(columns)
    checked = [_validate_device(d, config, capacity) for d in devices if d.traced]
    return Validation(config.conf_string() or "defaults", checked)


def _validate_device(
    d: RecordedDevice, config: TorchConfig, capacity: int | None = None
) -> DeviceValidation:
    window, record, history = d.window, d.record, d.history
    start = start_layout(window, config, first_seen(window.segment_stream)[0])
    recorded_action = "segment_map" if config.expandable_segments else "segment_alloc"
    other = "segment_alloc" if config.expandable_segments else "segment_map"
    count = {a: int((history.action == code).sum()) for a, code in _NEW_SEGMENT.items()}
    if not count[recorded_action] and count[other]:
        recorded_action = other  # expandable segments were toggled at run time
    recorded = history.size[history.action == _NEW_SEGMENT[recorded_action]].tolist()
    readings = _readings(record, config, capacity)
    replays = [
        _replay(d, start, recorded, recorded_action, c, cap, source, note)
        for c, (cap, source), note in readings
    ]
    if len(readings) > 1:  # read with and without the collector
        replays = [replace(r, collector=c.garbage_collection_threshold > 0)
                   for r, (c, _, _) in zip(replays, readings, strict=True)]  # fmt: skip
    # The reading that leaves the fewest of the record's releases to the program, then
    # reproduces the most; the recorded settings win a tie.
    best = min(replays, key=lambda r: (r.empty_cache_calls, -r.matched_segment_allocs,
                                       abs(r.peak_error or 0.0)))  # fmt: skip
    if not recorded:
        return replace(best, note=f"the trace has no {recorded_action} event to compare")
    return best


def _readings(
    record: Record, config: TorchConfig, capacity: int | None
) -> list[tuple[TorchConfig, tuple[int, str], str | None]]:
    """What the record may mean where it cannot say: the settings to replay, the capacity,
    and a note. ``garbage_collection_threshold`` works only under a memory fraction
    (torch.cuda.set_per_process_memory_fraction), which a snapshot does not record: with the
    collector the device is the allowed maximum its collections imply; without it, as with
    every other setting, the capacity the record's OOM retries imply."""
    plain = replay_capacity(capacity, record)
    if plain[0] < record.peak:  # the run held more than that earlier: the device changed
        plain = record.peak, (
            f"the recorded peak reserved: {plain[1]} puts the device below what the run held"
            " earlier, so its free memory changed during the run"
        )
    gc = config.garbage_collection_threshold
    if gc <= 0 or config.expandable_segments:  # the collector frees no expandable block
        return [(config, plain, None)]
    collected = record.collector_capacity(gc)
    off = replace(config, garbage_collection_threshold=0.0)
    return [
        (config, collected or plain, "replayed with garbage collection, as under a memory"
                                     " fraction (a snapshot does not record one)"),
        (off, plain, "replayed without garbage collection: the record reads as a run without a"
                     " memory fraction, where garbage_collection_threshold does nothing"),
    ]  # fmt: skip


def _replay(
    d: RecordedDevice, start: StartLayout, recorded: list[int], recorded_action: str,
    config: TorchConfig, cap: int, cap_source: str, note: str | None,
) -> DeviceValidation:  # fmt: skip
    """Replay the device's requests with ``config`` on ``cap`` bytes, from ``start``."""
    window, record, history = d.window, d.record, d.history
    layout = start.layout
    empty_at = record.program_releases(cap, config.garbage_collection_threshold)
    kinds = record.release_kinds(cap, config.garbage_collection_threshold)
    k = start.placed
    placed_size = layout.block_size[layout.block_state == 1]
    requested = window.block_requested[k]
    placed = PlacedBlocks(
        window.block_address[k],
        np.where(requested > 0, requested, placed_size),
        window.segment_stream[segment_of(window, window.block_address[k])],
    )
    req = snapshot_requests(history, window, empty_at, placed, window.segment_stream)
    allocator_runs = np.setdiff1d(record.runs.first, empty_at)
    pending = _pending_frees(history, req, allocator_runs)
    kind, request, time_ns = req.kind, req.request, req.time_ns
    if not len(kind):  # a no-op keeps the arrays non-empty
        kind, request = np.array([EMPTY_CACHE]), np.zeros(1, dtype=np.int64)
        time_ns = req.entry_time_ns[:1] if len(req.entry_time_ns) else np.zeros(1, np.int64)
    size, streams = req.size, req.stream
    if not len(size):  # EMPTY_CACHE events name request 0
        size, streams = np.ones(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    stream = RequestStream.build(
        kind, request, time_ns, size, streams, stream_names(req.stream_values)
    )
    if len(pending) < stream.n_requests:  # the placeholder request of an empty stream
        pending = np.zeros(stream.n_requests, dtype=np.int64)
    result = simulate_torch(stream, cap, config, layout, es_va_bytes=ES_VA_VALIDATION,
                            pending_frees=pending)  # fmt: skip
    log = result.segment_log
    kind_wanted = LOG_SEGMENT_MAP if recorded_action == "segment_map" else LOG_SEGMENT_ALLOC
    simulated = log["size"][log["kind"] == kind_wanted].tolist()
    released = np.isin(log["kind"], (LOG_SEGMENT_FREE, LOG_SEGMENT_UNMAP))
    in_malloc = np.unique(log["event"][released])
    simulated_oom_paths = int((stream.kind[in_malloc] == ALLOC).sum())
    simulated_peak = max(record.initial, int(result.reserved_bytes.max()) if stream.n_events else 0)
    return DeviceValidation(
        device=d.device,
        recorded_segment_allocs=len(recorded),
        simulated_segment_allocs=len(simulated),
        matched_segment_allocs=matched_in_order(recorded, simulated),
        action=recorded_action,
        peak_reserved_recorded_bytes=record.peak,
        peak_reserved_simulated_bytes=simulated_peak,
        initial_reserved_bytes=record.initial,
        requests=stream.n_requests,
        capacity_bytes=cap,
        capacity_source=cap_source,
        recorded_oom_paths=len(record.runs.first) - len(empty_at),
        simulated_oom_paths=simulated_oom_paths,
        empty_cache_calls=len(empty_at),
        note=note,
        release_bursts=tuple(np.bincount(kinds, minlength=len(KIND_NAMES)).tolist()),
    )


def _pending_frees(history: HistoryColumns, req: SnapshotRequests, allocator_runs: I64) -> I64:
    """Per request: 1 where its free waited on another stream and completed in the OOM path
    of the malloc that followed.

    A free the program asked for while another stream still used the block completes when
    PyTorch sees the stream's event: polled at a malloc's start, or waited for in
    ``release_cached_blocks`` before it frees the cached segments; either way its
    ``free_completed`` lies right before that malloc's releases, and the record does not say
    which. But the malloc's cache search failed, or it would have released nothing: the
    replay completes such a free in the OOM path, where a block the search could have used
    must have completed. A ``free_completed`` right after its own ``free_requested`` is an
    ordinary free (or one whose event had completed by then): it stays where it is."""
    action, address = history.action, history.address
    n = len(action)
    flags = np.zeros(len(req.size), dtype=np.int64)
    if not len(allocator_runs):
        return flags
    completed = action == FREE_COMPLETED
    ordinary = np.zeros(n, dtype=np.bool_)
    ordinary[1:] = (action[:-1] == FREE_REQUESTED) & (address[:-1] == address[1:])
    others = np.append(np.flatnonzero(~completed), n)
    then = others[np.searchsorted(others, np.arange(n))]  # the next entry that is not one
    at_run = np.zeros(n + 1, dtype=np.bool_)
    at_run[allocator_runs] = True
    in_oom_path = completed & ~ordinary & at_run[then]
    frees = (req.kind == FREE) & (req.entry >= 0)
    flags[req.request[frees][in_oom_path[req.entry[frees]]]] = 1
    return flags

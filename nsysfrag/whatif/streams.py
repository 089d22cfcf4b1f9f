"""Request streams: what every policy replays, built from a PyTorch memory snapshot (one per
device) or an nsys export (one per process and device).

A snapshot gives tensor-level requests: its ``alloc`` and ``free_completed`` entries with their
streams; the blocks live at the start of the window (rebuilt by
:func:`nsysfrag.models.segments.window.window_start`) are allocated first, in address order; an ``oom``
entry is a request that is freed at once. An nsys export gives the driver-level allocations of
each space with the observed model's lifetimes (SPEC §2).

:func:`snapshot_streams` is the one place a snapshot becomes request streams.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nsysfrag.allocators import Policy, TorchConfig, parse_policy
from nsysfrag.allocators.base import ALLOC, EMPTY_CACHE, FREE, RequestStream
from nsysfrag.allocators.torch import split_options
from nsysfrag.inputs.torch_snapshot.reader import HistoryEntry, Snapshot, read_snapshot
from nsysfrag.models.segments.layout import SegmentSet
from nsysfrag.models.segments.window import window_start
from nsysfrag.models.series import ALLOCATED
from nsysfrag.whatif.capacity import read_record, replay_capacity, snapshot_capacity


@dataclass
class StreamBuilder:
    """Collects events in order; requests get ids as they are allocated."""

    kind: list[int] = field(default_factory=list)
    request: list[int] = field(default_factory=list)
    time_ns: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)

    def new_request(self, size: int, stream: int) -> int:
        self.size.append(size)
        self.stream.append(stream)
        return len(self.size) - 1

    def event(self, kind: int, request: int, t: int) -> None:
        self.kind.append(kind)
        self.request.append(request)
        self.time_ns.append(t)

    def alloc(self, size: int, stream: int, t: int) -> int:
        r = self.new_request(size, stream)
        self.event(ALLOC, r, t)
        return r

    def build(self, stream_names: tuple[str, ...]) -> RequestStream:
        return RequestStream.build(
            self.kind, self.request, self.time_ns, self.size, self.stream, stream_names
        )


@dataclass(frozen=True)
class RequestSource:
    """One request stream and what is known about where it came from."""

    label: str
    pid: int | None
    device: int
    stream: RequestStream
    capacity_bytes: int
    capacity_source: str
    baseline: Policy
    recorded_peak_reserved_bytes: int | None
    warnings: list[str]
    segments_suspected: bool = False
    validatable: bool = False  # a recorded trace the baseline can be checked against
    timestamps: bool = True  # False: times are trace entry numbers (snapshots before 2.1)


def stream_index(names: dict[int, int], raw: int) -> int:
    if raw not in names:
        names[raw] = len(names)
    return names[raw]


def stream_names(names: dict[int, int]) -> tuple[str, ...]:
    out = [""] * max(len(names), 1)
    for raw, i in names.items():
        out[i] = "default" if raw == 0 else hex(raw)
    if not names:
        out[0] = "default"
    return tuple(out)


def snapshot_times(trace: Sequence[HistoryEntry]) -> list[int]:
    """ns per entry, never decreasing; entry numbers when the snapshot has no timestamps."""
    stamps = [e.time_us for e in trace]
    if not any(t is not None for t in stamps):
        return list(range(len(trace)))
    out, last = [], next(t for t in stamps if t is not None) * 1000
    for t in stamps:
        if t is not None:
            last = max(last, t * 1000)
        out.append(last)
    return out


def segment_stream(segs: SegmentSet, address: int) -> int:
    start = segs.find(address)
    return segs.seg[start].stream if start is not None else 0


def trace_events(
    b: StreamBuilder, trace: Sequence[HistoryEntry], times: Sequence[int], names: dict[int, int],
    live: dict[int, int], empty_at: set[int],
) -> int:  # fmt: skip
    """Add a snapshot trace's requests to ``b``: each ``alloc`` a request, freed at its
    ``free_completed``; an ``oom`` a request freed at once (the run could not place it; other
    policies try); an ``empty_cache()`` where ``empty_at`` says the program called it.
    ``live`` maps the addresses of live requests to their ids. Returns the frees of blocks
    the snapshot never shows (skipped)."""
    unmatched = 0
    for j, (e, t) in enumerate(zip(trace, times, strict=True)):
        if j in empty_at:
            b.event(EMPTY_CACHE, 0, t)
        a = e.action
        if a == "alloc" and e.size > 0:
            if e.address in live:  # its free went missing
                b.event(FREE, live.pop(e.address), t)
            live[e.address] = b.alloc(e.size, stream_index(names, e.stream), t)
        elif a in ("free_completed", "free"):
            r_id = live.pop(e.address, None)
            if r_id is None:
                unmatched += 1
            else:
                b.event(FREE, r_id, t)
        elif a == "oom" and e.size > 0:
            r_id = b.alloc(e.size, stream_index(names, e.stream), t)
            b.event(FREE, r_id, t)
    return unmatched


def snapshot_streams(path: Path, capacity: int | None) -> tuple[list[RequestSource], list[str], Snapshot]:
    """One request stream per device of a PyTorch snapshot."""
    snap = read_snapshot(path)
    config = TorchConfig.from_settings(
        snap.max_split_size, snap.roundup_power2_divisions, snap.expandable_segments,
        snap.allocator_conf,
    )  # fmt: skip
    as_run = as_run_policy(config)
    notes = [f"{snap.layout}"]
    if not any(snap.histories.get(d) for d in snap.devices()):
        notes.append(
            "the snapshot has no trace (state only): the request stream is its live blocks,"
            " allocated once in address order"
        )
    sources = []
    for device in snap.devices():
        final = [s for s in snap.segments if s.device == device]
        trace = snap.histories.get(device, [])
        start = window_start(final, trace)
        times = snapshot_times(trace)
        t0 = times[0] if times else 0
        names: dict[int, int] = {}
        b = StreamBuilder()
        live: dict[int, int] = {}
        for address, r in sorted(start.blocks.items()):
            size = r.requested or r.size or 0
            if size <= 0:
                continue
            raw = segment_stream(start.segments, address)
            live[address] = b.alloc(size, stream_index(names, raw), t0)
        initial_reserved = sum(
            start.segments.seg[s].end - s for s in start.segments.starts
        )
        record = read_record(trace, initial_reserved)
        replay_cap, _ = replay_capacity(capacity, record)
        empty_at = set(record.program_releases(replay_cap, config.garbage_collection_threshold))
        unmatched = trace_events(b, trace, times, names, live, empty_at)
        if not b.kind:
            continue
        warnings = []
        if unmatched:
            warnings.append(f"{unmatched} free(s) of blocks the snapshot never shows were skipped")
        recorded_peak = record.peak if (trace or final) else None
        cap, cap_source = snapshot_capacity(capacity, record)
        sources.append(
            RequestSource(
                label=f"device {device}",
                pid=None,
                device=device,
                stream=b.build(stream_names(names)),
                capacity_bytes=cap,
                capacity_source=cap_source,
                baseline=as_run,
                recorded_peak_reserved_bytes=recorded_peak,
                warnings=warnings,
                timestamps=any(e.time_us is not None for e in trace),
                validatable=bool(trace),
            )
        )
    return sources, notes, snap


def as_run_policy(config: TorchConfig) -> Policy:
    """The torch policy the snapshot's run used (PyTorch's defaults when it set nothing)."""
    conf = config.conf_string()
    if not conf:
        return Policy("torch")
    items = [item.replace(":", "=", 1) for item in split_options(conf)]
    return Policy("torch", config, label="torch:" + ",".join(items))


def nsys_streams(path: Path, capacity: int | None) -> tuple[list[RequestSource], list[str]]:
    """One request stream per (process, device) of an nsys export: its driver-level
    allocations and frees (SPEC §2 lifetimes: a free, or an overlapping allocation)."""
    from nsysfrag.analysis import analyze
    from nsysfrag.inputs import InputOptions
    from nsysfrag.inputs.nsys import read_export

    analysis = analyze(read_export(path, InputOptions(capacity_bytes=capacity)))
    notes = [
        (
            "the request stream is the driver-level allocations nsys recorded (cudaMalloc,"
            " cuMemAlloc, …): tensors only when the run used PYTORCH_NO_CUDA_MEMORY_CACHING=1;"
            " nsys memory events carry no CUDA stream here, so all requests share one stream"
        ),
        *analysis.warnings,
    ]
    baseline = parse_policy("torch")
    sources = []
    for s in analysis.spaces:
        tl = s.timeline
        allocs = np.flatnonzero(tl.event == ALLOCATED)
        if len(allocs) == 0:
            continue
        removed = tl.removed_at[allocs]
        freed = removed >= 0
        # A removal happens at an event index; a free sorts before an allocation there.
        position = np.concatenate([allocs, removed[freed]])
        order_key = np.concatenate([np.ones(len(allocs)), np.zeros(int(freed.sum()))])
        req = np.concatenate([np.arange(len(allocs)), np.flatnonzero(freed)])
        kind = np.concatenate([np.full(len(allocs), ALLOC), np.full(int(freed.sum()), FREE)])
        order = np.lexsort((order_key, position))
        stream = RequestStream.build(
            kind[order], req[order], tl.time_ns[position[order]], tl.bytes[allocs],
            stream_names=("driver",),
        )  # fmt: skip
        warnings = []
        if s.caching_allocator_suspected:
            warnings.append(
                "every allocation is a multiple of 2 MiB and at least 2 MiB: these look like a"
                " caching allocator's segments, not tensors, so a what-if is meaningless; record"
                " with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (nsysfrag profile --torch-tensors) or"
                " use a PyTorch memory snapshot"
            )
        process = f" ({s.process_name})" if s.process_name else ""
        sources.append(
            RequestSource(
                label=f"process {s.pid}{process} · device {s.device}",
                pid=s.pid,
                device=s.device,
                stream=stream,
                capacity_bytes=s.capacity_bytes,
                capacity_source="--capacity" if capacity is not None else "the trace's TARGET_INFO_GPU",
                baseline=baseline,
                recorded_peak_reserved_bytes=None,
                warnings=warnings,
                segments_suspected=s.caching_allocator_suspected,
            )
        )
    return sources, notes

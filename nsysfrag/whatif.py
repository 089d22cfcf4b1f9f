"""What if the run had used another allocator? Request streams, replays, ranking, advice.

Data flows one way: an input (a PyTorch memory snapshot or an nsys export) becomes one
:class:`~nsysfrag.allocators.base.RequestStream` per device (snapshot) or per (process, device)
(nsys); every policy replays it on a device of capacity C (SPEC §8: the same request stream,
the same metrics under the policy's name, the requests it could not place are its allocation
failures); the outcomes are ranked and turned into a recommendation that quotes the numbers.

``validate_snapshot`` checks the ``torch`` model against a snapshot's own history: it starts
from the layout at the start of the recorded window (rebuilt by
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

import bisect
import difflib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numba
import numpy as np

from nsysfrag.allocators import DEFAULT_POLICIES, Policy, parse_policy
from nsysfrag.allocators.base import (
    ALLOC,
    EMPTY_CACHE,
    FAIL_ALL,
    FAIL_NONE,
    FAIL_RELEASE,
    FREE,
    I64,
    LOG_SEGMENT_ALLOC,
    LOG_SEGMENT_MAP,
    UNLIMITED,
    GiB,
    MiB,
    RequestStream,
    SimResult,
)
from nsysfrag.allocators.torch_caching import (
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    InitialLayout,
    TorchConfig,
    round_size,
    simulate_torch,
    split_options,
)
from nsysfrag.analysis import State
from nsysfrag.analysis.metrics import (
    F64,
    Health,
    format_bytes,
    global_frag,
    growth_per_second,
    local_frag,
    overall_health,
)
from nsysfrag.errors import InputError
from nsysfrag.inputs.torch_snapshot.reader import Snapshot, TraceEntry, read_snapshot
from nsysfrag.models.observed.kernel import ALLOCATED
from nsysfrag.models.segments.replay import SegmentSet, WindowStart, window_start

SNAPSHOT = "pytorch-snapshot"
NSYS = "nsys-trace"
DEFAULT_SNAPSHOT_CAPACITY = 80 * GiB
MAX_OOMS_LISTED = 1000  # largest_free_at_oom_bytes keeps the first this many
TIMELINE_POINTS = 400
PAGE = 2 * MiB
VALIDATION_TARGET_MATCH = 0.95
VALIDATION_TARGET_PEAK = 0.01
NEAR_EQUAL = 0.01  # peaks within 1 % of each other are a tie for the recommendation
_ES_VA_VALIDATION = 1 << 46


# ----------------------------------------------------------------------------- the results


class _LiveBlock(Protocol):
    """A block live at the window's start, as segments_model.window_start rebuilds it."""

    size: int | None  # known for blocks still live at the snapshot
    requested: int


@dataclass(frozen=True)
class PolicyOutcome:
    """One policy's replay of one request stream, in SPEC §3 terms plus the reserved figures."""

    policy: Policy
    baseline: bool
    peak: State
    final: State
    max_global_frag: float
    max_local_frag: float
    max_free_blocks: int
    max_live_bytes: int
    health: Health
    internal_frag: float
    growth_per_s: float
    peak_reserved_bytes: int
    final_reserved_bytes: int
    peak_requested_bytes: int
    reserved_over_requested_at_peak: float  # Johnstone & Wilson #3: R/U when R peaks
    max_reserved_over_max_requested: float  # Johnstone & Wilson #4
    simulated_ooms: int
    first_oom_time_ns: int | None
    largest_free_at_oom_bytes: list[int]
    timeline_time_ns: list[int]
    timeline_reserved_bytes: list[int]
    seconds: float

    @property
    def name(self) -> str:
        return self.policy.name


@dataclass(frozen=True)
class Recommendation:
    """What to change, and the numbers it follows from."""

    text: str
    policy: str | None  # the recommended policy, None to keep the baseline
    alloc_conf: str | None  # the PYTORCH_CUDA_ALLOC_CONF to set
    baseline: str
    baseline_peak_reserved_bytes: int
    recommended_peak_reserved_bytes: int
    change: float  # relative change of peak reserved, negative = less
    reference: str | None  # a line about the reference models, for scale


@dataclass(frozen=True)
class SpaceComparison:
    """Every policy on one request stream (a device of a snapshot, a space of a trace)."""

    label: str
    pid: int | None
    device: int
    capacity_bytes: int
    capacity_source: str
    requests: int
    frees: int
    streams: int
    first_time_ns: int
    recorded_peak_reserved_bytes: int | None
    outcomes: list[PolicyOutcome]  # ranked, best first
    recommendation: Recommendation
    warnings: list[str] = field(default_factory=list)
    timestamps: bool = True  # False: every *_time_ns is a trace entry number


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


@dataclass(frozen=True)
class WhatifReport:
    input_path: str
    input_kind: str  # SNAPSHOT or NSYS
    request_level: str  # what one request is, in words
    spaces: list[SpaceComparison]
    notes: list[str]
    validation: Validation | None = None


# ------------------------------------------------------------------------- request streams


@dataclass
class _StreamBuilder:
    """Collects events in order; requests get ids as they are allocated."""

    kind: list[int] = field(default_factory=list)
    request: list[int] = field(default_factory=list)
    time_ns: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    fail: list[int] = field(default_factory=list)

    def new_request(self, size: int, stream: int, fail: int = FAIL_NONE) -> int:
        self.size.append(size)
        self.stream.append(stream)
        self.fail.append(fail)
        return len(self.size) - 1

    def event(self, kind: int, request: int, t: int) -> None:
        self.kind.append(kind)
        self.request.append(request)
        self.time_ns.append(t)

    def alloc(self, size: int, stream: int, t: int, fail: int = FAIL_NONE) -> int:
        r = self.new_request(size, stream, fail)
        self.event(ALLOC, r, t)
        return r

    def build(self, stream_names: tuple[str, ...]) -> RequestStream:
        return RequestStream.build(
            self.kind, self.request, self.time_ns, self.size, self.stream, self.fail, stream_names
        )


@dataclass(frozen=True)
class _Source:
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
    timestamps: bool = True  # False: times are trace entry numbers (snapshots before 2.1)


def _stream_index(names: dict[int, int], raw: int) -> int:
    if raw not in names:
        names[raw] = len(names)
    return names[raw]


def _stream_names(names: dict[int, int]) -> tuple[str, ...]:
    out = [""] * max(len(names), 1)
    for raw, i in names.items():
        out[i] = "default" if raw == 0 else hex(raw)
    if not names:
        out[0] = "default"
    return tuple(out)


def _snapshot_times(trace: Sequence[TraceEntry]) -> list[int]:
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


def _recorded_reserved(initial: int, trace: Sequence[TraceEntry]) -> list[int]:
    """Reserved bytes after each entry: segment_alloc/map add, segment_free/unmap subtract."""
    out, r = [], initial
    for e in trace:
        a = e.action
        if a in ("segment_alloc", "segment_map"):
            r += e.size
        elif a in ("segment_free", "segment_unmap"):
            r -= e.size
        out.append(r)
    return out


def _segment_stream(segs: SegmentSet, address: int) -> int:
    start = segs.find(address)
    return segs.seg[start].stream if start is not None else 0


def snapshot_sources(path: Path, capacity: int | None) -> tuple[list[_Source], list[str], Snapshot]:
    """One request stream per device of a PyTorch snapshot."""
    snap = read_snapshot(path)
    config = TorchConfig.from_settings(
        snap.max_split_size, snap.roundup_power2_divisions, snap.expandable_segments,
        snap.allocator_conf,
    )  # fmt: skip
    as_run = _as_run_policy(config)
    notes = [f"{snap.layout}"]
    if not any(snap.traces.get(d) for d in snap.devices()):
        notes.append(
            "the snapshot has no trace (state only): the request stream is its live blocks,"
            " allocated once in address order"
        )
    sources = []
    for device in snap.devices():
        final = [s for s in snap.segments if s.device == device]
        trace = snap.traces.get(device, [])
        start = window_start(final, trace)
        times = _snapshot_times(trace)
        t0 = times[0] if times else 0
        names: dict[int, int] = {}
        b = _StreamBuilder()
        live: dict[int, int] = {}
        for address, r in sorted(start.blocks.items()):
            size = r.requested or r.size or 0
            if size <= 0:
                continue
            raw = _segment_stream(start.segments, address)
            live[address] = b.alloc(size, _stream_index(names, raw), t0)
        unmatched = 0
        for e, t in zip(trace, times, strict=True):
            a = e.action
            if a == "alloc" and e.size > 0:
                if e.address in live:  # its free went missing
                    b.event(FREE, live.pop(e.address), t)
                live[e.address] = b.alloc(e.size, _stream_index(names, e.stream), t)
            elif a in ("free_completed", "free"):
                r_id = live.pop(e.address, None)
                if r_id is None:
                    unmatched += 1
                else:
                    b.event(FREE, r_id, t)
            elif a == "oom" and e.size > 0:
                # The run could not place it; other policies try, and it lives no longer.
                r_id = b.alloc(e.size, _stream_index(names, e.stream), t)
                b.event(FREE, r_id, t)
        if not b.kind:
            continue
        warnings = []
        if unmatched:
            warnings.append(f"{unmatched} free(s) of blocks the snapshot never shows were skipped")
        initial_reserved = sum(
            start.segments.seg[s].end - s for s in start.segments.starts
        )
        series = _recorded_reserved(initial_reserved, trace)
        recorded_peak = max([initial_reserved, *series]) if (trace or final) else None
        cap, cap_source = _snapshot_capacity(capacity, trace, initial_reserved, series)
        sources.append(
            _Source(
                label=f"device {device}",
                pid=None,
                device=device,
                stream=b.build(_stream_names(names)),
                capacity_bytes=cap,
                capacity_source=cap_source,
                baseline=as_run,
                recorded_peak_reserved_bytes=recorded_peak,
                warnings=warnings,
                timestamps=any(e.time_us is not None for e in trace),
            )
        )
    return sources, notes, snap


def _as_run_policy(config: TorchConfig) -> Policy:
    """The torch policy the snapshot's run used (PyTorch's defaults when it set nothing)."""
    conf = config.conf_string()
    if not conf:
        return Policy("torch")
    items = [item.replace(":", "=", 1) for item in split_options(conf)]
    return Policy("torch", config, label="torch:" + ",".join(items))


def _same_policy(p: Policy, q: Policy) -> bool:
    return p.family == q.family and (p.torch or TorchConfig()) == (q.torch or TorchConfig())


def _snapshot_capacity(
    capacity: int | None, trace: Sequence[TraceEntry], initial: int, reserved: list[int]
) -> tuple[int, str]:
    """--capacity; else what a recorded OOM says (reserved + free device memory then); else
    the largest capacity consistent with the recorded OOM retries; else an assumed 80 GiB."""
    if capacity is not None:
        return capacity, "--capacity"
    for e, r in zip(trace, reserved, strict=True):
        if e.action == "oom" and e.device_free is not None:
            return r + e.device_free, "estimated from the recorded OOM: reserved + free device memory then"
    peak = max([initial, *reserved])
    refused = [need for need in _refusals(trace, initial, reserved) if need > peak]
    if refused:
        # cudaMalloc refused reserved + the new segment there, and the run held `peak` at most.
        return max(peak, min(refused) - PAGE), (
            "estimated from the recorded OOM retries: just below the smallest reserved + new"
            " segment the device refused"
        )
    return DEFAULT_SNAPSHOT_CAPACITY, "assumed: the snapshot does not record the device's memory; pass --capacity"


def _refusals(trace: Sequence[TraceEntry], initial: int, reserved: list[int]) -> list[int]:
    """Reserved bytes + the new segment where a malloc released cached segments and then
    allocated one: what the device (apparently) refused the first time."""
    out = []
    j, n = 0, len(trace)
    while j < n:
        if trace[j].action not in ("segment_free", "segment_unmap"):
            j += 1
            continue
        before = reserved[j - 1] if j > 0 else initial
        while j < n and trace[j].action in ("segment_free", "segment_unmap"):
            j += 1
        if j < n and trace[j].action in ("segment_alloc", "segment_map"):
            out.append(before + trace[j].size)
    return out


def nsys_sources(path: Path, capacity: int | None) -> tuple[list[_Source], list[str]]:
    """One request stream per (process, device) of an nsys export: its driver-level
    allocations and frees (SPEC §2 lifetimes: a free, or an overlapping allocation)."""
    from nsysfrag.analysis import analyze
    from nsysfrag.inputs.nsys.reader import read_trace

    analysis = analyze(read_trace(path), capacity_bytes=capacity)
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
            _Source(
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


# ---------------------------------------------------------------------- running policies


def _state(i: int, t: I64, g: F64, loc: F64, r: SimResult) -> State:
    return State(
        time_ns=int(t[i]),
        global_frag=float(g[i]),
        local_frag=float(loc[i]),
        free_blocks=int(r.free_blocks[i]),
        largest_free_bytes=int(r.largest_free_bytes[i]),
        free_bytes=int(r.free_bytes[i]),
        live_bytes=int(r.live_bytes[i]),
    )


def summarize(
    policy: Policy, r: SimResult, stream: RequestStream, capacity: int, baseline: bool, seconds: float
) -> PolicyOutcome:
    """SPEC §3 figures of one replay, with the policy's own free memory as F."""
    g = global_frag(r.free_bytes, r.largest_free_bytes, capacity)
    loc = local_frag(r.free_bytes, r.largest_free_bytes)
    t = stream.time_ns
    peak = int(np.argmax(g))
    last = len(g) - 1
    max_global, max_local = float(g.max()), float(loc.max())
    max_blocks = int(r.free_blocks.max())
    a_peak = int(np.argmax(r.allocated_bytes))
    a = int(r.allocated_bytes[a_peak])
    internal = (a - int(r.live_bytes[a_peak])) / a if a > 0 else 0.0
    r_peak = int(np.argmax(r.reserved_bytes))
    peak_reserved = int(r.reserved_bytes[r_peak])
    u_at = int(r.live_bytes[r_peak])
    peak_requested = int(r.live_bytes.max())
    idx = _sample(len(g), [peak, r_peak])
    return PolicyOutcome(
        policy=policy,
        baseline=baseline,
        peak=_state(peak, t, g, loc, r),
        final=_state(last, t, g, loc, r),
        max_global_frag=max_global,
        max_local_frag=max_local,
        max_free_blocks=max_blocks,
        max_live_bytes=peak_requested,
        health=overall_health(max_global, max_local, max_blocks),
        internal_frag=internal,
        growth_per_s=growth_per_second(t, g) if len(t) else 0.0,
        peak_reserved_bytes=peak_reserved,
        final_reserved_bytes=int(r.reserved_bytes[last]),
        peak_requested_bytes=peak_requested,
        reserved_over_requested_at_peak=peak_reserved / u_at if u_at > 0 else 0.0,
        max_reserved_over_max_requested=peak_reserved / peak_requested if peak_requested else 0.0,
        simulated_ooms=len(r.oom_event),
        first_oom_time_ns=int(t[r.oom_event[0]]) if len(r.oom_event) else None,
        largest_free_at_oom_bytes=r.oom_largest_free_bytes[:MAX_OOMS_LISTED].tolist(),
        timeline_time_ns=t[idx].tolist(),
        timeline_reserved_bytes=r.reserved_bytes[idx].tolist(),
        seconds=seconds,
    )


def _sample(n: int, keep: list[int]) -> I64:
    if n <= TIMELINE_POINTS:
        return np.arange(n, dtype=np.int64)
    spread = np.linspace(0, n - 1, TIMELINE_POINTS - len(keep)).round().astype(np.int64)
    return np.unique(np.concatenate([spread, keep]))


def rank_key(o: PolicyOutcome) -> tuple[int, int, float, str]:
    """Fewer simulated OOMs, then less peak reserved, then less fragmentation."""
    return (o.simulated_ooms, o.peak_reserved_bytes, o.max_global_frag, o.name)


def compare(source: _Source, policies: Sequence[Policy]) -> SpaceComparison:
    """Replay one request stream through every policy and rank them."""
    outcomes = []
    todo = list(policies)
    baseline = next((p for p in todo if _same_policy(p, source.baseline)), None)
    if baseline is None and not source.segments_suspected:
        baseline = source.baseline
        todo.insert(0, baseline)
    for p in todo:
        started = time.perf_counter()
        r = p.simulate(source.stream, source.capacity_bytes)
        seconds = time.perf_counter() - started
        outcomes.append(
            summarize(p, r, source.stream, source.capacity_bytes, p is baseline, seconds)
        )
    outcomes.sort(key=rank_key)
    stream = source.stream
    return SpaceComparison(
        label=source.label,
        pid=source.pid,
        device=source.device,
        capacity_bytes=source.capacity_bytes,
        capacity_source=source.capacity_source,
        requests=stream.n_requests,
        frees=int((stream.kind == FREE).sum()),
        streams=len(stream.stream_names),
        first_time_ns=int(stream.time_ns[0]) if stream.n_events else 0,
        recorded_peak_reserved_bytes=source.recorded_peak_reserved_bytes,
        outcomes=outcomes,
        recommendation=recommend(outcomes, source.capacity_bytes, source.segments_suspected),
        warnings=source.warnings,
        timestamps=source.timestamps,
    )


def whatif(
    path: Path,
    policies: Sequence[str] = (),
    capacity: int | None = None,
    validate: bool = False,
) -> WhatifReport:
    """Replay the input's request streams through ``policies`` (default: all)."""
    from nsysfrag.inputs.torch_snapshot.reader import is_snapshot

    chosen = [parse_policy(p) for p in (policies or DEFAULT_POLICIES)]
    seen: set[str] = set()
    unique = []
    for p in chosen:
        if p.name not in seen:
            seen.add(p.name)
            unique.append(p)
    if capacity is not None and capacity < 1:
        raise InputError("--capacity must be a positive number of bytes")
    snapshot = is_snapshot(path) if path.exists() else path.suffix.lower() in (".pickle", ".pkl")
    snap: Snapshot | None = None
    if validate and not snapshot:
        raise InputError(
            f"{path}: --validate needs a PyTorch memory snapshot (its recorded segment events are"
            " the ground truth); this looks like an nsys export"
        )
    if snapshot:
        sources, notes, snap = snapshot_sources(path, capacity)
        kind = SNAPSHOT
        level = "tensor-level requests (the snapshot's alloc / free_completed)"
    else:
        sources, notes = nsys_sources(path, capacity)
        kind = NSYS
        level = "driver-level allocations (nsys CUDA memory events)"
    validation = validate_snapshot(snap) if validate and snap is not None else None
    if not sources:
        if validation is not None:
            return WhatifReport(str(path), kind, level, [], notes, validation)
        raise InputError(
            f"{path}: no allocation to replay (no alloc in the trace and no live block);"
            " record a trace of the run's allocations"
        )
    spaces = [compare(s, unique) for s in sources]
    return WhatifReport(str(path), kind, level, spaces, notes, validation)


# ------------------------------------------------------------------------ recommendation


def _pair(a: int, b: int) -> str:
    """``61.2 → 47.9 GiB``: both in the unit of the larger, with enough decimals to differ."""
    big = max(abs(a), abs(b), 1)
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if big >= scale:
            x, y = a / scale, b / scale
            digits = 1 if big / scale >= 10 else 2
            while digits < 4 and a != b and f"{x:.{digits}f}" == f"{y:.{digits}f}":
                digits += 1
            return f"{x:.{digits}f} → {y:.{digits}f} {unit}"
    return f"{a} → {b} B"


def _signed_percent(x: float) -> str:
    text = f"{abs(x) * 100:.0f} %"
    return ("−" if x < 0 else "+") + text


def _capacity_text(capacity: int) -> str:
    return format_bytes(capacity).replace(".00 ", " ")


def _conf_text(conf: str | None) -> str:
    if conf == "":
        return "the default settings (unset PYTORCH_CUDA_ALLOC_CONF)"
    return f"PYTORCH_CUDA_ALLOC_CONF={conf}"


def recommend(
    outcomes: Sequence[PolicyOutcome], capacity: int, segments_suspected: bool = False
) -> Recommendation:
    """Plain words that follow from the numbers: the best policy a PyTorch user can switch to,
    against the baseline (the run's own settings, or PyTorch's defaults)."""
    base = next((o for o in outcomes if o.baseline), outcomes[0])
    reference = _reference_line(outcomes, base)
    if segments_suspected:
        return Recommendation(
            "No recommendation: the requests look like caching-allocator segments (every size a"
            " multiple of 2 MiB), so the replay says nothing about the tensors inside them.",
            None, None, base.name, base.peak_reserved_bytes, base.peak_reserved_bytes, 0.0, None,
        )  # fmt: skip
    best = _best_actionable(outcomes, base)
    cap = _capacity_text(capacity)
    change = (best.peak_reserved_bytes - base.peak_reserved_bytes) / base.peak_reserved_bytes if base.peak_reserved_bytes else 0.0
    better = best is not base and (
        best.simulated_ooms < base.simulated_ooms
        or (best.simulated_ooms == base.simulated_ooms and change <= -0.01)
    )
    if not better:
        ooms = (
            f"no simulated OOM at {cap}"
            if base.simulated_ooms == 0
            else f"{base.simulated_ooms} simulated OOM(s) at {cap} that no setting tried avoids"
        )
        text = (
            f"Keep {base.name}: no allocator setting tried lowers peak reserved by 1 % or more"
            f" ({format_bytes(base.peak_reserved_bytes)} peak reserved, {ooms})."
        )
        return Recommendation(
            text, None, None, base.name, base.peak_reserved_bytes, base.peak_reserved_bytes,
            0.0, reference,
        )  # fmt: skip
    conf = best.policy.alloc_conf()
    if best.simulated_ooms == 0:
        ooms = f"no simulated OOM at {cap}"
        if base.simulated_ooms:
            ooms += f" (vs {base.simulated_ooms} with {base.name})"
    else:
        ooms = f"{best.simulated_ooms} simulated OOM(s) at {cap} (vs {base.simulated_ooms})"
    label = (conf or "defaults") if best.policy.family == "torch" else best.name
    text = (
        f"{label}: peak reserved {_pair(base.peak_reserved_bytes, best.peak_reserved_bytes)}"
        f" ({_signed_percent(change)}), {ooms}; set {_conf_text(conf)}"
    )
    return Recommendation(
        text, best.name, conf, base.name, base.peak_reserved_bytes, best.peak_reserved_bytes,
        change, reference,
    )  # fmt: skip


def _best_actionable(outcomes: Sequence[PolicyOutcome], base: PolicyOutcome) -> PolicyOutcome:
    """The best policy a PyTorch user can switch to. Policies within 1 % of the best peak
    (and with as few OOMs) count as equal; among those the baseline wins, then a setting of the
    native allocator over a backend switch, then the shorter PYTORCH_CUDA_ALLOC_CONF."""
    actionable = [o for o in outcomes if o.policy.actionable]
    if not actionable:
        return base
    best = min(actionable, key=rank_key)
    near = [
        o for o in actionable
        if o.simulated_ooms == best.simulated_ooms
        and o.peak_reserved_bytes <= best.peak_reserved_bytes * (1 + NEAR_EQUAL)
    ]  # fmt: skip

    def preference(o: PolicyOutcome) -> tuple[bool, bool, int, tuple[int, int, float, str]]:
        conf = o.policy.alloc_conf() or ""
        return (not o.baseline, o.policy.family != "torch", len(conf), rank_key(o))

    return min(near, key=preference)


def _reference_line(outcomes: Sequence[PolicyOutcome], base: PolicyOutcome) -> str | None:
    refs = [o for o in outcomes if not o.policy.actionable]
    if not refs:
        return None
    floor = min(refs, key=rank_key)
    return (
        f"For scale: the {floor.name} reference model peaks at"
        f" {format_bytes(floor.peak_reserved_bytes)} reserved for"
        f" {format_bytes(floor.peak_requested_bytes)} requested at most; {base.name} peaks at"
        f" {format_bytes(base.peak_reserved_bytes)}."
    )


# -------------------------------------------------------------------------- validation


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


def _layout_of(start: WindowStart, config: TorchConfig, names: dict[int, int], b: _StreamBuilder
               ) -> tuple[InitialLayout, dict[int, int], int]:  # fmt: skip
    """The torch model's initial state from the rebuilt window start; the live blocks become
    requests (not events: they are already placed)."""
    segs = start.segments
    recreated = sorted(start.blocks.items())
    addrs = [a for a, _ in recreated]
    divs = config.roundup_power2_divisions
    seg_rows: list[list[int]] = []
    block_rows: list[list[int]] = []
    es_rows: list[list[int]] = []
    live: dict[int, int] = {}
    conflicts = 0
    expandable: dict[int, list[int]] = {}  # pool key -> segment starts
    for s_start in segs.starts:
        info = segs.seg[s_start]
        size = info.end - s_start
        small = info.small_pool
        if small is None:
            small = size % K_LARGE_BUFFER != 0 if info.expandable else size == K_SMALL_BUFFER
        pk = 2 * _stream_index(names, info.stream) + int(small)
        if info.expandable:
            expandable.setdefault(pk, []).append(s_start)
            continue
        index = len(seg_rows)
        seg_rows.append([s_start, size, pk, -1])
        conflicts += _fill(index, s_start, info.end, recreated, addrs, divs, config, False,
                           bool(small), names, segs, b, block_rows, live)  # fmt: skip
    for pk, starts in sorted(expandable.items()):
        page = K_SMALL_BUFFER if pk & 1 else K_LARGE_BUFFER
        base = min(starts)
        top = max(segs.seg[s].end for s in starts)
        va = -(-(top - base) // page) * page + _ES_VA_VALIDATION
        e = len(es_rows)
        es_rows.append([base, va, page, pk])
        index = len(seg_rows)
        mapped = sum(segs.seg[s].end - s for s in starts)
        seg_rows.append([base, mapped, pk, e])
        cursor = base
        for s in sorted(starts):
            if s > cursor:
                block_rows.append([index, cursor, s - cursor, -1, -1])
            conflicts += _fill(index, s, segs.seg[s].end, recreated, addrs, divs, config, True,
                               bool(pk & 1), names, segs, b, block_rows, live)  # fmt: skip
            cursor = segs.seg[s].end
        block_rows.append([index, cursor, base + va - cursor, -1, -1])
    layout = InitialLayout(
        np.asarray(seg_rows, dtype=np.int64).reshape(-1, 4),
        np.asarray(block_rows, dtype=np.int64).reshape(-1, 5),
        np.asarray(es_rows, dtype=np.int64).reshape(-1, 4),
    )
    return layout, live, conflicts


def _fill(
    index: int, lo: int, hi: int, recreated: Sequence[tuple[int, _LiveBlock]], addrs: list[int],
    divs: tuple[int, ...], config: TorchConfig, expandable: bool, small: bool,
    names: dict[int, int], segs: SegmentSet, b: _StreamBuilder, rows: list[list[int]],
    live: dict[int, int],
) -> int:  # fmt: skip
    """Tile ``[lo, hi)`` with its live blocks and the free blocks between them."""
    conflicts = 0
    cursor = lo
    k = bisect.bisect_left(addrs, lo)
    while k < len(addrs) and addrs[k] < hi:
        address, r = recreated[k]
        k += 1
        nxt = min(addrs[k], hi) if k < len(addrs) else hi
        if address < cursor:
            conflicts += 1
            continue
        size = r.size
        if size is None:
            size = round_size(max(r.requested, 1), divs)
            gap = nxt - (address + size)
            # A block PyTorch did not split keeps the tail: remaining <= 1 MiB in the large
            # pool (or any remainder at or above max_split_size).
            if gap > 0 and not small and not expandable and (
                gap <= K_SMALL_SIZE or size >= config.max_split_size
            ):
                size += gap
        size = min(size, nxt - address)
        if size <= 0:
            conflicts += 1
            continue
        if address > cursor:
            rows.append([index, cursor, address - cursor, 0, -1])
        requested = r.requested or size
        rid = b.new_request(requested, _stream_index(names, _segment_stream(segs, address)))
        live[address] = rid
        rows.append([index, address, size, 1, rid])
        cursor = address + size
    if cursor < hi:
        rows.append([index, cursor, hi - cursor, 0, -1])
    return conflicts


def _validate_device(snap: Snapshot, device: int, config: TorchConfig) -> DeviceValidation | None:
    final = [s for s in snap.segments if s.device == device]
    trace = snap.traces.get(device, [])
    if not trace:
        return None
    start = window_start(final, trace)
    names: dict[int, int] = {}
    b = _StreamBuilder()
    layout, live, _ = _layout_of(start, config, names, b)
    times = _snapshot_times(trace)
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
            live[e.address] = b.alloc(e.size, _stream_index(names, e.stream), t, fail)
        elif a in ("free_completed", "free"):
            r_id = live.pop(e.address, None)
            if r_id is not None:
                b.event(FREE, r_id, t)
        elif a == "oom" and e.size > 0:
            forced += 1
            r_id = b.alloc(e.size, _stream_index(names, e.stream), t, FAIL_ALL)
    if not b.kind:
        b.event(EMPTY_CACHE, 0, times[0] if times else 0)  # a no-op: keeps the arrays non-empty
    if not b.size:
        b.new_request(1, 0)  # EMPTY_CACHE events name request 0
    stream = b.build(_stream_names(names))
    result = simulate_torch(stream, UNLIMITED, config, layout, es_va_bytes=_ES_VA_VALIDATION)
    kind_wanted = LOG_SEGMENT_MAP if recorded_action == "segment_map" else LOG_SEGMENT_ALLOC
    simulated = result.segment_log["size"][result.segment_log["kind"] == kind_wanted].tolist()
    initial_reserved = int(layout.segments[:, 1].sum()) if len(layout.segments) else 0
    series = _recorded_reserved(initial_reserved, trace)
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


__all__ = [
    "DEFAULT_POLICIES",
    "PolicyOutcome",
    "Recommendation",
    "SpaceComparison",
    "Validation",
    "WhatifReport",
    "compare",
    "matched_in_order",
    "recommend",
    "summarize",
    "validate_snapshot",
    "whatif",
]

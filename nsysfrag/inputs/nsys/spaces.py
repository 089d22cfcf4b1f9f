"""An nsys trace as a recording: one space per (process, device), in the ``observed`` model.

A space's events are its device-memory allocations and frees in trace order, with its failed
allocation calls among them (docs/metrics.md); a block's site is its NVTX ranges (``sites``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nsysfrag.errors import InputError
from nsysfrag.events import (
    ALLOC,
    FAILED_ALLOC,
    FREE,
    I64,
    UNKNOWN_BYTES,
    AllocationEvents,
    InputCounts,
    MemoryPools,
    SourceInfo,
)
from nsysfrag.inputs.nsys.records import Trace
from nsysfrag.inputs.nsys.sites import SiteResolver
from nsysfrag.inputs.nsys.words import WORDS
from nsysfrag.inputs.recording import InputOptions, Recording, check_space_count
from nsysfrag.models.observed import MAX_ARENA_BYTES, MODEL_NAME, ObservedModel
from nsysfrag.models.space import RecordedSpace

SpaceKey = tuple[int, int]  # (pid, CUDA device id as the process saw it)


def recording_of(trace: Trace, options: InputOptions) -> Recording:
    """Every (process, device) space of ``trace`` with device-memory events."""
    if options.granularity_bytes < 1:
        raise InputError("--granularity must be a positive number of bytes")
    if options.page_bytes < 1:
        raise InputError("--page-size must be a positive number of bytes")
    if options.capacity_bytes is not None and options.capacity_bytes < 1:
        raise InputError("--capacity must be a positive number of bytes")
    mem = trace.memory
    groups = _group_by_space(mem.pid, mem.device, np.flatnonzero(mem.modelled))
    check_space_count(trace.path, len(groups), "processes × devices")
    resolver = SiteResolver(mem, trace.api, trace.nvtx)
    failures, unattributed = _charge_failures(trace, resolver, set(groups))
    other = {
        k: len(v)
        for k, v in _group_by_space(mem.pid, mem.device, np.flatnonzero(~mem.modelled)).items()
    }
    model = ObservedModel(options.granularity_bytes, options.page_bytes)
    spaces = []
    untimed = []
    for key in sorted(groups):
        timed = _timed(trace.memory.start_ns[groups[key]])
        if not timed:
            untimed.append(key)
        events = _space_events(trace, resolver, groups[key], failures.get(key, []), timed)
        _check_span(trace, key, events, options.granularity_bytes + options.page_bytes)
        spaces.append(
            RecordedSpace(
                pid=key[0],
                device=key[1],
                device_name=_device_name(trace, key),
                process_name=trace.process_names.get(key[0]),
                events=events,
                model=model,
                capacity_bytes=_capacity(trace, key, options.capacity_bytes),
                capacity_source="device" if options.capacity_bytes is None else "--capacity",
                other_kind_events=other.get(key, 0),
                timestamps=timed,
            )
        )
    warnings = []
    if untimed:
        which = ", ".join(f"process {pid} device {device}" for pid, device in untimed[:3])
        more = f" and {len(untimed) - 3} more" if len(untimed) > 3 else ""
        warnings.append(
            f"the export recorded no times for {which}{more} (every memory event has the same"
            " start): its moments are event numbers, in the order nsys wrote the events"
        )
    if trace.vmm_calls:
        warnings.append(
            f"{trace.vmm_calls} virtual-memory-management call(s) (cuMemCreate/cuMemMap) were"
            " traced; nsys may not record their memory, so the layout can be incomplete"
            " (PyTorch expandable_segments and NCCL use them)"
        )
    if trace.skipped_rows:
        warnings.append(
            f"{trace.skipped_rows} memory event row(s) had NULL or malformed values and were skipped"
        )
    if unattributed:
        warnings.append(
            f"{unattributed} failed allocation call(s) came from processes with no device-memory"
            " events and are not charged to any space"
        )
    return Recording(
        source=SourceInfo(
            kind="nsys-export",
            path=trace.path,
            version=trace.nsys_version,
            words=WORDS,
            driver_allocations=True,
        ),
        model=MODEL_NAME,
        granularity_bytes=options.granularity_bytes,
        page_bytes=options.page_bytes,
        spaces=spaces,
        warnings=warnings,
        counts=InputCounts(
            skipped_rows=trace.skipped_rows,
            vmm_calls=trace.vmm_calls,
            unattributed_failures=unattributed,
            unassigned_other_kind_events=sum(v for k, v in other.items() if k not in groups),
        ),
    )


@dataclass(frozen=True)
class _SpaceSites:
    """A space's sites: those of the memory-event rows behind its events, and of the API rows
    of its failed calls (which have no memory event)."""

    resolver: SiteResolver
    memory_row: I64  # per event of the space; -1 for a failed call
    trace: Trace
    call_row: I64 | None = None  # per event: the failed call's API row, or -1

    def codes(self, events: I64) -> tuple[I64, list[str]]:
        rows = self.memory_row[events]
        if self.call_row is None or (rows >= 0).all():
            return self.resolver.site_codes(rows)
        mem, api = self.trace.memory, self.trace.api
        tid, start = self.resolver.calling_threads(np.maximum(rows, 0))
        pid = mem.pid[np.maximum(rows, 0)] if len(mem) else np.zeros(len(rows), dtype=np.int64)
        calls = self.call_row[events]
        failed = rows < 0
        pid = np.where(failed, api.pid[np.maximum(calls, 0)], pid)
        tid = np.where(failed, api.tid[np.maximum(calls, 0)], tid)
        start = np.where(failed, api.start_ns[np.maximum(calls, 0)], start)
        return self.resolver.codes_at(pid, tid, start)


def _timed(start_ns: I64) -> bool:
    """Whether a space's memory events have times: some exports (nsys 2022.1) write start = 0
    on every memory row, and a space whose events all share one start has no timeline."""
    return len(start_ns) > 0 and bool((start_ns != start_ns[0]).any())


def _space_events(
    trace: Trace, resolver: SiteResolver, rows: I64, failed_calls: list[int], timed: bool
) -> AllocationEvents:
    """The space's memory events (rows of the trace's memory table) and its failed calls; a
    space without times numbers its memory events from 0 instead (in row order, which the
    reader kept for equal starts), and a failed call takes the number of the event it
    follows."""
    mem = trace.memory
    # One space holding every event (the usual case) needs views, not copies.
    whole = len(rows) == len(mem) and (len(rows) == 0 or rows[-1] == len(rows) - 1)
    time_ns = mem.start_ns if whole else mem.start_ns[rows]
    kind = np.where(mem.is_free if whole else mem.is_free[rows], np.int8(FREE), np.int8(ALLOC))
    address = mem.address if whole else mem.address[rows]
    nbytes = mem.bytes if whole else mem.bytes[rows]
    pools = None
    if mem.pools is not None:
        pools = MemoryPools(*(column[rows] for column in (
            mem.pools.pool, mem.pools.size_bytes, mem.pools.kept_bytes)))  # fmt: skip
    memory_row = rows
    call_row = None
    if failed_calls:
        calls = np.asarray(failed_calls, dtype=np.int64)
        calls = calls[np.argsort(trace.api.start_ns[calls], kind="stable")]
        times = trace.api.start_ns[calls]
        # A failed call goes after the memory events at or before its start.
        at = np.searchsorted(time_ns, times, side="right")
        time_ns = np.insert(time_ns, at, times)
        kind = np.insert(kind, at, np.int8(FAILED_ALLOC))
        address = np.insert(address, at, np.uint64(0))
        nbytes = np.insert(nbytes, at, UNKNOWN_BYTES)  # nsys records no size for a failed call
        memory_row = np.insert(rows, at, -1)
        call_row = np.insert(np.full(len(rows), -1, dtype=np.int64), at, calls)
        if pools is not None:
            pools = MemoryPools(
                np.insert(pools.pool, at, -1),
                np.insert(pools.size_bytes, at, 0),
                np.insert(pools.kept_bytes, at, 0),
            )
    if not timed:
        numbers = np.cumsum(memory_row >= 0) - 1  # a failed call: the event before it
        time_ns = np.maximum(numbers, 0).astype(np.int64)
    return AllocationEvents(
        time_ns=time_ns,
        kind=kind,
        address=address,
        bytes=nbytes,
        sites=_SpaceSites(resolver, memory_row, trace, call_row),
        pools=pools,
    )


def _check_span(trace: Trace, key: SpaceKey, events: AllocationEvents, rounding: int) -> None:
    """Refuse a space whose blocks cannot be laid out in the observed model's 64-bit offsets
    from B's page (``rounding``: what rounding a footprint to the granularity and its end to a
    page can add): addresses or sizes no GPU has, so a damaged trace."""
    is_block = (events.kind == ALLOC) & (events.bytes > 0)
    if not is_block.any():
        return
    address, nbytes = events.address[is_block], events.bytes[is_block]
    base, highest, largest = int(address.min()), int(address.max()), int(nbytes.max())
    if highest - base + largest + 2 * rounding <= MAX_ARENA_BYTES:
        return
    pid, device = key
    raise InputError(
        f"{trace.path}: process {pid} device {device} has allocations from {base:#x} to"
        f" {highest:#x} of up to {largest:,} bytes, a span of 8 EiB or more that no"
        " GPU has: its addresses or sizes are damaged; re-export the trace with"
        " `nsys export --type sqlite --force-overwrite=true`"
    )


def _group_by_space(pid: I64, device: I64, rows: I64) -> dict[SpaceKey, I64]:
    """Event indices (in order) of each (pid, device) among ``rows``."""
    if len(rows) == 0:
        return {}
    pids, devices = pid[rows], device[rows]
    if (pids == pids[0]).all() and (devices == devices[0]).all():  # one process, one device
        return {(int(pids[0]), int(devices[0])): rows}
    # Sorted on both columns rather than on one packed key: a device id can be any int64.
    order = np.lexsort((devices, pids))
    pids, devices = pids[order], devices[order]
    bounds = np.flatnonzero((pids[1:] != pids[:-1]) | (devices[1:] != devices[:-1])) + 1
    bounds = np.concatenate([[0], bounds, [len(rows)]])
    return {
        (int(pids[a]), int(devices[a])): rows[order[a:b]]
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
    }


def _capacity(trace: Trace, key: SpaceKey, override: int | None) -> int:
    if override is not None:
        return override
    pid, device = key
    gpu_id = trace.cuda_devices.get((pid, device), device)
    gpu = trace.gpus.get(gpu_id)
    if gpu is None or gpu.total_memory is None:
        raise InputError(
            f"{trace.path}: process {pid} allocated on device {device}, but the trace has no"
            " TARGET_INFO_GPU row with that device's memory size; pass --capacity BYTES"
        )
    return gpu.total_memory


def _device_name(trace: Trace, key: SpaceKey) -> str:
    pid, device = key
    gpu = trace.gpus.get(trace.cuda_devices.get((pid, device), device))
    return gpu.name if gpu is not None else f"device {device}"


def _charge_failures(
    trace: Trace, resolver: SiteResolver, spaces: set[SpaceKey]
) -> tuple[dict[SpaceKey, list[int]], int]:
    """docs/metrics.md: a failed allocation call goes to the device of its thread's most recent
    successful allocation, else to its process's lowest device. Returns the calls (rows of
    ``trace.api``) charged to each space, and how many no space takes."""
    api = trace.api
    failed = np.flatnonzero(api.is_failed_allocation)
    if len(failed) == 0:
        return {}, 0
    mem = trace.memory
    allocs = np.flatnonzero(mem.modelled & ~mem.is_free & (mem.bytes > 0))
    tid, _ = resolver.calling_threads(allocs)
    called = tid >= 0
    allocs, tid = allocs[called], tid[called]
    # For each failure, the latest allocation on the same thread strictly before it: sort the
    # allocations by (thread, time) and binary-search each failure's (thread, time).
    threads = (mem.pid[allocs] << 24) | tid
    order = np.lexsort((mem.start_ns[allocs], threads))
    threads, times, devices = threads[order], mem.start_ns[allocs][order], mem.device[allocs][order]
    fail_threads = (api.pid[failed] << 24) | api.tid[failed]
    fail_times = api.start_ns[failed]
    lo = np.searchsorted(threads, fail_threads, side="left")
    hi = np.searchsorted(threads, fail_threads, side="right")
    charged_device = np.full(len(failed), -1, dtype=np.int64)
    for j in range(len(failed)):
        before = lo[j] + np.searchsorted(times[lo[j] : hi[j]], fail_times[j], side="left") - 1
        if before >= lo[j]:
            charged_device[j] = devices[before]
    lowest: dict[int, int] = {}
    for pid, device in sorted(spaces):
        lowest.setdefault(pid, device)
    out: dict[SpaceKey, list[int]] = {}
    unattributed = 0
    for row, pid, device in zip(
        failed.tolist(), api.pid[failed].tolist(), charged_device.tolist(), strict=True
    ):
        if device >= 0:  # the thread had allocated before
            out.setdefault((pid, device), []).append(row)
        elif pid in lowest:
            out.setdefault((int(pid), lowest[pid]), []).append(row)
        else:
            unattributed += 1
    return out, unattributed

"""Where each allocation ran: its NVTX site (SPEC §4).

A site is the stack of NVTX push/pop ranges enclosing the allocation's API call on the calling
thread (``outer/inner``), else the innermost start/end range there, else ``(no range)``. Rather
than scanning ranges per allocation, each thread's ranges are swept once into a step function
"time -> site" and allocations are looked up by binary search.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nsysfrag.inputs.nsys.records import I64, ApiCalls, MemoryEvents, NvtxRanges

NO_RANGE = "(no range)"
NO_THREAD = -1


def _call_key(pid: I64, correlation_id: I64) -> I64:
    # Correlation ids are per process (CUPTI's are 32-bit); pids are 24-bit in nsys ids.
    return (pid << 32) | (correlation_id & 0xFFFFFFFF)


def _thread_key(pid: I64, tid: I64) -> I64:
    return (pid << 24) | tid


@dataclass(frozen=True, slots=True)
class _ThreadSites:
    boundaries_ns: I64  # the site is labels[j] on [boundaries[j], boundaries[j + 1])
    labels: list[str]


def _sweep(starts: I64, ends: I64, push_pop: np.ndarray, texts: list[str]) -> _ThreadSites:
    order = sorted(range(len(starts)), key=lambda r: (starts[r], -ends[r], r))
    points = np.unique(np.concatenate([starts, ends]))
    labels: list[str] = []
    active: list[int] = []  # ranges enclosing the current point, outermost first
    cursor = 0
    for point in points:
        active = [r for r in active if ends[r] > point]
        while cursor < len(order) and starts[order[cursor]] <= point:
            r = order[cursor]
            if ends[r] > point:
                active.append(r)
            cursor += 1
        active.sort(key=lambda r: (starts[r], -ends[r], r))
        stack = [texts[r] for r in active if push_pop[r]]
        if stack:
            labels.append("/".join(stack))
        else:
            start_end = [r for r in active if not push_pop[r]]
            labels.append(
                texts[max(start_end, key=lambda r: (starts[r], r))] if start_end else NO_RANGE
            )
    return _ThreadSites(points, labels)


class SiteResolver:
    """Answers "which call made this memory event, and what was its site" for one trace."""

    def __init__(self, memory: MemoryEvents, api: ApiCalls, nvtx: NvtxRanges) -> None:
        self._memory = memory
        keys = _call_key(api.pid, api.correlation_id)
        # One call can appear as a runtime row and as the driver row beneath it; prefer the
        # runtime row (the call the user wrote), then the earliest row.
        # (key, driver row) in one integer; a stable sort keeps row order among equals, and
        # is close to linear here because nsys writes calls in correlation-id order.
        order = np.argsort((keys << 1) | ~api.is_runtime, kind="stable")
        self._keys, first = np.unique(keys[order], return_index=True)
        chosen = order[first]
        self._tid = api.tid[chosen]
        self._start = api.start_ns[chosen]
        self._nvtx = nvtx
        thread_keys = _thread_key(nvtx.pid, nvtx.tid)
        self._nvtx_order = np.argsort(thread_keys, kind="stable")
        self._nvtx_keys = thread_keys[self._nvtx_order]
        self._threads: dict[int, _ThreadSites | None] = {}

    def calling_threads(self, event_index: I64) -> tuple[I64, I64]:
        """For memory events, the tid and start of their API call; tid -1 where none."""
        corr = self._memory.correlation_id[event_index]
        keys = _call_key(self._memory.pid[event_index], corr)
        pos = np.minimum(np.searchsorted(self._keys, keys), max(len(self._keys) - 1, 0))
        if len(self._keys) == 0:
            found = np.zeros(len(keys), dtype=np.bool_)
        else:
            found = (self._keys[pos] == keys) & (corr >= 0)
        tid = np.where(found, self._tid[pos] if len(self._keys) else NO_THREAD, NO_THREAD)
        start = np.where(found, self._start[pos] if len(self._keys) else 0, 0)
        return tid.astype(np.int64), start.astype(np.int64)

    def site_codes(self, event_index: I64) -> tuple[I64, list[str]]:
        """The site of each memory event in ``event_index``, as codes into a list of names."""
        tid, start = self.calling_threads(event_index)
        codes = np.zeros(len(event_index), dtype=np.int64)
        code_of: dict[str, int] = {NO_RANGE: 0}
        known = np.flatnonzero(tid != NO_THREAD)
        if len(known):
            threads = _thread_key(self._memory.pid[event_index][known], tid[known])
            uniq, inverse = np.unique(threads, return_inverse=True)
            by_thread = np.argsort(inverse, kind="stable")
            bounds = np.searchsorted(inverse[by_thread], np.arange(len(uniq) + 1))
            for t, thread_key in enumerate(uniq.tolist()):
                thread = self._thread(thread_key)
                if thread is None:
                    continue
                rows = known[by_thread[bounds[t] : bounds[t + 1]]]
                local = np.array(
                    [code_of.setdefault(lab, len(code_of)) for lab in thread.labels] + [0]
                )
                pos = np.searchsorted(thread.boundaries_ns, start[rows], side="right") - 1
                # Before the first boundary no range encloses the call: -1 picks the final 0.
                codes[rows] = local[pos]
        names = [""] * len(code_of)
        for label, code in code_of.items():
            names[code] = label
        return codes, names

    def sites(self, event_index: I64) -> list[str]:
        """The site of each memory event in ``event_index``."""
        codes, names = self.site_codes(event_index)
        return [names[c] for c in codes.tolist()]

    def _thread(self, thread_key: int) -> _ThreadSites | None:
        if thread_key not in self._threads:
            lo = np.searchsorted(self._nvtx_keys, thread_key, side="left")
            hi = np.searchsorted(self._nvtx_keys, thread_key, side="right")
            rows = self._nvtx_order[lo:hi]
            n = self._nvtx
            self._threads[thread_key] = (
                _sweep(n.start_ns[rows], n.end_ns[rows], n.is_push_pop[rows], [n.text[r] for r in rows])
                if len(rows)
                else None
            )
        return self._threads[thread_key]

"""Where each allocation ran: its NVTX site (SPEC §4).

A site is the stack of NVTX push/pop ranges enclosing the allocation's API call on the calling
thread (``outer/inner``), else the innermost start/end range there, else ``(no range)``. Rather
than scanning ranges per allocation, each thread's ranges are swept once into a step function
"time -> site" and allocations are looked up by binary search.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nsysfrag.events import I64, ApiCalls, MemoryEvents, NvtxRanges

NO_RANGE = "(no range)"


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
    """Answers "what was the site of this allocation event" for one trace."""

    def __init__(self, memory: MemoryEvents, api: ApiCalls, nvtx: NvtxRanges) -> None:
        self._memory = memory
        calls = pd.DataFrame(
            {
                "pid": api.pid,
                "correlation_id": api.correlation_id,
                "tid": api.tid,
                "api_start": api.start_ns,
                # One call can appear as a runtime row and as the driver row beneath it; prefer
                # the runtime row (the call the user wrote), then the earliest row.
                "driver": ~api.is_runtime,
                "row": np.arange(len(api.pid)),
            }
        )
        calls = calls.sort_values(["pid", "correlation_id", "driver", "row"], kind="stable")
        self._calls = calls.drop_duplicates(["pid", "correlation_id"]).set_index(
            ["pid", "correlation_id"]
        )[["tid", "api_start"]]
        self._threads: dict[tuple[int, int], _ThreadSites] = {}
        self._nvtx = nvtx
        by_thread = pd.DataFrame({"pid": nvtx.pid, "tid": nvtx.tid}).groupby(["pid", "tid"]).indices
        self._nvtx_rows = {(int(p), int(t)): rows for (p, t), rows in by_thread.items()}

    def calling_threads(self, event_index: I64) -> pd.DataFrame:
        """For memory events, the (tid, api_start) of their API call; NaN where none."""
        keys = pd.MultiIndex.from_arrays(
            [self._memory.pid[event_index], self._memory.correlation_id[event_index]]
        )
        return self._calls.reindex(keys)

    def site_codes(self, event_index: I64) -> tuple[I64, list[str]]:
        """The site of each memory event in ``event_index``, as codes into a list of names."""
        calls = self.calling_threads(event_index)
        names = [NO_RANGE]
        codes = np.zeros(len(event_index), dtype=np.int64)
        tids = calls["tid"].to_numpy()
        known = ~np.isnan(tids)
        frame = pd.DataFrame(
            {
                "pid": self._memory.pid[event_index][known],
                "tid": tids[known].astype(np.int64),
                "start": calls["api_start"].to_numpy()[known].astype(np.int64),
                "j": np.flatnonzero(known),
            }
        )
        code_of: dict[str, int] = {NO_RANGE: 0}
        for (pid, tid), rows in frame.groupby(["pid", "tid"]).indices.items():
            thread = self._thread(int(pid), int(tid))
            if thread is None:
                continue
            local = np.array([code_of.setdefault(lab, len(code_of)) for lab in thread.labels] + [0])
            pos = np.searchsorted(thread.boundaries_ns, frame["start"].to_numpy()[rows], side="right") - 1
            # Before the first boundary no range encloses the call: index -1 picks the trailing 0.
            codes[frame["j"].to_numpy()[rows]] = local[pos]
        names = [""] * len(code_of)
        for label, code in code_of.items():
            names[code] = label
        return codes, names

    def sites(self, event_index: I64) -> list[str]:
        """The site of each memory event in ``event_index``."""
        codes, names = self.site_codes(event_index)
        return [names[c] for c in codes.tolist()]

    def _thread(self, pid: int, tid: int) -> _ThreadSites | None:
        key = (pid, tid)
        if key not in self._threads:
            rows = self._nvtx_rows.get(key)
            if rows is None:
                return None
            n = self._nvtx
            self._threads[key] = _sweep(
                n.start_ns[rows], n.end_ns[rows], n.is_push_pop[rows], [n.text[r] for r in rows]
            )
        return self._threads[key]

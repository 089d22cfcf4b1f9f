"""Where each allocation ran: its NVTX site (docs/metrics.md).

A site is the stack of NVTX push/pop ranges enclosing the allocation's API call on the calling
thread (``outer/inner``), else the innermost start/end range there, else ``(no range)``.

Each thread's ranges are swept once, in time order, into a step function "time -> site", and
allocations are looked up in it by binary search. A site is a node of a trie of range texts
shared by every thread: a stack of ranges is a path from the root, so pushing a range is one
dictionary lookup, equal stacks are one node, and no string is built per event or per stack.
Only the sites of the allocations asked about are spelled out, each once, and at most
MAX_SITE_CHARS long: thousands of nested ranges with long names would otherwise make a small
trace expand into gigabytes of site text.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from nsysfrag.errors import InputError
from nsysfrag.events import I64, NameCodes
from nsysfrag.inputs.nsys.records import ApiCalls, MemoryEvents, NvtxRanges

NO_RANGE = "(no range)"
NO_THREAD = -1
# A longer site keeps its outermost ranges and its innermost ones (at most TAIL_RANGES), each
# side within half of this, and says how many ranges it leaves out between them.
MAX_SITE_CHARS = 4096
TAIL_RANGES = 8
# Push/pop ranges of one thread nest (NVTX keeps them on a per-thread stack). Ranges that cross
# cost the sweep a rebuild of the stack above the one that ended; past this much rebuilding the
# trace is refused as damaged rather than swept in quadratic time.
CROSSING_WORK = 5_000_000
_ROOT = 0  # the empty stack: "(no range)"


def _call_key(pid: I64, correlation_id: I64) -> I64:
    # Correlation ids are 32-bit (the reader turns others into -1); pids are 24-bit in nsys ids.
    return (pid << 32) | (correlation_id & 0xFFFFFFFF)


def _thread_key(pid: I64, tid: I64) -> I64:
    return (pid << 24) | tid


class _SiteTrie:
    """Stacks of range texts as trie nodes; node 0 is the empty stack."""

    def __init__(self) -> None:
        self._parent = [_ROOT]
        self._text = [-1]
        self._depth = [0]
        self._length = [0]  # characters of the joined texts
        self._anchor = [_ROOT]  # deepest node on the path whose name fits in half the limit
        self._children: dict[tuple[int, int], int] = {}
        self._texts = NameCodes()
        self.texts = self._texts.names
        self._names: dict[int, str] = {_ROOT: NO_RANGE}
        self._full: dict[int, str] = {}

    @property
    def size(self) -> int:
        """The number of nodes (ids 0 .. size - 1)."""
        return len(self._parent)

    def text_id(self, text: str) -> int:
        return self._texts.code(text)

    def child(self, node: int, text: int) -> int:
        """The stack ``node`` with range text ``text`` pushed on top."""
        found = self._children.get((node, text))
        if found is None:
            found = self._children[(node, text)] = len(self._parent)
            length = len(self.texts[text]) + (self._length[node] + 1 if node != _ROOT else 0)
            self._parent.append(node)
            self._text.append(text)
            self._depth.append(self._depth[node] + 1)
            self._length.append(length)
            self._anchor.append(found if length <= MAX_SITE_CHARS // 2 else self._anchor[node])
        return found

    def name(self, node: int) -> str:
        """The site's text: the range texts joined with ``/``, outermost first."""
        found = self._names.get(node)
        if found is None:
            found = self._names[node] = (
                self._joined(node) if self._length[node] <= MAX_SITE_CHARS else self._elided(node)
            )
        return found

    def _joined(self, node: int) -> str:
        # Every node on the path is at most as long: build them from the nearest one known.
        path = []
        while node != _ROOT and node not in self._full:
            path.append(node)
            node = self._parent[node]
        prefix = self._full.get(node)
        for n in reversed(path):
            text = self.texts[self._text[n]]
            prefix = self._full[n] = text if prefix is None else f"{prefix}/{text}"
        return prefix if prefix is not None else ""

    def _elided(self, node: int) -> str:
        anchor = self._anchor[node]
        half = MAX_SITE_CHARS // 2
        tail: list[str] = []
        used = 0
        n = node
        while n != anchor and len(tail) < TAIL_RANGES:
            text = self.texts[self._text[n]]
            if tail and used + len(text) + 1 > half:
                break
            tail.append(text if len(text) <= half else text[: half - 1] + "…")
            used += len(tail[-1]) + 1
            n = self._parent[n]
        left_out = self._depth[n] - self._depth[anchor]
        parts = [self._joined(anchor)] if anchor != _ROOT else []
        if left_out:
            parts.append(f"…{left_out} range{'s' if left_out > 1 else ''}…")
        return "/".join(parts + tail[::-1])


@dataclass(frozen=True, slots=True)
class _ThreadSites:
    boundaries_ns: I64  # the site is nodes[j] on [boundaries[j], boundaries[j + 1])
    nodes: I64


class SiteResolver:
    """Answers "which call made this memory event, and what was its site" for one trace."""

    def __init__(self, memory: MemoryEvents, api: ApiCalls, nvtx: NvtxRanges) -> None:
        self._memory = memory
        keys = _call_key(api.pid, api.correlation_id)
        # One call can appear as a runtime row and as the driver row beneath it; prefer the
        # runtime row (the call the user wrote), then the earliest row.
        # (key, driver row) in one integer; a stable sort keeps row order among equals, and
        # is close to linear here because nsys writes calls in correlation-id order.
        if len(keys) < 2 or bool((keys[1:] > keys[:-1]).all()):
            # Every key once, in order (the usual export): nothing to sort or choose.
            self._keys, chosen = keys, np.arange(len(keys))
        else:
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
        self._trie = _SiteTrie()
        self._crossing_work = 0

    def calling_threads(self, event_index: I64) -> tuple[I64, I64]:
        """For memory events, the tid and start of their API call; tid -1 where none."""
        # In place where it can be: this runs beside the replay, at the run's peak of memory.
        tid = np.full(len(event_index), NO_THREAD, dtype=np.int64)
        start = np.zeros(len(event_index), dtype=np.int64)
        if len(self._keys) == 0:
            return tid, start
        corr = self._memory.correlation_id[event_index]
        keys = _call_key(self._memory.pid[event_index], corr)
        pos = np.searchsorted(self._keys, keys)
        np.minimum(pos, len(self._keys) - 1, out=pos)
        found = self._keys[pos] == keys
        found &= corr >= 0
        del keys, corr
        hit = pos[found]
        tid[found] = self._tid[hit]
        start[found] = self._start[hit]
        return tid, start

    def site_codes(self, event_index: I64) -> tuple[I64, list[str]]:
        """The site of each memory event in ``event_index``, as codes into a list of names."""
        tid, start = self.calling_threads(event_index)
        return self.codes_at(self._memory.pid[event_index], tid, start)

    def codes_at(self, pid: I64, tid: I64, start: I64) -> tuple[I64, list[str]]:
        """The site of calls made on threads (``pid``, ``tid``; tid -1: none known) at times
        ``start``, as codes into a list of names."""
        nodes = np.zeros(len(pid), dtype=np.int64)
        known = np.flatnonzero(tid != NO_THREAD)
        if len(known):
            threads = _thread_key(pid[known], tid[known])
            if bool((threads == threads[0]).all()):  # one thread allocates: no grouping
                uniq, by_thread, bounds = threads[:1], known, np.zeros(0, dtype=np.int64)
            else:
                uniq, inverse = np.unique(threads, return_inverse=True)
                by_thread = np.argsort(inverse, kind="stable")
                bounds = np.searchsorted(inverse[by_thread], np.arange(len(uniq) + 1))
            for t, thread_key in enumerate(uniq.tolist()):
                thread = self._thread(thread_key)
                if thread is None:
                    continue
                rows = known if len(uniq) == 1 else known[by_thread[bounds[t] : bounds[t + 1]]]
                pos = np.searchsorted(thread.boundaries_ns, start[rows], side="right")
                # Before the first boundary (pos 0) no range encloses the call.
                nodes[rows] = np.concatenate([[_ROOT], thread.nodes])[pos]
        # The nodes in use, ascending, and each one's rank among them: trie nodes are few and
        # dense, so a table over them does what a sort of every event's node would.
        present = np.zeros(self._trie.size, dtype=np.bool_)
        present[nodes] = True
        used = np.flatnonzero(present)
        rank = np.zeros(self._trie.size, dtype=np.int64)
        rank[used] = np.arange(len(used))
        inverse = rank[nodes]
        del nodes
        # Codes by name: different stacks can read the same ("a/b" pushed once, or a then b).
        code_of: dict[str, int] = {NO_RANGE: 0}
        local = np.array(
            [code_of.setdefault(self._trie.name(n), len(code_of)) for n in used.tolist()],
            dtype=np.int64,
        )
        return local[inverse.reshape(-1)], list(code_of)

    def sites(self, event_index: I64) -> list[str]:
        """The site of each memory event in ``event_index``."""
        codes, names = self.site_codes(event_index)
        return [names[c] for c in codes.tolist()]

    def _thread(self, thread_key: int) -> _ThreadSites | None:
        if thread_key not in self._threads:
            lo = np.searchsorted(self._nvtx_keys, thread_key, side="left")
            hi = np.searchsorted(self._nvtx_keys, thread_key, side="right")
            rows = self._nvtx_order[lo:hi]
            self._threads[thread_key] = self._sweep(thread_key, rows) if len(rows) else None
        return self._threads[thread_key]

    def _sweep(self, thread_key: int, rows: I64) -> _ThreadSites:
        """The site after every start and end of the thread's ranges ``rows``, in one pass."""
        n = self._nvtx
        starts, ends, push_pop = n.start_ns[rows], n.end_ns[rows], n.is_push_pop[rows]
        trie = self._trie
        text = [trie.text_id(n.text[r]) for r in rows.tolist()]
        # Enclosing ranges sort outermost first by (start, -end, row); ranges open in that
        # order, so an opening one always goes on top of the stack.
        local = np.arange(len(rows))
        opening = np.lexsort((local, -ends, starts)).tolist()
        closing = np.argsort(ends, kind="stable").tolist()
        points = np.unique(np.concatenate([starts, ends]))
        starts_l, ends_l, push_pop_l = starts.tolist(), ends.tolist(), push_pop.tolist()
        stack: list[int] = []  # open push/pop ranges, outermost first
        stack_nodes: list[int] = []  # stack_nodes[k]: the site of stack[: k + 1]
        position = [-1] * len(rows)
        closed = [False] * len(rows)
        open_start_end: list[tuple[int, int]] = []  # a max-heap of (start, row), negated
        nodes = np.empty(len(points), dtype=np.int64)
        o = c = 0
        for j, point in enumerate(points.tolist()):
            lowest_closed = len(stack)
            while c < len(closing) and ends_l[closing[c]] <= point:
                r = closing[c]
                closed[r] = True
                if push_pop_l[r]:
                    lowest_closed = min(lowest_closed, position[r])
                c += 1
            if lowest_closed < len(stack):
                self._close(thread_key, lowest_closed, stack, stack_nodes, position, closed, text)
            while o < len(opening) and starts_l[opening[o]] <= point:
                r = opening[o]
                if push_pop_l[r]:
                    position[r] = len(stack)
                    stack.append(r)
                    stack_nodes.append(trie.child(stack_nodes[-1] if stack_nodes else _ROOT, text[r]))
                else:
                    heapq.heappush(open_start_end, (-starts_l[r], -r))
                o += 1
            if stack_nodes:
                nodes[j] = stack_nodes[-1]
                continue
            while open_start_end and closed[-open_start_end[0][1]]:
                heapq.heappop(open_start_end)
            nodes[j] = trie.child(_ROOT, text[-open_start_end[0][1]]) if open_start_end else _ROOT
        return _ThreadSites(points, nodes)

    def _close(
        self,
        thread_key: int,
        lowest: int,
        stack: list[int],
        stack_nodes: list[int],
        position: list[int],
        closed: list[bool],
        text: list[int],
    ) -> None:
        """Drop the closed ranges from the stack, from position ``lowest`` up: with nested
        ranges those are the top ones; with crossing ranges the open ones above are pushed again."""
        kept = [r for r in stack[lowest:] if not closed[r]]
        del stack[lowest:], stack_nodes[lowest:]
        self._crossing_work += len(kept)
        if self._crossing_work > CROSSING_WORK:
            raise InputError(
                f"the NVTX push/pop ranges of thread {thread_key & 0xFFFFFF} of process"
                f" {thread_key >> 24} cross each other (a range ends while one opened inside it"
                " is still open) more often than the sweep allows; NVTX nests push/pop ranges,"
                " so the trace is damaged: re-export it with `nsys export --type sqlite`"
            )
        for r in kept:
            position[r] = len(stack)
            stack.append(r)
            parent = stack_nodes[-1] if stack_nodes else _ROOT
            stack_nodes.append(self._trie.child(parent, text[r]))

"""``arena``: one arena reserved up front, sub-allocated best fit inside it.

What a program that calls ``cudaMalloc`` for every buffer can do instead (a server reserving
its memory at start, as inference engines do): one ``cudaMalloc`` when the program starts, and
every request carved from that range by the program itself.

* **The arena.** Its size is ``arena:size=BYTES`` when given, else the program's peak need:
  the most bytes its requests (rounded up to 512 B) held at once over the stream, rounded up
  to whole 2 MiB pages, and never more than the capacity C. It is reserved at the first event
  and held to the end: reserved memory is the arena, whatever is live.
* **Placement.** The ``best-fit`` heap's (smallest hole that fits, ties to the lowest address,
  coalescing frees) inside the arena: the heap may not grow past it. A request that fits no
  hole and not the space above the heap's top is a simulated OOM: the arena never grows and
  never gives memory back (``torch.cuda.empty_cache()`` changes nothing).

``F`` is the arena's holes plus the space above its top, ``L`` the largest of them and ``N``
their number; the device's memory outside the arena is not the program's to use.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from nsysfrag import jit
from nsysfrag.allocators.base import (
    ALLOC,
    FREE,
    I64,
    PAGE_BYTES,
    Outputs,
    RequestStream,
    SimResult,
    kernel_step,
)
from nsysfrag.allocators.event_loop import replay, run_kernel
from nsysfrag.allocators.family import PolicyFamily
from nsysfrag.allocators.heap import (
    BEST_FIT,
    GRANULARITY,
    Heap,
    give_request,
    heap_state,
    new_heap,
    take_request,
)
from nsysfrag.errors import InputError
from nsysfrag.units import SizeError, format_bytes, parse_bytes

# The kernel names this module's compiled functions through the module object: numba caches a
# compiled function that hands other compiled functions on only when it reaches them that way.
this = sys.modules[__name__]


@dataclass(frozen=True)
class ArenaOptions:
    """The arena's size in bytes (None: the program's peak need)."""

    size_bytes: int | None = None

    @classmethod
    def parse(cls, text: str) -> ArenaOptions:
        if not text:
            return cls()
        key, _, value = text.partition("=")
        if key.strip() != "size" or not value.strip():
            raise InputError(f"--policy arena:{text}: arena takes size=BYTES (e.g. size=40GiB)")
        try:
            return cls(parse_bytes(value.strip(), minimum=1))
        except SizeError as err:
            raise InputError(f"--policy arena:{text}: {value.strip()}: {err}") from None

    def label(self) -> str:
        return "" if self.size_bytes is None else f"size={format_bytes(self.size_bytes)}"

    def summary(self) -> dict[str, object]:
        return {"size_bytes": self.size_bytes}

    def conf_string(self) -> str:
        return ""


def peak_need(stream: RequestStream) -> int:
    """The most bytes the stream's requests, rounded up to 512 B, hold at once, in whole pages."""
    rounded = -(-stream.size // GRANULARITY) * GRANULARITY
    step = np.zeros(stream.n_events, dtype=np.int64)
    alloc, free = stream.kind == ALLOC, stream.kind == FREE
    step[alloc] = rounded[stream.request[alloc]]
    step[free] = -rounded[stream.request[free]]
    most = int(np.cumsum(step).max()) if stream.n_events else 0
    return _whole_pages(most)


def _whole_pages(n: int) -> int:  # in Python: the heap's ``pages`` is compiled code
    return -(-n // PAGE_BYTES) * PAGE_BYTES


class ArenaModel(NamedTuple):
    heap: Heap  # its capacity is the arena's size
    address: I64  # per request: where it lives, -1 when it holds nothing
    block: I64  # per request: the bytes it took
    arena: I64  # [0]: the arena's bytes (reserved from the first event to the last)


@kernel_step
def _place(m: ArenaModel, event: int, r: int, nbytes: int) -> int:
    return take_request(m.heap, m.address, m.block, r, nbytes)


@kernel_step
def _release(m: ArenaModel, r: int) -> int:
    return give_request(m.heap, m.address, m.block, r)


@kernel_step
def _empty_cache(m: ArenaModel, event: int) -> int:
    return 0  # the arena is the program's own: nothing goes back to the driver


@kernel_step
def _measure(m: ArenaModel, allocated: int) -> tuple[int, int, int, int, int]:
    """(F, L, N, reserved, R): the arena is held whole for the run, so nothing is releasable."""
    f, lg, nb = heap_state(m.heap, m.arena[0])
    return f, lg, nb, m.arena[0], 0


@jit.njit(cache=True)
def _arena_kernel(kind: I64, request: I64, size: I64, m: ArenaModel, out: Outputs) -> int:
    return replay(kind, request, size, m, this._place, this._release, this._empty_cache,
                  this._measure, out, 0, 0)  # fmt: skip


def simulate_arena(stream: RequestStream, capacity_bytes: int, options: Any = None) -> SimResult:
    asked = options.size_bytes if isinstance(options, ArenaOptions) else None
    # Whole pages: the arena is one cudaMalloc, which the driver backs with whole pages.
    size = min(_whole_pages(asked) if asked is not None else peak_need(stream), capacity_bytes)
    n_req = stream.n_requests
    model = ArenaModel(
        new_heap(size, n_req + 2, BEST_FIT), np.full(n_req, -1, dtype=np.int64),
        np.zeros(n_req, dtype=np.int64), np.full(1, size, dtype=np.int64),
    )  # fmt: skip
    return run_kernel(_arena_kernel, stream, model)


FAMILY = PolicyFamily(
    "arena",
    ("arena-up-front",),
    "one arena reserved up front, best fit inside it",
    simulate_arena,
    parse_options=ArenaOptions.parse,
)

"""What every allocator model shares: the request stream it replays and the state it reports
after every event.

A model replays a :class:`RequestStream` — allocations (size, stream) and frees of earlier
allocations, in order — on a simulated device of ``capacity_bytes`` and reports, after every
event, what it holds from the device and how it holds it, in the terms analyze's state model
uses: reserved bytes, ``F`` the free bytes inside them, ``L`` the largest free block there,
``N`` the free blocks, ``R`` the free bytes it could give back to the device at once by its own
rules (whole free segments, chunks, pools), plus allocated (block) and requested (live) bytes.
``whatif.states`` turns them into analyze's figures over everything free on the device. A request the model cannot place is a simulated OOM: it is
recorded with the largest free block at that moment, stays unplaced, and its free is ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
import numpy.typing as npt

from nsysfrag import jit
from nsysfrag.errors import InputError


I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
PAGE_BYTES = 2 * MiB  # GPU physical page (and kSmallBuffer): the unit reserved memory comes in

# Every compiled function a model's kernel calls takes the model's state — a tuple of arrays — by
# value. With numba's runtime on, each such call increments and decrements the reference count
# of every array in the tuple on the way in and out: atomic operations that, at a few calls per
# event, cost the replay a third of its time (bench_whatif). These functions run without the
# runtime (numba's ``_nrt=False``): none of them allocates or returns a new array (one that
# tried would not compile, which keeps them pure array code). Only the kernel Python calls, and
# what builds the state, keep it.
Function = TypeVar("Function", bound=Callable[..., Any])
_WITHOUT_RUNTIME: dict[str, Any] = {"cache": True, "_nrt": False}  # _nrt: not in numba's stubs


def kernel_step(fn: Function) -> Function:
    """``fn`` compiled to run inside a kernel, without numba's runtime."""
    return cast(Function, jit.njit(**_WITHOUT_RUNTIME)(fn))


def kernel_step_inline(fn: Function) -> Function:
    """``kernel_step`` for a few lines that every caller gets a copy of (numba inlines them)."""
    return cast(Function, jit.njit(inline="always", **_WITHOUT_RUNTIME)(fn))


# Event kinds of a request stream.
ALLOC = 0
FREE = 1
EMPTY_CACHE = 2  # the program called torch.cuda.empty_cache() (snapshots record where)

UNLIMITED = 1 << 62
MAX_REQUEST_BYTES = 1 << 46  # 64 TiB: larger is no GPU's request (and would overflow set keys)


@dataclass(frozen=True)
class RequestStream:
    """Allocations and frees in order, the input every model replays.

    ``kind[i]`` is ALLOC, FREE or EMPTY_CACHE; ``request[i]`` the request an ALLOC creates or a
    FREE releases (an index into the per-request arrays).
    """

    kind: I8
    request: I64
    time_ns: I64
    size: I64  # per request: requested bytes (> 0)
    stream: I64  # per request: stream index, 0 .. n_streams - 1
    stream_names: tuple[str, ...] = ("0",)

    @property
    def n_events(self) -> int:
        return len(self.kind)

    @property
    def n_requests(self) -> int:
        return len(self.size)

    @classmethod
    def build(
        cls,
        kind: Any,
        request: Any,
        time_ns: Any,
        size: Any,
        stream: Any | None = None,
        stream_names: tuple[str, ...] | None = None,
    ) -> RequestStream:
        size = np.asarray(size, dtype=np.int64)
        if len(size) and (int(size.max()) > MAX_REQUEST_BYTES or int(size.min()) < 1):
            bad = int(size.max()) if int(size.max()) > MAX_REQUEST_BYTES else int(size.min())
            raise InputError(
                f"a request of {bad} bytes cannot be replayed (requests are 1 byte to 64 TiB);"
                " the input is corrupt"
            )
        stream = np.zeros(len(size), np.int64) if stream is None else np.asarray(stream, np.int64)
        n_streams = int(stream.max()) + 1 if len(stream) else 1
        return cls(
            kind=np.asarray(kind, dtype=np.int8),
            request=np.asarray(request, dtype=np.int64),
            time_ns=np.asarray(time_ns, dtype=np.int64),
            size=size,
            stream=stream,
            stream_names=stream_names or tuple(str(i) for i in range(n_streams)),
        )


# Segment log codes (the torch model's cudaMalloc / cudaFree / cuMemMap / cuMemUnmap calls).
LOG_SEGMENT_ALLOC = 1
LOG_SEGMENT_FREE = 2
LOG_SEGMENT_MAP = 3
LOG_SEGMENT_UNMAP = 4


class Outputs(NamedTuple):
    """A kernel's figures after every event, and its simulated OOMs (trimmed afterwards)."""

    free_bytes: I64  # F: free bytes inside reserved memory
    largest_free_bytes: I64  # L: the largest free block inside reserved memory
    free_blocks: I64  # N
    reserved_bytes: I64
    allocated_bytes: I64  # bytes of the blocks handed out (rounded, unsplit)
    live_bytes: I64  # requested bytes of the live requests
    releasable_bytes: I64  # R: the part of F the model could return to the device at once
    oom_event: I64  # event index of each simulated OOM
    oom_largest_free_bytes: I64  # L right after the model gave up on that request

    @classmethod
    def empty(cls, n_events: int, n_requests: int) -> Outputs:
        per_event = [np.zeros(n_events, dtype=np.int64) for _ in range(7)]
        per_oom = [np.zeros(n_requests + 1, dtype=np.int64) for _ in range(2)]
        return cls(*per_event, *per_oom)


@dataclass(frozen=True)
class SimResult:
    """A model's state after every event of the stream, and its simulated OOMs (the columns
    are :class:`Outputs`')."""

    free_bytes: I64
    largest_free_bytes: I64
    free_blocks: I64
    reserved_bytes: I64
    allocated_bytes: I64  # bytes of the blocks handed out (rounded, unsplit)
    live_bytes: I64  # requested bytes of the live requests
    releasable_bytes: I64
    oom_event: I64  # event index of each simulated OOM
    oom_largest_free_bytes: I64  # L right after the model gave up on that request
    segment_log: dict[str, I64] = field(default_factory=dict)  # kind, size, event, address

    @classmethod
    def of(cls, out: Outputs, ooms: int, segment_log: dict[str, I64] | None = None) -> SimResult:
        """From a kernel's outputs and its OOM count."""
        return cls(
            out.free_bytes, out.largest_free_bytes, out.free_blocks, out.reserved_bytes,
            out.allocated_bytes, out.live_bytes, out.releasable_bytes, out.oom_event[:ooms].copy(),
            out.oom_largest_free_bytes[:ooms].copy(), segment_log or {},
        )  # fmt: skip

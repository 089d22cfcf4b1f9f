"""``torch``: PyTorch's native CUDA caching allocator (``CUDACachingAllocator.cpp``), ported rule
for rule from the source as ALLOCATORS.md §1 records it (@001074d, the 2.4/2.5 era):

* ``round_size``: at least 512 B, a multiple of 512 B, or the next of
  ``roundup_power2_divisions`` steps between powers of two where configured (``d > 1`` and
  ``size > 512·d``).
* Pools: rounded size <= 1 MiB is the small pool, else large; free blocks of a pool are kept per
  stream in a set ordered by ``(stream, size, address)``, and a block is never used by another
  stream.
* ``get_free_block``: best fit, ``lower_bound(stream, size)``; with ``max_split_size`` a request
  below it may not take a cached block of at least it, and a request at or above it may not
  take a block of ``size + max_non_split_rounding`` (20 MiB) or more — without trying the next
  candidate. With expandable segments a block followed by unmapped space counts as that much
  larger.
* New segments (``alloc_block``): 2 MiB for the small pool, 20 MiB for requests under 10 MiB,
  else the request rounded up to 2 MiB; a segment takes the stream of the request that made it.
* ``should_split``: small pool or expandable segments: remaining >= 512 B; large pool: request
  < ``max_split_size`` and remaining > 1 MiB. The request is carved from the block's low end.
* ``free``: merge with free neighbours inside the same segment only; nothing returns to CUDA.
* Release (``cudaFree``) only on the OOM path — ``release_available_cached_blocks`` (oversize
  blocks, only with ``max_split_size``) then ``release_cached_blocks`` (every whole free
  segment, and the free pages of expandable segments) and one retry — or on ``empty_cache``;
  with ``garbage_collection_threshold`` also the garbage collector before ``cudaMalloc``.
* ``expandable_segments``: one virtual segment per (stream, pool) of 1.125 × C, mapped in 2 MiB
  (small) or 20 MiB (large) pages at the lowest address that fits; a release unmaps only whole
  free pages.

The device: ``cudaMalloc`` or a page map fails when reserved + the new bytes would exceed the
capacity C. ``garbage_collection_threshold`` needs a memory fraction in PyTorch; the model takes
the fraction to be set with C as the allowed maximum, or the option would do nothing. CUDA graph
pools, ``record_stream`` (deferred frees) and the free-memory callbacks are not modelled: a
stream's lifetimes are ``alloc`` → ``free_completed``.

Free memory for the SPEC metrics is what the allocator caches: ``F`` = reserved − allocated
(the free blocks inside segments or mapped pages), ``L`` the largest cached free block, ``N``
their number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numba
import numpy as np

from nsysfrag.allocators.base import (
    ALLOC,
    EMPTY_CACHE,
    FAIL_ALL,
    FAIL_FIRST,
    FAIL_RELEASE,
    FREE,
    I64,
    K1,
    UNLIMITED,
    VAL,
    MiB,
    RequestStream,
    SimResult,
    empty_outputs,
    new_treap,
    t_before,
    t_erase,
    t_insert,
    t_last,
    t_lower_bound,
    t_next,
    t_prev,
)
from nsysfrag.errors import InputError

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 * MiB
K_SMALL_BUFFER = 2 * MiB
K_LARGE_BUFFER = 20 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB
DIVISION_INTERVALS = 16
SIZE_SHIFT = 48  # free-set key: pool key << 48 | size

# Block fields (node-major: one block's fields share a cache line).
ADDR, SIZE, REQ, PREV, NEXT, ALLOCATED, MAPPED, PK, ES, GCBASE, CPREV, CNEXT, FLAGS = range(13)
B_FIELDS = 13
IN_FREE, IN_UNMAPPED, IN_CAND = 1, 2, 4

# Scalars.
(S_RES, S_F, S_N, S_ALLOC, S_LIVE, S_NEXT_ADDR, S_NEXT_ID, S_FREE_IDS, S_FAIL_MODE, S_FAILS,
 S_CAND_HEAD, S_N_ES, S_LOG_N, S_EVENT, S_OVERFLOW) = range(15)  # fmt: skip
S_FIELDS = 15

# Configuration.
C_MSS, C_MNSR, C_EXP, C_GC_LIMIT, C_CAP, C_ES_VA, C_DIV = range(7)
C_FIELDS = C_DIV + DIVISION_INTERVALS

# Expandable segments.
E_BASE, E_VA, E_PAGE, E_PK = range(4)

# Segment log.
L_KIND, L_ADDR, L_SIZE, L_EVENT = range(4)
LOG_ALLOC, LOG_FREE, LOG_MAP, LOG_UNMAP = 1, 2, 3, 4
ADDRESS_BASE = 1 << 48  # where simulated segments start: above every user-space GPU address


# ------------------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class TorchConfig:
    """The PYTORCH_CUDA_ALLOC_CONF options the caching allocator's placement depends on."""

    max_split_size: int = UNLIMITED
    max_non_split_rounding: int = K_LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = (0,) * DIVISION_INTERVALS
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0
    given: dict[str, str] = field(default_factory=dict, compare=False)  # the options as written

    @classmethod
    def parse(cls, text: str) -> TorchConfig:
        """``expandable_segments:True,max_split_size_mb:128`` (``=`` works as well as ``:``)."""
        values: dict[str, object] = {}
        given: dict[str, str] = {}
        for item in split_options(text):
            m = re.fullmatch(r"\s*([A-Za-z0-9_]+)\s*[:=]\s*(.+?)\s*", item)
            if not m:
                raise InputError(
                    f"torch option {item!r}: write KEY=VALUE or KEY:VALUE, e.g."
                    " torch:expandable_segments=True,max_split_size_mb=128"
                )
            key, value = m.group(1), m.group(2)
            given[key] = value
            values[key] = _parse_option(key, value)
        kw = {_FIELDS[key]: value for key, value in values.items() if key in _FIELDS}
        return cls(**kw, given=given)  # type: ignore[arg-type]

    @classmethod
    def from_settings(
        cls,
        max_split_size: int | None,
        divisions: dict[int, int],
        expandable: bool,
        conf: str | None,
    ) -> TorchConfig:
        """The configuration a snapshot's ``allocator_settings`` record."""
        divs = [0] * DIVISION_INTERVALS
        for start_mib, d in divisions.items():
            if start_mib >= 1:
                divs[min(max(start_mib.bit_length() - 1, 0), DIVISION_INTERVALS - 1)] = d
        given = {}
        if conf:
            try:
                given = cls.parse(conf).given
            except InputError:
                given = {}
        return cls(
            max_split_size=max_split_size if max_split_size else UNLIMITED,
            roundup_power2_divisions=tuple(divs),
            expandable_segments=expandable,
            given=given,
        )

    def conf_string(self) -> str:
        """The PYTORCH_CUDA_ALLOC_CONF that sets this configuration ('' for the defaults)."""
        parts = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.max_split_size < UNLIMITED:
            parts.append(f"max_split_size_mb:{self.max_split_size // MiB}")
        if self.max_non_split_rounding != K_LARGE_BUFFER:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding // MiB}")
        if any(self.roundup_power2_divisions):
            divs = self.roundup_power2_divisions
            if len(set(divs)) == 1:
                parts.append(f"roundup_power2_divisions:{divs[0]}")
            else:
                items = [f"{1 << i}:{d}" for i, d in enumerate(divs)]
                parts.append("roundup_power2_divisions:[" + ",".join(items) + "]")
        if self.garbage_collection_threshold > 0:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold:g}")
        return ",".join(parts)

    def options(self) -> dict[str, object]:
        """The effective options, for the JSON report."""
        return {
            "expandable_segments": self.expandable_segments,
            "max_split_size_mb": None if self.max_split_size >= UNLIMITED else self.max_split_size // MiB,
            "max_non_split_rounding_mb": self.max_non_split_rounding // MiB,
            "roundup_power2_divisions": list(self.roundup_power2_divisions),
            "garbage_collection_threshold": self.garbage_collection_threshold,
        }

    def vector(self, capacity_bytes: int, es_va_bytes: int | None = None) -> I64:
        cfg = np.zeros(C_FIELDS, dtype=np.int64)
        cfg[C_MSS] = self.max_split_size
        cfg[C_MNSR] = self.max_non_split_rounding
        cfg[C_EXP] = int(self.expandable_segments)
        gc = self.garbage_collection_threshold
        cfg[C_GC_LIMIT] = int(gc * capacity_bytes) if gc > 0 else -1
        cfg[C_CAP] = capacity_bytes
        if es_va_bytes is None:
            es_va_bytes = min(capacity_bytes + capacity_bytes // 8, 1 << 50)
        cfg[C_ES_VA] = es_va_bytes
        cfg[C_DIV : C_DIV + DIVISION_INTERVALS] = self.roundup_power2_divisions
        return cfg


_FIELDS = {  # option -> TorchConfig field
    "max_split_size_mb": "max_split_size",
    "max_non_split_rounding_mb": "max_non_split_rounding",
    "roundup_power2_divisions": "roundup_power2_divisions",
    "expandable_segments": "expandable_segments",
    "garbage_collection_threshold": "garbage_collection_threshold",
}


def split_options(text: str) -> list[str]:
    """Split on commas outside ``[...]`` (roundup_power2_divisions lists contain commas)."""
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    return [i for i in items if i.strip()]


_IGNORED = ("release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
            "pinned_num_register_threads", "pinned_use_background_threads",
            "graph_capture_record_stream_reuse", "pinned_reserve_segment_size_mb")  # fmt: skip


def _parse_option(key: str, value: str) -> object:
    v = value.strip()
    if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        if not v.isdigit():
            raise InputError(f"torch option {key}={value}: a whole number of MB (e.g. {key}=128)")
        mb = int(v)
        if mb < K_LARGE_BUFFER // MiB:
            raise InputError(f"torch option {key}={value}: PyTorch requires at least 20 (MB)")
        return mb * MiB
    if key == "expandable_segments":
        if v.lower() not in ("true", "false"):
            raise InputError(f"torch option expandable_segments={value}: True or False")
        return v.lower() == "true"
    if key == "garbage_collection_threshold":
        try:
            t = float(v)
        except ValueError:
            t = -1.0
        if not 0.0 < t < 1.0:
            raise InputError(
                f"torch option garbage_collection_threshold={value}: a fraction strictly between"
                " 0 and 1 (e.g. 0.6)"
            )
        return t
    if key == "roundup_power2_divisions":
        return _parse_divisions(v)
    if key == "backend":
        if v == "native":
            return None
        raise InputError(
            f"torch option backend={value}: the cudaMallocAsync backend is its own policy;"
            " pass --policy cuda-async"
        )
    if key in _IGNORED:
        return None
    raise InputError(
        f"torch option {key!r} is unknown; the placement options are expandable_segments,"
        " max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions and"
        " garbage_collection_threshold"
    )


def _division_value(text: str, where: str) -> int:
    if not text.strip().isdigit():
        raise InputError(f"torch option roundup_power2_divisions={where}: divisions are whole numbers")
    d = int(text)
    if d != 0 and d & (d - 1):
        raise InputError(
            f"torch option roundup_power2_divisions={where}: {d} is not a power of 2 (or 0)"
        )
    return d


def _parse_divisions(v: str) -> tuple[int, ...]:
    """A scalar for all intervals, or ``[k:v,…,>:v]`` with k in MB (ALLOCATORS.md §1.2)."""
    if not v.startswith("["):
        return (_division_value(v, v),) * DIVISION_INTERVALS
    if not v.endswith("]"):
        raise InputError(f"torch option roundup_power2_divisions={v}: close the list with ]")
    divs = [0] * DIVISION_INTERVALS
    last = -1
    first = True
    for item in v[1:-1].split(","):
        if ":" not in item:
            raise InputError(f"torch option roundup_power2_divisions={v}: items are KEY:VALUE")
        k, d_text = (s.strip() for s in item.split(":", 1))
        d = _division_value(d_text, v)
        if k == ">":
            for i in range(last + 1, DIVISION_INTERVALS):
                divs[i] = d
            continue
        if not k.isdigit() or int(k) == 0 or int(k) & (int(k) - 1):
            raise InputError(
                f"torch option roundup_power2_divisions={v}: keys are powers of 2 in MB, or >"
            )
        idx = min(int(k).bit_length() - 1, DIVISION_INTERVALS - 1)
        if first:
            for i in range(idx):
                divs[i] = d
            first = False
        divs[idx] = d
        last = idx
    return tuple(divs)


def round_size(size: int, divisions: tuple[int, ...] = (0,) * DIVISION_INTERVALS) -> int:
    """PyTorch's ``round_size`` (for tests and reports; the kernel has its own copy)."""
    return int(_round_size(size, np.asarray(divisions, dtype=np.int64)))


# ---------------------------------------------------------------------------- the kernel


@numba.njit(cache=True)
def _round_size(size: int, divs: I64) -> int:
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    lg = 63
    while lg > 0 and (size >> lg) == 0:
        lg -= 1
    idx = lg - 20
    idx = max(idx, 0)
    idx = min(idx, DIVISION_INTERVALS - 1)
    d = divs[idx]
    if d > 1 and size > K_MIN_BLOCK * d:
        if size & (size - 1) == 0:
            return size
        floor2 = 1 << lg
        step = floor2 // d
        if step == 0:
            return floor2 << 1
        f = size & ~(step - 1)
        return size if f == size else f + step
    return -(-size // K_MIN_BLOCK) * K_MIN_BLOCK


@numba.njit(cache=True)
def _allocation_size(size: int) -> int:
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


@numba.njit(cache=True)
def _new_block(b: I64, s: I64, ids: I64) -> int:
    if s[S_FREE_IDS] > 0:
        s[S_FREE_IDS] -= 1
        n = ids[s[S_FREE_IDS]]
    else:
        if s[S_NEXT_ID] + 1 >= len(b):
            s[S_OVERFLOW] = 1
            return 0
        s[S_NEXT_ID] += 1
        n = s[S_NEXT_ID]
    for f in range(B_FIELDS):
        b[n, f] = 0
    b[n, ES] = -1
    b[n, MAPPED] = 1
    return int(n)


@numba.njit(cache=True)
def _del_block(s: I64, ids: I64, n: int) -> None:
    ids[s[S_FREE_IDS]] = n
    s[S_FREE_IDS] += 1


@numba.njit(cache=True)
def _log(log: I64, s: I64, kind: int, address: int, size: int) -> None:
    k = s[S_LOG_N]
    if k < len(log):
        log[k, L_KIND] = kind
        log[k, L_ADDR] = address
        log[k, L_SIZE] = size
        log[k, L_EVENT] = s[S_EVENT]
        s[S_LOG_N] = k + 1
    else:
        s[S_OVERFLOW] = 1


@numba.njit(cache=True)
def _is_candidate(b: I64, es: I64, n: int) -> bool:
    """Could release_cached_blocks return (part of) this free block to CUDA?"""
    if b[n, ES] < 0:
        return bool(b[n, PREV] == 0 and b[n, NEXT] == 0)
    return bool(b[n, SIZE] >= es[b[n, ES], E_PAGE])


@numba.njit(cache=True)
def _cand_add(b: I64, s: I64, n: int) -> None:
    head = s[S_CAND_HEAD]
    b[n, CPREV] = 0
    b[n, CNEXT] = head
    if head != 0:
        b[head, CPREV] = n
    s[S_CAND_HEAD] = n
    b[n, FLAGS] |= IN_CAND


@numba.njit(cache=True)
def _cand_remove(b: I64, s: I64, n: int) -> None:
    p = b[n, CPREV]
    q = b[n, CNEXT]
    if p != 0:
        b[p, CNEXT] = q
    else:
        s[S_CAND_HEAD] = q
    if q != 0:
        b[q, CPREV] = p
    b[n, FLAGS] &= ~IN_CAND


@numba.njit(cache=True)
def _free_insert(b: I64, s: I64, tf: I64, ts: I64, es: I64, gcc: I64, n: int) -> None:
    """Put a free mapped block into its pool's cached set (insert_into_blocks)."""
    size = b[n, SIZE]
    t_insert(tf, n, (b[n, PK] << SIZE_SHIFT) | size, b[n, ADDR], size)
    t_insert(ts, n, size, 0, size)
    b[n, FLAGS] |= IN_FREE
    b[n, GCBASE] = gcc[b[n, PK]]
    s[S_F] += size
    s[S_N] += 1
    if _is_candidate(b, es, n):
        _cand_add(b, s, n)


@numba.njit(cache=True)
def _free_remove(b: I64, s: I64, tf: I64, ts: I64, n: int) -> None:
    t_erase(tf, n)
    t_erase(ts, n)
    b[n, FLAGS] &= ~IN_FREE
    s[S_F] -= b[n, SIZE]
    s[S_N] -= 1
    if b[n, FLAGS] & IN_CAND:
        _cand_remove(b, s, n)


@numba.njit(cache=True)
def _unmapped_insert(b: I64, tu: I64, n: int) -> None:
    t_insert(tu, n, b[n, PK], b[n, ADDR], b[n, SIZE])
    b[n, FLAGS] |= IN_UNMAPPED


@numba.njit(cache=True)
def _unmapped_remove(b: I64, tu: I64, n: int) -> None:
    t_erase(tu, n)
    b[n, FLAGS] &= ~IN_UNMAPPED


@numba.njit(cache=True)
def _try_merge(b: I64, s: I64, ids: I64, tf: I64, ts: I64, tu: I64, dst: int, src: int) -> int:
    """try_merge_blocks: absorb a free neighbour of the same mapping state into ``dst``."""
    if src == 0 or b[src, ALLOCATED] != 0 or b[src, MAPPED] != b[dst, MAPPED]:
        return 0
    if b[src, FLAGS] & IN_FREE:
        _free_remove(b, s, tf, ts, src)
    if b[src, FLAGS] & IN_UNMAPPED:
        _unmapped_remove(b, tu, src)
    if b[dst, PREV] == src:
        b[dst, ADDR] = b[src, ADDR]
        b[dst, PREV] = b[src, PREV]
        if b[dst, PREV] != 0:
            b[b[dst, PREV], NEXT] = dst
    else:
        b[dst, NEXT] = b[src, NEXT]
        if b[dst, NEXT] != 0:
            b[b[dst, NEXT], PREV] = dst
    size = b[src, SIZE]
    b[dst, SIZE] += size
    _del_block(s, ids, src)
    return int(size)


@numba.njit(cache=True)
def _pool_of(tf: I64, n: int) -> int:
    return int(tf[n, K1] >> SIZE_SHIFT)


@numba.njit(cache=True)
def _xsize(b: I64, n: int) -> int:
    nx = b[n, NEXT]
    return int(b[n, SIZE] + (b[nx, SIZE] if nx != 0 and b[nx, MAPPED] == 0 else 0))


@numba.njit(cache=True)
def _get_free_block(
    b: I64, s: I64, cfg: I64, tf: I64, ts: I64, gcc: I64, pk: int, size: int
) -> int:
    if cfg[C_GC_LIMIT] >= 0:
        gcc[pk] += 1
    n = t_lower_bound(tf, (pk << SIZE_SHIFT) | size, 0)
    if n == 0 or _pool_of(tf, n) != pk:
        return 0
    if b[n, ES] >= 0:
        if cfg[C_EXP] != 0:
            nx = t_next(tf, n)
            while b[n, ES] >= 0 and nx != 0 and _pool_of(tf, nx) == pk and _xsize(b, nx) < _xsize(b, n):
                n = nx
                nx = t_next(tf, n)
        else:
            while n != 0 and _pool_of(tf, n) == pk and b[n, ES] >= 0:
                n = t_next(tf, n)
            if n == 0 or _pool_of(tf, n) != pk:
                return 0
    mss = cfg[C_MSS]
    if size < mss and b[n, SIZE] >= mss:
        return 0
    if size >= mss and b[n, SIZE] >= size + cfg[C_MNSR]:
        return 0
    _free_remove(b, s, tf, ts, n)
    return n


@numba.njit(cache=True)
def _release_block(b: I64, s: I64, ids: I64, tf: I64, ts: I64, log: I64, n: int) -> bool:
    """cudaFree a whole free segment."""
    if b[n, ES] >= 0 or b[n, PREV] != 0 or b[n, NEXT] != 0:
        return False
    _log(log, s, LOG_FREE, b[n, ADDR], b[n, SIZE])
    s[S_RES] -= b[n, SIZE]
    _free_remove(b, s, tf, ts, n)
    _del_block(s, ids, n)
    return True


@numba.njit(cache=True)
def _splice_before(b: I64, n: int, after: int) -> None:
    """Link new block ``n`` right before ``after`` in its segment."""
    p = b[after, PREV]
    b[n, PREV] = p
    b[n, NEXT] = after
    if p != 0:
        b[p, NEXT] = n
    b[after, PREV] = n


@numba.njit(cache=True)
def _splice_after(b: I64, n: int, before: int) -> None:
    q = b[before, NEXT]
    b[n, PREV] = before
    b[n, NEXT] = q
    if q != 0:
        b[q, PREV] = n
    b[before, NEXT] = n


@numba.njit(cache=True)
def _unmap_block(
    b: I64, s: I64, ids: I64, tf: I64, ts: I64, tu: I64, es: I64, gcc: I64, log: I64, n: int
) -> None:
    """Unmap the whole free pages of a free expandable block."""
    e = b[n, ES]
    base = es[e, E_BASE]
    page = es[e, E_PAGE]
    lo = b[n, ADDR] - base
    hi = lo + b[n, SIZE]
    begin = -(-lo // page)
    end = hi // page
    if begin >= end:
        return
    _free_remove(b, s, tf, ts, n)
    ustart = base + begin * page
    usize = (end - begin) * page
    before = ustart - b[n, ADDR]
    after = b[n, SIZE] - before - usize
    if before > 0:
        m = _new_block(b, s, ids)
        if m == 0:
            return
        b[m, ADDR] = b[n, ADDR]
        b[m, SIZE] = before
        b[m, PK] = b[n, PK]
        b[m, ES] = e
        _splice_before(b, m, n)
        _free_insert(b, s, tf, ts, es, gcc, m)
    if after > 0:
        m = _new_block(b, s, ids)
        if m == 0:
            return
        b[m, ADDR] = ustart + usize
        b[m, SIZE] = after
        b[m, PK] = b[n, PK]
        b[m, ES] = e
        _splice_after(b, m, n)
        _free_insert(b, s, tf, ts, es, gcc, m)
    b[n, ADDR] = ustart
    b[n, SIZE] = usize
    b[n, MAPPED] = 0
    _try_merge(b, s, ids, tf, ts, tu, n, b[n, PREV])
    _try_merge(b, s, ids, tf, ts, tu, n, b[n, NEXT])
    _unmapped_insert(b, tu, n)
    s[S_RES] -= usize
    _log(log, s, LOG_UNMAP, ustart, usize)
    if b[n, PREV] == 0 and b[n, NEXT] == 0:  # the whole segment is unmapped: release it
        _unmapped_remove(b, tu, n)
        _del_block(s, ids, n)


@numba.njit(cache=True)
def _release_cached_blocks(
    b: I64, s: I64, ids: I64, tf: I64, ts: I64, tu: I64, es: I64, gcc: I64, log: I64
) -> None:
    """Free every whole free segment; unmap the free pages of expandable segments."""
    count = 0
    n = s[S_CAND_HEAD]
    while n != 0:
        count += 1
        n = b[n, CNEXT]
    todo = np.empty(count, dtype=np.int64)
    n = s[S_CAND_HEAD]
    for k in range(count):
        todo[k] = n
        n = b[n, CNEXT]
    for k in range(count):
        n = todo[k]
        if b[n, ES] < 0:
            _release_block(b, s, ids, tf, ts, log, n)
        else:
            _unmap_block(b, s, ids, tf, ts, tu, es, gcc, log, n)


@numba.njit(cache=True)
def _release_available_cached_blocks(
    b: I64, s: I64, cfg: I64, ids: I64, tf: I64, ts: I64, log: I64, pk: int, size: int
) -> bool:
    """Free oversize blocks (only with max_split_size): one that is large enough, else the
    largest ones down to max_split_size until enough is released."""
    mss = cfg[C_MSS]
    if mss >= UNLIMITED:
        return False
    key = max(mss, size)
    n = t_lower_bound(tf, (pk << SIZE_SHIFT) | key, 0)
    if n == 0 or _pool_of(tf, n) != pk:
        it = t_before(tf, (pk << SIZE_SHIFT) | key, 0, 0)
        if it == 0:
            return False
        released = 0
        while released < key and it != 0 and b[it, SIZE] >= mss and _pool_of(tf, it) == pk:
            cur = it
            it = t_prev(tf, cur)
            freed = b[cur, SIZE]
            if _release_block(b, s, ids, tf, ts, log, cur):
                released += freed
        return bool(released >= key)
    if b[n, ES] >= 0:
        return False
    return _release_block(b, s, ids, tf, ts, log, n)


@numba.njit(cache=True)
def _garbage_collect(
    b: I64, s: I64, cfg: I64, ids: I64, tf: I64, ts: I64, gcc: I64, log: I64
) -> None:
    """garbage_collect_cached_blocks: free whole large-pool segments of at least mean age."""
    limit = cfg[C_GC_LIMIT]
    if s[S_RES] <= limit:
        return
    target = s[S_RES] - limit
    count = 0
    n = s[S_CAND_HEAD]
    while n != 0:
        count += 1
        n = b[n, CNEXT]
    blocks = np.empty(count, dtype=np.int64)
    k = 0
    total_age = 0
    n = s[S_CAND_HEAD]
    while n != 0:
        if b[n, ES] < 0 and (b[n, PK] & 1) == 0:
            blocks[k] = n
            total_age += gcc[b[n, PK]] - b[n, GCBASE]
            k += 1
        n = b[n, CNEXT]
    freeable = k
    if freeable == 0:
        return
    alive = np.ones(k, dtype=np.bool_)
    reclaimed = 0
    freed = True
    while reclaimed < target and freed and freeable > 0:
        threshold = total_age / freeable
        freed = False
        for j in range(k):
            if not alive[j]:
                continue
            n = blocks[j]
            age = gcc[b[n, PK]] - b[n, GCBASE]
            if age >= threshold:
                freed = True
                reclaimed += b[n, SIZE]
                total_age -= age
                freeable -= 1
                alive[j] = False
                _release_block(b, s, ids, tf, ts, log, n)


@numba.njit(cache=True)
def _map_block(
    b: I64, s: I64, cfg: I64, ids: I64, tf: I64, ts: I64, tu: I64, es: I64, gcc: I64,
    log: I64, n: int, size: int,
) -> bool:  # fmt: skip
    e = b[n, ES]
    base = es[e, E_BASE]
    page = es[e, E_PAGE]
    begin = (b[n, ADDR] - base) // page
    end = -(-(b[n, ADDR] + size - base) // page)
    msize = (end - begin) * page
    if s[S_RES] + msize > cfg[C_CAP]:
        return False
    start = b[n, ADDR]
    _unmapped_remove(b, tu, n)
    b[n, MAPPED] = 1
    if msize < b[n, SIZE]:
        m = _new_block(b, s, ids)
        if m == 0:
            return False
        b[m, ADDR] = start + msize
        b[m, SIZE] = b[n, SIZE] - msize
        b[m, MAPPED] = 0
        b[m, PK] = b[n, PK]
        b[m, ES] = e
        _splice_after(b, m, n)
        _unmapped_insert(b, tu, m)
        b[n, SIZE] = msize
    _try_merge(b, s, ids, tf, ts, tu, n, b[n, PREV])
    _try_merge(b, s, ids, tf, ts, tu, n, b[n, NEXT])
    _free_insert(b, s, tf, ts, es, gcc, n)
    s[S_RES] += msize
    _log(log, s, LOG_MAP, start, msize)
    return True


@numba.njit(cache=True)
def _new_expandable_segment(b: I64, s: I64, cfg: I64, ids: I64, tu: I64, es: I64, pk: int) -> int:
    e = s[S_N_ES]
    if e >= len(es):
        s[S_OVERFLOW] = 1
        return 0
    page = K_SMALL_BUFFER if pk & 1 else K_LARGE_BUFFER
    va = -(-cfg[C_ES_VA] // page) * page
    base = -(-s[S_NEXT_ADDR] // K_LARGE_BUFFER) * K_LARGE_BUFFER
    s[S_NEXT_ADDR] = base + va
    s[S_N_ES] = e + 1
    es[e, E_BASE] = base
    es[e, E_VA] = va
    es[e, E_PAGE] = page
    es[e, E_PK] = pk
    n = _new_block(b, s, ids)
    if n == 0:
        return 0
    b[n, ADDR] = base
    b[n, SIZE] = va
    b[n, MAPPED] = 0
    b[n, PK] = pk
    b[n, ES] = e
    _unmapped_insert(b, tu, n)
    return n


@numba.njit(cache=True)
def _find_expandable_block(
    b: I64, s: I64, cfg: I64, ids: I64, tu: I64, es: I64, pk: int, size: int
) -> int:
    it = t_lower_bound(tu, pk, 0)
    while it != 0 and tu[it, K1] == pk:
        c = it
        p = b[c, PREV]
        if p != 0 and b[p, ALLOCATED] == 0:
            c = p
        nbytes = 0
        x = c
        while nbytes < size and x != 0 and b[x, ALLOCATED] == 0:
            nbytes += b[x, SIZE]
            x = b[x, NEXT]
        if nbytes >= size:
            return c
        it = t_next(tu, it)
    return _new_expandable_segment(b, s, cfg, ids, tu, es, pk)


@numba.njit(cache=True)
def _try_allocate_expandable_block(
    b: I64, s: I64, cfg: I64, ids: I64, tf: I64, ts: I64, tu: I64, es: I64, gcc: I64,
    log: I64, pk: int, size: int,
) -> int:  # fmt: skip
    c = _find_expandable_block(b, s, cfg, ids, tu, es, pk, size)
    if c == 0:
        return 0
    if b[c, MAPPED] == 0 and not _map_block(
        b, s, cfg, ids, tf, ts, tu, es, gcc, log, c, min(b[c, SIZE], size)
    ):
        return 0
    while b[c, SIZE] < size:
        remaining = size - b[c, SIZE]
        nc = b[c, NEXT]
        if nc == 0 or not _map_block(
            b, s, cfg, ids, tf, ts, tu, es, gcc, log, nc, min(remaining, b[nc, SIZE])
        ):
            return 0
        c = nc
    _free_remove(b, s, tf, ts, c)
    return c


@numba.njit(cache=True)
def _alloc_block(
    b: I64, s: I64, cfg: I64, ids: I64, tf: I64, ts: I64, tu: I64, es: I64, gcc: I64,
    log: I64, pk: int, size: int, alloc_size: int,
) -> int:  # fmt: skip
    mode = s[S_FAIL_MODE]
    if mode == FAIL_ALL or (mode == FAIL_FIRST and s[S_FAILS] == 0):
        s[S_FAILS] += 1
        return 0
    if cfg[C_GC_LIMIT] >= 0 and s[S_RES] + alloc_size > cfg[C_CAP]:
        return 0  # set_fraction: the allowed maximum is the capacity
    if cfg[C_EXP] != 0:
        return _try_allocate_expandable_block(b, s, cfg, ids, tf, ts, tu, es, gcc, log, pk, size)
    if s[S_RES] + alloc_size > cfg[C_CAP]:
        return 0
    n = _new_block(b, s, ids)
    if n == 0:
        return 0
    b[n, ADDR] = s[S_NEXT_ADDR]
    s[S_NEXT_ADDR] += -(-alloc_size // K_ROUND_LARGE) * K_ROUND_LARGE
    b[n, SIZE] = alloc_size
    b[n, PK] = pk
    s[S_RES] += alloc_size
    _log(log, s, LOG_ALLOC, b[n, ADDR], alloc_size)
    return n


@numba.njit(cache=True)
def _malloc(
    b: I64, s: I64, cfg: I64, ids: I64, tf: I64, ts: I64, tu: I64, es: I64, gcc: I64,
    log: I64, req_block: I64, r: int, orig: int, stream: int, fail: int,
) -> bool:  # fmt: skip
    size = _round_size(orig, cfg[C_DIV : C_DIV + DIVISION_INTERVALS])
    small = 1 if size <= K_SMALL_SIZE else 0
    pk = 2 * stream + small
    alloc_size = _allocation_size(size)
    s[S_FAIL_MODE] = fail
    s[S_FAILS] = 0
    n = _get_free_block(b, s, cfg, tf, ts, gcc, pk, size)
    if fail == FAIL_RELEASE:
        if n != 0:  # a cached block fits, so the recorded release was an empty_cache() first
            _free_insert(b, s, tf, ts, es, gcc, n)
            _release_cached_blocks(b, s, ids, tf, ts, tu, es, gcc, log)
            s[S_FAIL_MODE] = 0
            n = _get_free_block(b, s, cfg, tf, ts, gcc, pk, size)
        else:
            s[S_FAIL_MODE] = FAIL_FIRST
    if n == 0:
        if cfg[C_GC_LIMIT] >= 0:
            _garbage_collect(b, s, cfg, ids, tf, ts, gcc, log)
        n = _alloc_block(b, s, cfg, ids, tf, ts, tu, es, gcc, log, pk, size, alloc_size)
        if n == 0 and _release_available_cached_blocks(b, s, cfg, ids, tf, ts, log, pk, size):
            n = _alloc_block(b, s, cfg, ids, tf, ts, tu, es, gcc, log, pk, size, alloc_size)
        if n == 0:
            _release_cached_blocks(b, s, ids, tf, ts, tu, es, gcc, log)
            n = _alloc_block(b, s, cfg, ids, tf, ts, tu, es, gcc, log, pk, size, alloc_size)
    s[S_FAIL_MODE] = 0
    if n == 0:
        return False
    remaining = b[n, SIZE] - size
    if small == 1 or cfg[C_EXP] != 0:
        split = remaining >= K_MIN_BLOCK
    else:
        split = size < cfg[C_MSS] and remaining > K_SMALL_SIZE
    if split:
        m = _new_block(b, s, ids)
        if m == 0:
            return False
        b[m, ADDR] = b[n, ADDR]
        b[m, SIZE] = size
        b[m, PK] = b[n, PK]
        b[m, ES] = b[n, ES]
        _splice_before(b, m, n)
        b[n, ADDR] += size
        b[n, SIZE] -= size
        _free_insert(b, s, tf, ts, es, gcc, n)
        n = m
    b[n, ALLOCATED] = 1
    b[n, REQ] = orig
    s[S_ALLOC] += b[n, SIZE]
    s[S_LIVE] += orig
    req_block[r] = n
    return True


@numba.njit(cache=True)
def _free(
    b: I64, s: I64, ids: I64, tf: I64, ts: I64, tu: I64, es: I64, gcc: I64, req_block: I64, r: int
) -> None:
    n = req_block[r]
    if n == 0:
        return
    req_block[r] = 0
    b[n, ALLOCATED] = 0
    s[S_ALLOC] -= b[n, SIZE]
    s[S_LIVE] -= b[n, REQ]
    _try_merge(b, s, ids, tf, ts, tu, n, b[n, PREV])
    _try_merge(b, s, ids, tf, ts, tu, n, b[n, NEXT])
    _free_insert(b, s, tf, ts, es, gcc, n)


@numba.njit(cache=True)
def _largest(ts: I64) -> int:
    last = t_last(ts)
    return ts[last, VAL] if last != 0 else 0


@numba.njit(cache=True)
def _torch_kernel(
    kind: I64, request: I64, size: I64, stream: I64, fail: I64,
    b: I64, s: I64, cfg: I64, ids: I64, tf: I64, ts: I64, tu: I64, es: I64, gcc: I64,
    log: I64, req_block: I64,
    out_f: I64, out_l: I64, out_n: I64, out_r: I64, out_a: I64, out_u: I64,
    oom_event: I64, oom_largest: I64,
) -> int:  # fmt: skip
    """Returns the OOM count, or -1 when the block table overflowed (retry bigger)."""
    ooms = 0
    for i in range(len(kind)):
        s[S_EVENT] = i
        r = request[i]
        k = kind[i]
        if k == ALLOC:
            if not _malloc(b, s, cfg, ids, tf, ts, tu, es, gcc, log, req_block, r,
                           size[r], stream[r], fail[r]):  # fmt: skip
                oom_event[ooms] = i
                oom_largest[ooms] = _largest(ts)
                ooms += 1
        elif k == FREE:
            _free(b, s, ids, tf, ts, tu, es, gcc, req_block, r)
        elif k == EMPTY_CACHE:
            _release_cached_blocks(b, s, ids, tf, ts, tu, es, gcc, log)
        if s[S_OVERFLOW] != 0:
            return -1
        out_f[i] = s[S_F]
        out_l[i] = _largest(ts)
        out_n[i] = s[S_N]
        out_r[i] = s[S_RES]
        out_a[i] = s[S_ALLOC]
        out_u[i] = s[S_LIVE]
    return ooms


# --------------------------------------------------------------------- the initial layout


@dataclass(frozen=True)
class InitialLayout:
    """Segments and blocks the allocator holds before the stream starts (validation replays).

    ``blocks`` rows: (segment index, address, size, allocated, request id or -1); within a
    segment they tile it in address order. ``segments`` rows: (address, size, pool key,
    expandable segment index or -1). ``expandable`` rows: (base, virtual size, page, pool key).
    Unmapped ranges of an expandable segment are blocks with allocated = -1.
    """

    segments: I64
    blocks: I64
    expandable: I64

    @classmethod
    def empty(cls) -> InitialLayout:
        z = np.zeros((0, 5), dtype=np.int64)
        return cls(np.zeros((0, 4), dtype=np.int64), z, np.zeros((0, 4), dtype=np.int64))


@numba.njit(cache=True)
def _setup(
    segments: I64, blocks: I64, expandable: I64, request_size: I64,
    b: I64, s: I64, ids: I64, tf: I64, ts: I64, tu: I64, es: I64, gcc: I64, req_block: I64,
) -> None:  # fmt: skip
    for e in range(len(expandable)):
        for f in range(4):
            es[e, f] = expandable[e, f]
    s[S_N_ES] = len(expandable)
    prev = 0
    prev_seg = -1
    for k in range(len(blocks)):
        seg = blocks[k, 0]
        n = _new_block(b, s, ids)
        b[n, ADDR] = blocks[k, 1]
        b[n, SIZE] = blocks[k, 2]
        b[n, PK] = segments[seg, 2]
        b[n, ES] = segments[seg, 3]
        if seg == prev_seg:
            b[n, PREV] = prev
            b[prev, NEXT] = n
        prev = n
        prev_seg = seg
    n_blocks = s[S_NEXT_ID]
    for n in range(1, n_blocks + 1):
        k = n - 1
        state = blocks[k, 3]
        if state == 1:
            b[n, ALLOCATED] = 1
            r = blocks[k, 4]
            if r >= 0:
                req_block[r] = n
                b[n, REQ] = request_size[r]
                s[S_LIVE] += request_size[r]
            s[S_ALLOC] += b[n, SIZE]
        elif state == -1:
            b[n, MAPPED] = 0
            _unmapped_insert(b, tu, n)
        else:
            _free_insert(b, s, tf, ts, es, gcc, n)
    for k in range(len(segments)):
        s[S_RES] += segments[k, 1]


# ------------------------------------------------------------------------------ the policy


def simulate_torch(
    stream: RequestStream,
    capacity_bytes: int,
    config: TorchConfig,
    initial: InitialLayout | None = None,
    es_va_bytes: int | None = None,
) -> SimResult:
    """Replay ``stream`` through the caching allocator with ``config`` on ``capacity_bytes``."""
    initial = initial or InitialLayout.empty()
    n = stream.n_events
    n_pools = 2 * (max(int(stream.stream.max()) if stream.n_requests else 0,
                       int(initial.segments[:, 2].max() // 2) if len(initial.segments) else 0) + 1)  # fmt: skip
    max_blocks = 2 * stream.n_requests + 2 * len(initial.blocks) + 4 * n_pools + 1024
    max_es = 4 * n_pools + len(initial.expandable) + 16
    cfg = config.vector(capacity_bytes, es_va_bytes)
    max_log = 4 * n + 4 * len(initial.blocks) + 64
    kind = stream.kind.astype(np.int64)
    fail = stream.fail.astype(np.int64)
    while True:
        b = np.zeros((max_blocks, B_FIELDS), dtype=np.int64)
        s = np.zeros(S_FIELDS, dtype=np.int64)
        s[S_NEXT_ADDR] = ADDRESS_BASE
        ids = np.zeros(max_blocks, dtype=np.int64)
        tf, ts, tu = new_treap(max_blocks, 11), new_treap(max_blocks, 12), new_treap(max_blocks, 13)
        es = np.zeros((max_es, 4), dtype=np.int64)
        gcc = np.zeros(n_pools, dtype=np.int64)
        log = np.zeros((max_log, 4), dtype=np.int64)
        req_block = np.zeros(stream.n_requests, dtype=np.int64)
        outs = empty_outputs(n)
        oom_event = np.zeros(stream.n_requests + 1, dtype=np.int64)
        oom_largest = np.zeros_like(oom_event)
        _setup(initial.segments, initial.blocks, initial.expandable, stream.size,
               b, s, ids, tf, ts, tu, es, gcc, req_block)  # fmt: skip
        ooms = _torch_kernel(
            kind, stream.request, stream.size, stream.stream, fail,
            b, s, cfg, ids, tf, ts, tu, es, gcc, log, req_block,
            *outs, oom_event, oom_largest,
        )  # fmt: skip
        if ooms >= 0:
            break
        max_blocks *= 4
        max_es *= 4
        max_log *= 4
    m = int(s[S_LOG_N])
    segment_log = {
        "kind": log[:m, L_KIND].copy(),
        "address": log[:m, L_ADDR].copy(),
        "size": log[:m, L_SIZE].copy(),
        "event": log[:m, L_EVENT].copy(),
    }
    return SimResult.of(outs, oom_event[:ooms], oom_largest[:ooms], segment_log)


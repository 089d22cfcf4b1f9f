"""``torch``: PyTorch's native CUDA caching allocator (``CUDACachingAllocator.cpp``), ported rule
for rule from PyTorch's CUDACachingAllocator.cpp (@001074d, the 2.4/2.5 era):

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
the fraction to be set with C as the allowed maximum, or the option would do nothing (a
validation replay reads a snapshot both ways). A stream's lifetimes are ``alloc`` →
``free_completed``; a free that waits on another stream (``record_stream``) completes at the
next malloc, in its ``release_cached_blocks`` when it takes the OOM path, where a replay marks
it so. CUDA graph pools and the free-memory callbacks are not modelled.

Free memory for the metrics is what the allocator caches: ``F`` = reserved − allocated
(the free blocks inside segments or mapped pages), ``L`` the largest cached free block, ``N``
their number.

Modules: ``rules`` (the allocator's size rules and constants, shared with the
``pytorch-segments`` model), ``config`` (the options), ``state`` (the block table and cached
sets), ``segments`` (new segments and releases) and ``kernel`` (malloc, free, the replay).
"""

from __future__ import annotations

from nsysfrag.allocators.base import RequestStream, SimResult
from nsysfrag.allocators.family import PolicyFamily, PolicyOptions
from nsysfrag.allocators.torch.config import TorchConfig, split_options
from nsysfrag.allocators.torch.kernel import InitialLayout, simulate_torch
from nsysfrag.models.segments.rules import round_size


def _simulate(stream: RequestStream, capacity_bytes: int, options: TorchConfig | None) -> SimResult:
    return simulate_torch(stream, capacity_bytes, options or TorchConfig())


def _alloc_conf(options: PolicyOptions | None) -> str:
    return (options or TorchConfig()).conf_string()


FAMILY = PolicyFamily(
    "torch",
    ("pytorch", "native"),
    "PyTorch caching allocator",
    _simulate,
    alloc_conf=_alloc_conf,
    parse_options=TorchConfig.parse,
)

__all__ = ["FAMILY", "InitialLayout", "TorchConfig", "round_size", "simulate_torch", "split_options"]

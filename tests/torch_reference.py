"""PyTorch's CUDA caching allocator as plain Python, for property tests of the compiled
``torch`` model only.

Transcribed function by function from ``DeviceCachingAllocator`` in PyTorch's
``c10/cuda/CUDACachingAllocator.cpp`` (the 2.5–2.11 logic): ``malloc`` → ``get_free_block`` →
``garbage_collect_cached_blocks`` → ``alloc_block`` → ``release_available_cached_blocks`` →
``alloc_block`` → ``release_cached_blocks`` (``release_blocks``, ``unmap_block``,
``release_expandable_segment``) → ``alloc_block`` (the retry) → OOM; ``alloc_found_block``,
``free_block``/``try_merge_blocks``, and the expandable segments' ``find_expandable_block``,
``map_block`` and ``try_allocate_expandable_block``. It keeps PyTorch's own structures: one
small and one large ``BlockPool`` shared by every stream, free blocks ordered by
``(stream, size, address)``, unmapped ranges by ``(stream, address)``, the garbage collector's
clock per ``BlockPool``. Every search sorts the pool again (O(n) per call): slow and easy to
check line by line against the C++.

What PyTorch leaves to the device, the reference takes as the model does: cudaMalloc and a page
map fail when reserved + the new bytes exceed ``capacity``; ``garbage_collection_threshold``
runs with a memory fraction set whose allowed maximum is ``capacity``; new segments take the
next addresses up (cudaMalloc's: rounded to 2 MiB; an expandable segment's reservation:
aligned to 20 MiB), so that ties of equal-size blocks (lowest address first) fall the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1 << 20
K_MIN_BLOCK = 512
K_SMALL_SIZE = MiB
K_SMALL_BUFFER = 2 * MiB
K_LARGE_BUFFER = 20 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB
UNLIMITED = 1 << 62
FIRST_ADDRESS = 1 << 48

SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP = 1, 2, 3, 4


def _up(n: int, step: int) -> int:
    return -(-n // step) * step


def round_size(size: int, divisions: list[int]) -> int:
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    interval = min(max(size.bit_length() - 1 - 20, 0), len(divisions) - 1)
    d = divisions[interval]
    if d > 1 and size > K_MIN_BLOCK * d:  # roundup_power2_next_division
        if size & (size - 1) == 0:
            return size
        floor2 = 1 << (size.bit_length() - 1)
        step = floor2 >> (d.bit_length() - 1)
        if step == 0:
            return floor2 << 1
        low = size & ~(step - 1)
        return size if low == size else low + step
    return _up(size, K_MIN_BLOCK)


def get_allocation_size(size: int) -> int:
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return _up(size, K_ROUND_LARGE)


@dataclass(eq=False)
class ExpandableSegment:
    base: int
    page: int  # segment_size_: 2 MiB (small pool) or 20 MiB (large pool)
    n_pages: int  # max_handles_
    mapped: set[int] = field(default_factory=set)  # page indices with a physical handle

    @property
    def size(self) -> int:
        return self.page * self.n_pages


@dataclass(eq=False)
class Block:
    stream: int
    size: int
    ptr: int
    pool: BlockPool
    segment: ExpandableSegment | None = None  # expandable_segment_
    allocated: bool = False
    mapped: bool = True
    prev: Block | None = None
    next: Block | None = None
    requested: int = 0
    gc_count_base: int = 0
    event_count: int = 0  # outstanding CUDA events of other streams (record_stream)

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def gc_count(self) -> int:
        return self.pool.get_free_blocks_call_count - self.gc_count_base


@dataclass(eq=False)
class BlockPool:
    is_small: bool
    blocks: list[Block] = field(default_factory=list)  # a set in PyTorch; sorted on use
    unmapped: list[Block] = field(default_factory=list)
    get_free_blocks_call_count: int = 0

    def ordered(self) -> list[Block]:
        """BlockComparatorSize: stream, then size, then address."""
        return sorted(self.blocks, key=lambda b: (b.stream, b.size, b.ptr))

    def ordered_unmapped(self) -> list[Block]:
        """BlockComparatorAddress: stream, then address."""
        return sorted(self.unmapped, key=lambda b: (b.stream, b.ptr))

    def insert_into_blocks(self, b: Block) -> None:
        b.gc_count_base = self.get_free_blocks_call_count
        self.blocks.append(b)


def _lower_bound(order: list[Block], stream: int, size: int) -> int:
    i = 0
    while i < len(order) and (order[i].stream, order[i].size) < (stream, size):
        i += 1
    return i


@dataclass
class Options:
    max_split_size: int = UNLIMITED
    max_non_split_rounding: int = K_LARGE_BUFFER
    divisions: list[int] = field(default_factory=lambda: [0] * 16)
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0


class CachingAllocator:
    """One device's DeviceCachingAllocator on a device of ``capacity`` bytes."""

    def __init__(self, capacity: int, options: Options, expandable_va: int) -> None:
        self.capacity = capacity
        self.o = options
        self.expandable_va = expandable_va
        self.set_fraction = options.garbage_collection_threshold > 0
        self.allowed_memory_maximum = capacity
        self.small_blocks = BlockPool(True)
        self.large_blocks = BlockPool(False)
        self.total_allocated_memory = 0  # reserved bytes
        self.next_address = FIRST_ADDRESS
        self.log: list[tuple[int, int]] = []  # (SEGMENT_*, bytes), in call order
        self.cuda_events: list[Block] = []  # blocks whose free waits on another stream

    # ------------------------------------------------------------------ malloc and free

    def malloc(self, orig_size: int, stream: int) -> Block | None:
        size = round_size(orig_size, self.o.divisions)
        pool = self.small_blocks if size <= K_SMALL_SIZE else self.large_blocks
        alloc_size = get_allocation_size(size)
        block = self.get_free_block(pool, stream, size)
        if block is None:
            if self.set_fraction and self.o.garbage_collection_threshold > 0:
                self.garbage_collect_cached_blocks()
            block = self.alloc_block(pool, stream, size, alloc_size)
            if block is None and self.release_available_cached_blocks(pool, stream, size):
                block = self.alloc_block(pool, stream, size, alloc_size)
            if block is None and self.release_cached_blocks():
                block = self.alloc_block(pool, stream, size, alloc_size)
        if block is None:
            return None  # the OOM
        return self.alloc_found_block(block, pool, stream, size, orig_size)

    def should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.is_small or self.o.expandable_segments:
            return remaining >= K_MIN_BLOCK
        return size < self.o.max_split_size and remaining > K_SMALL_SIZE

    def alloc_found_block(self, block: Block, pool: BlockPool, stream: int, size: int,
                          orig_size: int) -> Block:  # fmt: skip
        if self.should_split(block, size):
            remaining = block
            block = Block(stream, size, remaining.ptr, pool, remaining.segment)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.ptr += size
            remaining.size -= size
            pool.insert_into_blocks(remaining)
        block.allocated = True
        block.requested = orig_size
        return block

    def free(self, block: Block, other_stream_uses: bool = False) -> None:
        block.allocated = False
        if other_stream_uses:  # insert_events: one event for the other stream
            block.event_count = 1
            self.cuda_events.append(block)
        else:
            self.free_block(block)

    def process_events(self) -> None:
        """The events completed: their blocks' frees complete."""
        self.synchronize_and_free_events()

    def synchronize_and_free_events(self) -> None:
        for block in self.cuda_events:
            block.event_count -= 1
            if block.event_count == 0:
                self.free_block(block)
        self.cuda_events = []

    def free_block(self, block: Block) -> None:
        pool = block.pool
        for candidate in (block.prev, block.next):
            self.try_merge_blocks(block, candidate, pool)
        pool.insert_into_blocks(block)

    def try_merge_blocks(self, dst: Block, src: Block | None, pool: BlockPool) -> int:
        if src is None or src.allocated or src.event_count > 0 or dst.mapped != src.mapped:
            return 0
        if dst.prev is src:  # [src dst]
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:  # [dst src]
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        (pool.blocks if src.mapped else pool.unmapped).remove(src)
        return src.size

    def empty_cache(self) -> None:
        self.release_cached_blocks()

    # ------------------------------------------------------------------ the cached blocks

    def get_free_block(self, pool: BlockPool, stream: int, size: int) -> Block | None:
        if self.set_fraction and self.o.garbage_collection_threshold > 0:
            pool.get_free_blocks_call_count += 1
        order = pool.ordered()
        i = _lower_bound(order, stream, size)
        if i == len(order) or order[i].stream != stream:
            return None
        if order[i].segment is not None:
            if self.o.expandable_segments:

                def expandable_size(b: Block) -> int:
                    nx = b.next
                    return b.size + (nx.size if nx is not None and not nx.mapped else 0)

                j = i + 1
                while (order[i].segment is not None and j < len(order)
                       and order[j].stream == stream
                       and expandable_size(order[j]) < expandable_size(order[i])):  # fmt: skip
                    i = j
                    j += 1
            else:
                i += 1
                while i < len(order) and order[i].segment is not None and order[i].stream == stream:
                    i += 1
                if i == len(order) or order[i].stream != stream:
                    return None
        b = order[i]
        mss = self.o.max_split_size
        if size < mss and b.size >= mss:
            return None
        if size >= mss and b.size >= size + self.o.max_non_split_rounding:
            return None
        pool.blocks.remove(b)
        return b

    def garbage_collect_cached_blocks(self) -> None:
        gc_threshold = int(self.o.garbage_collection_threshold * self.allowed_memory_maximum)
        if self.total_allocated_memory <= gc_threshold:
            return
        target_size = self.total_allocated_memory - gc_threshold
        gc_reclaimed = 0
        total_age = 0
        freeable_block_count = 0
        for b in self.large_blocks.ordered():
            if not b.is_split():
                total_age += b.gc_count()
                freeable_block_count += 1
        if freeable_block_count == 0:
            return
        block_freed = True
        while gc_reclaimed < target_size and block_freed and freeable_block_count > 0:
            age_threshold = total_age / freeable_block_count
            block_freed = False
            for block in self.large_blocks.ordered():
                if (not block.is_split() and block.segment is None
                        and block.gc_count() >= age_threshold):  # fmt: skip
                    block_freed = True
                    gc_reclaimed += block.size
                    total_age -= block.gc_count()
                    freeable_block_count -= 1
                    self.release_block(block)

    # ------------------------------------------------------------------ new memory

    def alloc_block(self, pool: BlockPool, stream: int, size: int, alloc_size: int
                    ) -> Block | None:  # fmt: skip
        if self.set_fraction and self.total_allocated_memory + alloc_size > self.allowed_memory_maximum:
            return None
        if self.o.expandable_segments:
            return self.try_allocate_expandable_block(pool, stream, size)
        if self.total_allocated_memory + alloc_size > self.capacity:  # cudaMalloc fails
            return None
        ptr = self.next_address
        self.next_address += _up(alloc_size, K_ROUND_LARGE)
        self.total_allocated_memory += alloc_size
        self.log.append((SEGMENT_ALLOC, alloc_size))
        return Block(stream, alloc_size, ptr, pool)

    def find_expandable_block(self, pool: BlockPool, stream: int, size: int) -> Block:
        def allocatable(b: Block | None) -> bool:
            return b is not None and not b.allocated and b.event_count == 0

        def has_available_address_space(b: Block | None) -> bool:
            nbytes = 0
            while nbytes < size and allocatable(b):
                assert b is not None
                nbytes += b.size
                b = b.next
            return nbytes >= size

        for c in pool.ordered_unmapped():
            if c.stream != stream:
                continue
            if allocatable(c.prev):
                assert c.prev is not None
                c = c.prev
            if has_available_address_space(c):
                return c
        page = K_SMALL_BUFFER if pool.is_small else K_LARGE_BUFFER
        es = ExpandableSegment(_up(self.next_address, K_LARGE_BUFFER), page,
                               -(-self.expandable_va // page))  # fmt: skip
        self.next_address = es.base + es.size
        candidate = Block(stream, es.size, es.base, pool, es, mapped=False)
        pool.unmapped.append(candidate)
        return candidate

    def _map(self, es: ExpandableSegment, ptr: int, size: int) -> int:
        """ExpandableSegment::map: the bytes of whole pages mapped from ptr, 0 when refused."""
        begin = (ptr - es.base) // es.page
        end = -(-(ptr + size - es.base) // es.page)
        nbytes = (end - begin) * es.page
        if self.total_allocated_memory + nbytes > self.capacity:  # cuMemCreate fails
            return 0
        es.mapped.update(range(begin, end))
        return nbytes

    def map_block(self, to_map: Block, size: int) -> bool:
        assert not to_map.mapped and size <= to_map.size and to_map.segment is not None
        mapped = self._map(to_map.segment, to_map.ptr, size)
        if mapped == 0:
            return False
        pool = to_map.pool
        pool.unmapped.remove(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            remaining = Block(to_map.stream, to_map.size - mapped, to_map.ptr + mapped, pool,
                              to_map.segment, mapped=False)  # fmt: skip
            remaining.prev, remaining.next = to_map, to_map.next
            if to_map.next is not None:
                to_map.next.prev = remaining
            to_map.next = remaining
            pool.unmapped.append(remaining)
            to_map.size = mapped
        self.try_merge_blocks(to_map, to_map.prev, pool)
        self.try_merge_blocks(to_map, to_map.next, pool)
        pool.insert_into_blocks(to_map)
        self.total_allocated_memory += mapped
        self.log.append((SEGMENT_MAP, mapped))
        return True

    def try_allocate_expandable_block(self, pool: BlockPool, stream: int, size: int
                                      ) -> Block | None:  # fmt: skip
        candidate = self.find_expandable_block(pool, stream, size)
        if not candidate.mapped and not self.map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            remaining = size - candidate.size
            new_candidate = candidate.next
            assert new_candidate is not None
            if not self.map_block(new_candidate, min(remaining, new_candidate.size)):
                return None
            candidate = new_candidate
        pool.blocks.remove(candidate)
        return candidate

    # ------------------------------------------------------------------ giving memory back

    def release_available_cached_blocks(self, pool: BlockPool, stream: int, size: int) -> bool:
        mss = self.o.max_split_size
        if mss >= UNLIMITED:
            return False
        key_size = max(size, mss)
        order = pool.ordered()
        i = _lower_bound(order, stream, key_size)
        if i == len(order) or order[i].stream != stream or order[i].segment is not None:
            # No single block is large enough: free oversize blocks from the largest down.
            if i == 0:
                return False
            released = 0
            i -= 1
            while released < key_size and order[i].size >= mss and order[i].stream == stream:
                cur = order[i]
                if cur.segment is None:
                    released += cur.size
                    self.release_block(cur)
                if i == 0:
                    break
                i -= 1
            return released >= key_size
        self.release_block(order[i])
        return True

    def release_cached_blocks(self) -> bool:
        self.synchronize_and_free_events()
        self.release_blocks(self.large_blocks)
        self.release_blocks(self.small_blocks)
        return True

    def release_blocks(self, pool: BlockPool) -> None:
        to_unmap = []
        for block in pool.ordered():
            if block.segment is not None:
                to_unmap.append(block)
            elif block.prev is None and block.next is None:
                self.release_block(block)
        for block in to_unmap:
            self.unmap_block(block)
            if block.prev is None and block.next is None:
                block.pool.unmapped.remove(block)  # release_expandable_segment

    def release_block(self, block: Block) -> None:
        assert block.segment is None
        self.log.append((SEGMENT_FREE, block.size))
        self.total_allocated_memory -= block.size
        block.pool.blocks.remove(block)

    def unmap_block(self, block: Block) -> None:
        es = block.segment
        assert es is not None
        begin = -(-(block.ptr - es.base) // es.page)  # ExpandableSegment::unmap: whole pages
        end = (block.ptr + block.size - es.base) // es.page
        if begin >= end:
            return
        es.mapped.difference_update(range(begin, end))
        unmapped_ptr, unmapped_size = es.base + begin * es.page, (end - begin) * es.page
        pool = block.pool
        pool.blocks.remove(block)
        before_size = unmapped_ptr - block.ptr
        if before_size > 0:
            before = Block(block.stream, before_size, block.ptr, pool, es)
            before.prev, before.next = block.prev, block
            if block.prev is not None:
                block.prev.next = before
            block.prev = before
            pool.insert_into_blocks(before)
        after_size = block.size - (before_size + unmapped_size)
        if after_size > 0:
            after = Block(block.stream, after_size, unmapped_ptr + unmapped_size, pool, es)
            after.prev, after.next = block, block.next
            if block.next is not None:
                block.next.prev = after
            block.next = after
            pool.insert_into_blocks(after)
        block.ptr, block.size, block.mapped = unmapped_ptr, unmapped_size, False
        self.try_merge_blocks(block, block.prev, pool)
        self.try_merge_blocks(block, block.next, pool)
        pool.unmapped.append(block)
        self.total_allocated_memory -= unmapped_size
        self.log.append((SEGMENT_UNMAP, unmapped_size))

    # ------------------------------------------------------------------ figures

    def cached(self) -> list[Block]:
        return self.small_blocks.blocks + self.large_blocks.blocks


@dataclass
class ReferenceRun:
    """After every event: reserved, allocated, free bytes, largest free block, free blocks,
    and that event's segment calls; the events whose allocation failed."""

    reserved: list[int] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)
    free: list[int] = field(default_factory=list)
    largest: list[int] = field(default_factory=list)
    free_blocks: list[int] = field(default_factory=list)
    calls: list[list[tuple[int, int]]] = field(default_factory=list)
    ooms: list[int] = field(default_factory=list)


def reference_replay(
    ops: list[tuple[str, int, int, int]], capacity: int, options: Options, expandable_va: int
) -> ReferenceRun:
    """``ops``: ("a", request, bytes, stream), ("f", request, 0, 0), ("e", 0, 0, 0), or
    ("p", request, 0, 0): a free while another stream still uses the block, whose event
    completes by the end of the next malloc (where the model's replays put it)."""
    alloc = CachingAllocator(capacity, options, expandable_va)
    held: dict[int, Block] = {}
    allocated = 0
    out = ReferenceRun()
    for i, (op, request, nbytes, stream) in enumerate(ops):
        start = len(alloc.log)
        if op == "a":
            block = alloc.malloc(nbytes, stream)
            alloc.process_events()
            if block is None:
                out.ooms.append(i)
            else:
                held[request] = block
                allocated += block.size
        elif op in "fp":
            block = held.pop(request, None)  # the free of a failed allocation does nothing
            if block is not None:
                allocated -= block.size
                alloc.free(block, other_stream_uses=op == "p")
        else:
            alloc.empty_cache()
        cached = alloc.cached()
        out.reserved.append(alloc.total_allocated_memory)
        out.allocated.append(allocated)
        out.free.append(sum(b.size for b in cached))
        out.largest.append(max((b.size for b in cached), default=0))
        out.free_blocks.append(len(cached))
        out.calls.append(sorted(alloc.log[start:]))
    return out

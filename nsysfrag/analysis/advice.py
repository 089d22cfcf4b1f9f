"""What to change: advice lines drawn from a space's figures."""

from __future__ import annotations

from nsysfrag.analysis import SpaceAnalysis
from nsysfrag.analysis.metrics import Health, format_bytes
from nsysfrag.analysis.results import CAPACITY, FRAGMENTATION, Failure
from nsysfrag.analysis.time_base import moment
from nsysfrag.models.tried_settings import Setting

SITES_NAMED = 3


# What to do about a failure of each verdict (the advice and the reports' failure sections).
CAPACITY_REMEDY = (
    "the program needs less memory there (smaller batches, activation checkpointing) or a larger"
    " device"
)


WHATIF_TRIES = "`nsysfrag whatif` on this snapshot evaluates"
# analyze runs no allocator model (whatif's remedies for a program on the driver's pages: a
# stream-ordered pool, per-size free lists, one arena up front), so it names the command that
# replays each and quotes its figures.
WHATIF_REPLAYS = "`nsysfrag whatif` on this trace replays each remedy"
# The settings advice may name against fragmentation, in the order it names them.
_AGAINST_HOLES = ("expandable_segments", "max_split_size_mb")


def named_settings(s: SpaceAnalysis) -> list[Setting]:
    """The PYTORCH_CUDA_ALLOC_CONF settings advice names for this space: only settings
    ``whatif`` tries by default on this input (never one its run uses or that conflicts with
    its settings), and only against a caching allocator's holes or failures."""
    if s.snapshot is None:
        return []
    if out_of_capacity(s):
        return []  # no setting makes a request fit that the device could not hold
    tried = [x for x in s.snapshot.tried_settings if x.key in _AGAINST_HOLES]
    holes = bool(s.hotspots) and s.hotspots[0].hole_creating_frees > 0
    fragmented = any(f.verdict == FRAGMENTATION for f in s.ooms)
    return tried if holes or fragmented else []


def out_of_capacity(s: SpaceAnalysis) -> bool:
    """The space's out-of-memory errors were out of capacity, none by fragmentation: what
    would have avoided them is less memory, not a different layout."""
    verdicts = {f.verdict for f in s.ooms}
    return CAPACITY in verdicts and FRAGMENTATION not in verdicts


def capacity_advice(s: SpaceAnalysis) -> list[str]:
    """For a space whose failures were out of capacity: what to shrink, at the site that
    needed the memory, and the sites that held the most at peak memory."""
    f = next(f for f in s.ooms if f.verdict == CAPACITY)
    asked = format_bytes(f.requested_bytes) if f.requested_bytes is not None else "a request"
    where = f" at '{f.site}'" if f.site else ""
    held = s.memory_peak_sites.live[:SITES_NAMED] if s.memory_peak_sites is not None else ()
    most = (
        "; the most live at peak memory came from "
        + ", ".join(f"'{x.site}' ({format_bytes(x.bytes)})" for x in held)
        if held
        else ""
    )
    return [
        f"The out-of-memory error ({asked}{where}, at {moment(s, f.state.time_ns)}) was out of"
        " capacity: it would not have fit with no fragmentation at all, so neither reordering"
        " frees nor an allocator setting would have avoided it. Shrink what is live when it is"
        f" requested{most}: {CAPACITY_REMEDY}."
    ]


def settings_phrase(settings: list[Setting]) -> str:
    """``expandable_segments:True, or max_split_size_mb:32 or 64 to keep large blocks whole, in
    PYTORCH_CUDA_ALLOC_CONF (`nsysfrag whatif` on this snapshot evaluates each)``."""
    parts = [str(x) for x in settings if x.key != "max_split_size_mb"]
    sizes = [x.value for x in settings if x.key == "max_split_size_mb"]
    if sizes:
        parts.append(f"max_split_size_mb:{' or '.join(sizes)} to keep large blocks whole")
    listed = ", or ".join(parts)
    each = "it" if len(settings) == 1 else "each"
    return f"{listed}, in PYTORCH_CUDA_ALLOC_CONF ({WHATIF_TRIES} {each})"


def fragmentation_remedy(s: SpaceAnalysis) -> str:
    """What to do about a failure by fragmentation in this space."""
    settings = [x for x in named_settings(s) if x.key == "expandable_segments"]
    if not settings:
        on = " (expandable segments are on already)" if _expandable(s) else ""
        return f"free those blocks before the large allocation{on}"
    return f"try {settings_phrase(settings)}, or free those blocks before the large allocation"


def advise(s: SpaceAnalysis, failures: bool = True) -> list[str]:
    """Plain-language advice for one space, most important first; ``failures=False`` leaves
    out the failed allocations (for a report that shows each of them on its own)."""
    lines: list[str] = []
    if s.caching_allocator_suspected:
        lines.append(
            "Every allocation is a multiple of 2 MiB: this looks like a caching allocator's"
            " segments. They fill their pages, so the driver strands nothing here; the"
            " fragmentation that matters is inside those segments, which nsys cannot see. For"
            " PyTorch, take a memory snapshot (torch.cuda.memory._record_memory_history, then"
            " _dump_snapshot) and run nsysfrag on it, or record with"
            " PYTORCH_NO_CUDA_MEMORY_CACHING=1 for a tensor-level trace."
        )
    lines += stranded_advice(s)
    if s.capacity_assumed and s.health:
        lines.append(
            f"This {s.health.label} rating assumes the device was full at the peak: the snapshot"
            " does not say how large the device is, so its capacity is taken to be the peak"
            f" reserved memory ({format_bytes(s.capacity_bytes)}). Pass --capacity (e.g."
            " --capacity 80GiB) to rate it against the real device."
        )
    if failures:
        lines += failure_advice(s)
    if out_of_capacity(s):
        # Holes did not cause these failures: advice on them would point away from the cause.
        lines += capacity_advice(s)
    elif s.hotspots and not s.source.driver_allocations:  # a caching allocator's blocks
        top = s.hotspots[0]
        if top.hole_creating_frees:
            settings = named_settings(s)
            remedy = (
                f"try {settings_phrase(settings)}"
                if settings
                else "allocate the blocks that outlive them first, so that the short-lived ones"
                " free in order"
                + (" (expandable segments are on already)" if _expandable(s) else "")
            )
            lines.append(
                f"Blocks from '{top.site}' ({top.size_class}) are freed while neighbours in the"
                f" same segment stay live, splitting the caching allocator's segments: {remedy}."
            )
    elif s.hotspots:
        top = s.hotspots[0]
        # Stranded memory too little to matter on the device is no call to change the code.
        matters = s.health is not Health.OK or top.hole_bytes >= HOLE_SHARE * s.capacity_bytes
        if top.hole_creating_frees and top.hole_bytes and matters:
            pins = ", ".join(f"'{p}'" for p in top.pinned_by[:2]) or "long-lived blocks"
            lines.append(
                f"Blocks from '{top.site}' ({top.size_class}) leave {format_bytes(top.hole_bytes)}"
                f" stranded when freed, because blocks from {pins} keep their pages resident:"
                " give such small, short-lived buffers a pool of their own (cudaMallocAsync with"
                " a memory pool, a per-size free list, or one arena allocated up-front) so they"
                f" stop sharing pages with long-lived ones ({WHATIF_REPLAYS})."
            )
    if s.counts.unmatched_frees:
        lines.append(
            f"{s.counts.unmatched_frees} free(s) of blocks allocated before the capture started:"
            " start the capture earlier (or --capture-range) to see the whole layout."
        )
    if s.counts.overlaps:
        lines.append(
            f"{s.counts.overlaps} allocation(s) overlapped live blocks: the trace missed some"
            " frees (dropped events?), so the layout is approximate."
        )
    if s.health is Health.OK and not lines and not s.ooms:
        lines.append("No action needed: fragmentation stayed within the healthy range.")
    return lines


# Stranded memory worth a word: at least this share of what the driver holds, and of the device.
STRANDED_SHARE = 0.05
# A hotspot worth changing code for in a healthy space: its holes stranded this share of the
# device over the run.
HOLE_SHARE = 0.01


def stranded_advice(s: SpaceAnalysis) -> list[str]:
    """What the driver's pages strand at the worst moment, for a space on pages (an nsys
    trace); nothing when it is too little to matter."""
    pool = s.peak.pool
    if s.page_bytes is None or pool is None or pool.reserved_bytes == 0:
        return []
    share = pool.stranded_bytes / pool.reserved_bytes
    if share < STRANDED_SHARE or pool.stranded_bytes < STRANDED_SHARE * s.capacity_bytes:
        return []
    return [
        f"The driver's pages are {share:.0%} stranded at the worst moment"
        f" ({moment(s, s.peak.time_ns)}): {format_bytes(pool.stranded_bytes)} of the"
        f" {format_bytes(pool.reserved_bytes)} the driver holds for this process is free inside"
        " pages that live blocks keep partly used, and only small requests can use it; a"
        f" request larger than {format_bytes(s.peak.largest_free_bytes)} would not have fit then."
    ]


def failure_advice(s: SpaceAnalysis) -> list[str]:
    """Each kind of failure, told with the state at its own moment: how many failed, then the
    first of each verdict in detail."""
    if not s.ooms:
        return []
    lines = []
    n = len(s.ooms)
    by_verdict = {v: [f for f in s.ooms if f.verdict == v] for v in (CAPACITY, FRAGMENTATION)}
    if n > 1:
        kinds = [f"{len(fs)} {v}" for v, fs in by_verdict.items() if fs]
        lines.append(f"{n} allocations failed" + (f" ({', '.join(kinds)})." if kinds else "."))
    firsts = [fs[0] for fs in by_verdict.values() if fs] or [s.ooms[0]]
    for f in sorted(firsts, key=lambda f: f.state.time_ns):
        lines.append(_describe(f, first=n > 1, remedy=fragmentation_remedy(s), at=moment(s, f.state.time_ns)))
    return lines


def _describe(f: Failure, first: bool, remedy: str, at: str) -> str:
    st = f.state
    when = f"{'The first ' if first else 'An '}allocation"
    pool = st.pool
    if pool is None or f.requested_bytes is None:
        free = (
            f"{format_bytes(st.free_bytes)} free in {st.free_blocks} block(s)"
            if pool is None
            else f"{format_bytes(pool.device_free_bytes)} of free pages on the device and"
            f" {format_bytes(pool.stranded_bytes)} stranded in partly used ones"
        )
        return (
            f"{when} that failed did so at {at} with {free}, and {format_bytes(st.live_bytes)}"
            " live. The trace records no size for a failed call, so whether fragmentation or a"
            " full device caused it is unknown; a request larger than"
            f" {format_bytes(st.largest_free_bytes)} could not be served then."
        )
    device_free = (
        f.recorded_device_free_bytes
        if f.recorded_device_free_bytes is not None
        else pool.device_free_bytes
    )
    numbers = (
        f"{format_bytes(f.requested_bytes)} requested with {format_bytes(device_free)} free on"
        f" the device, {format_bytes(pool.reserved_bytes)} reserved,"
        f" {format_bytes(pool.allocated_bytes)} allocated, {format_bytes(pool.stranded_bytes)}"
        f" stranded, {format_bytes(pool.releasable_bytes)} releasable, largest free block"
        f" {format_bytes(pool.largest_block_bytes)}"
    )
    if f.verdict == CAPACITY:
        return (
            f"{when} that ran out of memory at {at} was out of capacity: {numbers}. Even with no"
            f" fragmentation at all it would not have fit: {CAPACITY_REMEDY}."
        )
    sites = ", ".join(f"'{x.site}'" for x in f.stranded_sites[:SITES_NAMED])
    held = f" in segments that also hold blocks from {sites}" if sites else ""
    return (
        f"{when} that ran out of memory at {at} failed by fragmentation: {numbers}. The memory"
        f" existed, but {format_bytes(pool.stranded_bytes)} of it was stranded{held}, where no"
        f" single free range held the request: {remedy}."
    )


def _expandable(s: SpaceAnalysis) -> bool:
    """The snapshot was recorded with expandable segments on."""
    return s.snapshot is not None and s.snapshot.facts.expandable_segments

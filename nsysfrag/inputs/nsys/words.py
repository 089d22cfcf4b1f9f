"""How reports speak of an nsys export: its headings and the definitions of its own terms."""

from __future__ import annotations

from nsysfrag.events import Words
from nsysfrag.models.observed import MODEL_NAME

TERMS: tuple[tuple[str, str], ...] = (
    (
        "Space",
        (
            "One per (process, CUDA device). Only device memory is replayed (memory kinds Device,"
            " Array and Device Static); pinned, pageable and managed events are counted as other-kind"
            " events. The model “observed” places each block where the trace recorded it."
        ),
    ),
    (
        "Capacity C",
        (
            "The device's totalMemory (mapped through TARGET_INFO_CUDA_DEVICE when the process saw"
            " the GPU under another CUDA id), or --capacity."
        ),
    ),
    ("Footprint", "A block's size rounded up to the granularity G (512 B)."),
    (
        "Pages",
        (
            "The driver backs device memory with pages of P bytes (2 MiB, --page-size) and maps"
            " free pages wherever they lie, so the virtual addresses between blocks hold no free"
            " memory. A page is resident while a live footprint touches it."
        ),
    ),
    ("Reserved", "The resident pages' bytes (and a memory pool's recorded size): what the driver holds."),
    ("Allocated", "The bytes of the live footprints (footprints that overlap count once)."),
    (
        "Stranded S",
        (
            "Free bytes inside resident pages (reserved − allocated − R): only a request the driver"
            " packs into a partly used page can use them; nothing else gets them back until every"
            " block in the page is freed."
        ),
    ),
    (
        "Releasable R",
        (
            "What a memory pool (cudaMallocAsync) would give back at its next trim: its size beyond"
            " the bytes in use and its release threshold; 0 outside pools."
        ),
    ),
    ("Device free D", "C − reserved: the device's pages that no block touches."),
    (
        "Largest usable L_eff",
        (
            "max(L, D + R), L being the largest free run inside resident pages: a request of up to"
            " D bytes is mapped onto free pages wherever they lie."
        ),
    ),
    (
        "Free blocks",
        (
            "The rated metrics count everything free on the device: free = D + S + R, largest"
            " free = L_eff, and N = the free runs inside resident pages, plus one when D is at"
            " least a page."
        ),
    ),
    (
        "Internal fragmentation",
        "Rounding waste at the moment of peak footprint: Σ (footprint − bytes) / Σ footprint.",
    ),
    (
        "Allocation failure rate",
        (
            "failed / (failed + allocations). failed counts runtime and driver allocation calls"
            " (cudaMalloc*, cuMemAlloc*, …) with a non-zero return value, charged to the device of the"
            " calling thread's most recent successful allocation, else to the process's lowest"
            " device."
        ),
    ),
    (
        "Failed allocations",
        (
            "nsys records no size for a failed call, so each failure's verdict is unknown; the state"
            " at it (device free, largest usable) says how large a request could have succeeded then."
        ),
    ),
    (
        "Site",
        (
            "The NVTX push/pop ranges enclosing a block's allocation call on the calling thread,"
            " outermost first, joined with /; else the innermost start/end range; else (no range)."
        ),
    ),
)

WORDS = Words(
    space_title="observed device pages",
    figure_title=f"{MODEL_NAME} on the driver's pages",
    site_label="allocation site (NVTX)",
    free_meaning="free (device free + stranded + releasable)",
    largest_meaning="largest usable request",
    global_formula="(free − L_eff) / C",
    local_formula="1 − L_eff / free",
    size_unknown="size not recorded by nsys",
    unallocated="stranded in resident pages (reserved − allocated)",
    untimed="event",
    untimed_axis="memory events in order (the export recorded no times)",
    terms=TERMS,
)

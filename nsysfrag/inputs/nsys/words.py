"""How reports speak of an nsys export: its headings and the definitions of its own terms."""

from __future__ import annotations

from nsysfrag.events import Words
from nsysfrag.models.observed import MODEL_NAME

TERMS: tuple[tuple[str, str], ...] = (
    (
        "Address space",
        (
            "One per (process, CUDA device). Only device memory is replayed (memory kinds Device,"
            " Array and Device Static); pinned, pageable and managed events are counted as other-kind"
            " events. The model “observed” is the layout the trace recorded."
        ),
    ),
    (
        "Capacity C",
        (
            "The device's totalMemory (mapped through TARGET_INFO_CUDA_DEVICE when the process saw"
            " the GPU under another CUDA id), or --capacity."
        ),
    ),
    ("Footprint", "A block's size rounded up to the granularity G."),
    (
        "Arena [B, E)",
        (
            "B is the lowest allocated address, E = max(B + C, highest footprint end). When E > B + C"
            " the space is in span mode: the addresses span more than the device, and the observed"
            " layout over-states free space."
        ),
    ),
    (
        "Free blocks",
        (
            "The maximal ranges of the arena covered by no live footprint: F free bytes, L largest"
            " free block, N number of free blocks, U live (requested) bytes."
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
            " at it (free, largest free block) says how large a request could have succeeded then."
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
    space_title=f"{MODEL_NAME} address space",
    figure_title=f"{MODEL_NAME} address space",
    site_label="allocation site (NVTX)",
    size_unknown="size not recorded by nsys",
    terms=TERMS,
)

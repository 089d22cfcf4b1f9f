"""How reports speak of a PyTorch memory snapshot: PyTorch's words (reserved, allocated,
stranded, releasable, stack frames), never an nsys export's."""

from __future__ import annotations

from nsysfrag.events import Words
from nsysfrag.models.segments import MODEL_NAME

TERMS: tuple[tuple[str, str], ...] = (
    (
        "Space",
        (
            "One per CUDA device of the snapshot. The model “pytorch-segments” replays the snapshot's"
            " history: PyTorch's blocks inside its caching allocator's segments."
        ),
    ),
    (
        "Capacity C",
        (
            "--capacity; else the device's total memory where nsysfrag record wrote it beside the"
            " snapshot; else reserved + the device free memory PyTorch recorded at an out-of-memory"
            " entry; else the peak reserved memory, and then the device is taken to be full at the"
            " peak, so the fragmentation figures are upper bounds."
        ),
    ),
    ("Reserved", "The segments' bytes: what the caching allocator holds from the driver."),
    (
        "Allocated",
        "The bytes of blocks not yet free (a free still waiting for another stream counts).",
    ),
    (
        "Releasable R",
        (
            "Free bytes the allocator can hand back to the driver: segments that hold no allocated"
            " block (empty_cache() does it, and so does the allocator before it raises"
            " out-of-memory); in an expandable segment, its whole free pages."
        ),
    ),
    (
        "Stranded S",
        (
            "Free bytes in segments that also hold allocated blocks (reserved − allocated − R):"
            " nothing returns them until every block of the segment is freed."
        ),
    ),
    ("Device free D", "C − reserved: the device's memory outside the segments."),
    (
        "Largest usable L_eff",
        (
            "max(L, D + R), L being the largest free block inside a segment: the largest request"
            " that succeeds without new memory, since the allocator can release whole free segments"
            " and map a new one anywhere."
        ),
    ),
    (
        "Free blocks",
        (
            "The rated metrics count everything free on the device: free = D + (reserved −"
            " allocated), largest free = L_eff, and N = the free blocks inside segments, plus one"
            " when D > 0."
        ),
    ),
    (
        "Internal fragmentation",
        (
            "Rounding waste at the moment the allocated blocks held the most: Σ (allocated −"
            " requested) / Σ allocated."
        ),
    ),
    (
        "Failed allocations",
        (
            "PyTorch's out-of-memory entries, each with its own request and state. Out of capacity"
            " when the request exceeds device free + stranded + releasable (it would not have fit"
            " even without fragmentation); fragmentation otherwise (the memory existed, but no single"
            " free range held it)."
        ),
    ),
    (
        "Site",
        "The innermost stack frame of the allocation outside torch/ (file:line function).",
    ),
)

WORDS = Words(
    space_title=f"{MODEL_NAME} address space",
    figure_title=f"{MODEL_NAME} model",
    version_label="input",
    no_version="PyTorch memory snapshot",
    no_version_short="PyTorch memory snapshot",
    input_noun="snapshot",
    site_label="allocation site (stack frame)",
    free_meaning="free on the device (device free + reserved but unallocated)",
    largest_meaning="largest usable request",
    global_formula="(free − L_eff) / C",
    local_formula="1 − L_eff / free",
    other_kinds=False,
    size_unknown="size not recorded in the snapshot",
    terms=TERMS,
)

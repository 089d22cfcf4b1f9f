"""What if the run had used another allocator? Request streams, replays, ranking, advice.

Data flows one way: an input (a PyTorch memory snapshot or an nsys export) becomes one
:class:`~nsysfrag.allocators.base.RequestStream` per device (snapshot) or per (process, device)
(nsys) — ``streams``, on a device of capacity C (``capacity``); every policy replays it (the
same request stream, the same metrics under the policy's name, the requests it could
not place are its allocation failures) and ``summary`` turns each replay into a
:class:`PolicyOutcome`; ``ranking`` orders them and ``recommend`` picks what to change (data
only: the words are the reporters'). ``validate`` checks the ``torch`` model against a
snapshot's recorded segment events, from the layout at the window's start (``layout``). A
snapshot is read once, into columns; everything here is array code over them. ``run`` ties it
together: :func:`whatif`.
"""

from __future__ import annotations

from nsysfrag.allocators import DEFAULT_POLICIES
from nsysfrag.whatif.ranking import rank_policies
from nsysfrag.whatif.recommend import Recommendation, recommend
from nsysfrag.whatif.report import SpaceComparison, WhatifReport
from nsysfrag.whatif.results import PolicyOutcome, rank_key
from nsysfrag.whatif.run import whatif
from nsysfrag.whatif.summary import summarize
from nsysfrag.whatif.validate import (
    VALIDATION_TARGET_MATCH,
    VALIDATION_TARGET_PEAK,
    DeviceValidation,
    Validation,
    matched_in_order,
    validate_snapshot,
)

__all__ = [
    "DEFAULT_POLICIES",
    "VALIDATION_TARGET_MATCH",
    "VALIDATION_TARGET_PEAK",
    "DeviceValidation",
    "PolicyOutcome",
    "Recommendation",
    "SpaceComparison",
    "Validation",
    "WhatifReport",
    "matched_in_order",
    "rank_key",
    "rank_policies",
    "recommend",
    "summarize",
    "validate_snapshot",
    "whatif",
]

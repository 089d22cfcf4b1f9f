"""analyze(recording) -> Analysis: every space's model run turned into figures of docs/metrics.md.

``results`` holds the values, ``summary`` computes one space's figures from its state series
(with ``hotspots`` and ``histograms``), ``metrics`` the formulas and health levels, ``advice``
what to change.
"""

from __future__ import annotations

import dataclasses

from nsysfrag.analysis.results import (
    Analysis,
    Bucket,
    Counts,
    Hotspot,
    SpaceAnalysis,
    State,
    Timeline,
)
from nsysfrag.analysis.summary import summarize
from nsysfrag.errors import InputError
from nsysfrag.events import ProgressCallback
from nsysfrag.inputs import Recording
from nsysfrag.models.series import EVENT_NAMES

__all__ = [
    "EVENT_NAMES",
    "Analysis",
    "Bucket",
    "Counts",
    "Hotspot",
    "SpaceAnalysis",
    "State",
    "Timeline",
    "analyze",
]


def analyze(recording: Recording, progress: ProgressCallback | None = None) -> Analysis:
    """Run every space of ``recording`` in its model and summarize it."""
    total = sum(len(space.events) for space in recording.spaces)
    # Every time a report shows counts from the input's first event, in every space alike.
    firsts = [int(space.events.time_ns[0]) for space in recording.spaces if len(space.events)]
    source = dataclasses.replace(recording.source, first_event_ns=min(firsts, default=0))
    spaces, warnings, done = [], list(recording.warnings), 0
    for space in recording.spaces:
        if progress is not None:
            progress("replaying events", done, total)
        run = space.model.run(space)
        done += len(space.events)
        if len(run.series) == 0:  # nothing the model places: no figures
            continue
        warnings += run.warnings
        spaces.append(summarize(space, run, source, recording.model))
    if progress is not None:
        progress("replaying events", done, total)
    if recording.spaces and not spaces:
        raise InputError(f"{recording.source.path}: {recording.nothing_to_analyze}")
    return Analysis(
        source=source,
        granularity_bytes=recording.granularity_bytes,
        spaces=spaces,
        model=recording.model,
        input_counts=recording.counts,
        warnings=warnings,
        page_bytes=recording.page_bytes,
    )

"""``whatif(path)``: an input's request streams, replayed through every policy and ranked, with
the torch model's validation when asked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nsysfrag.allocators import DEFAULT_POLICIES, DRIVER_REMEDIES, Policy, parse_policy
from nsysfrag.allocators.driver import NAME as DRIVER
from nsysfrag.errors import InputError
from nsysfrag.inputs.torch_snapshot.columns import read_snapshot_columns
from nsysfrag.whatif.capacity import recorded_devices
from nsysfrag.whatif.driver import PROGRAM_DRIVER, PROGRAM_SEGMENTS
from nsysfrag.whatif.ranking import rank_policies
from nsysfrag.whatif.report import WhatifReport
from nsysfrag.whatif.results import NSYS, SNAPSHOT
from nsysfrag.whatif.streams import RequestSource, nsys_streams, snapshot_streams, tried_policy
from nsysfrag.whatif.validate import Validation, validate_snapshot


def whatif(
    path: Path,
    policies: Sequence[str] = (),
    capacity: int | None = None,
    validate: bool = False,
) -> WhatifReport:
    """Replay the input's request streams through ``policies`` (default: what suits the kind
    of program that recorded it, :func:`default_policies`)."""
    from nsysfrag.inputs.torch_snapshot.reader import is_snapshot

    named = [parse_policy(text) for text in policies]
    if capacity is not None and capacity < 1:
        raise InputError("--capacity must be a positive number of bytes")
    snapshot = is_snapshot(path) if path.exists() else path.suffix.lower() in (".pickle", ".pkl")
    if snapshot and any(p.family == DRIVER for p in named):
        raise InputError(
            f"{path}: --policy {DRIVER} is what an nsys trace recorded of the driver; a snapshot"
            " records PyTorch's allocator instead: leave it out"
        )
    checked: Validation | None = None  # the model's own error on this input
    if validate and not snapshot:
        raise InputError(
            f"{path}: --validate needs a PyTorch memory snapshot (its recorded segment events are"
            " the ground truth); this looks like an nsys export"
        )
    if snapshot:
        from nsysfrag.inputs.torch_snapshot.facts import facts_beside

        columns = read_snapshot_columns(path)
        devices = recorded_devices(columns)
        said: list[str] = []
        facts = facts_beside(path, said)  # X.device.json of nsysfrag record: the device's size
        sources, notes = snapshot_streams(
            columns, devices, capacity, facts.total_memory if facts is not None else None
        )
        notes += said
        # Every what-if of a snapshot quotes the model's error on it.
        checked = validate_snapshot(columns, capacity, devices)
        kind = SNAPSHOT
        level = "tensor-level requests (the snapshot's alloc / free_completed)"
    else:
        sources, notes = nsys_streams(path, capacity)
        kind = NSYS
        level = "driver-level allocations (nsys CUDA memory events)"
    validation = checked if validate else None
    if not sources:
        if validation is not None:
            return WhatifReport(str(path), kind, level, [], notes, validation)
        if kind == NSYS:  # as analyze says of it: a valid trace of a program with nothing to place
            nothing = "no device-memory allocation in this trace: nothing to replay"
            return WhatifReport(str(path), kind, level, [], [*notes, nothing])
        raise InputError(
            f"{path}: no allocation to replay (no alloc in the trace and no live block);"
            " record a trace of the run's allocations"
        )
    errors = {d.device: d.peak_error for d in checked.devices} if checked else {}
    spaces = []
    for s in sources:
        # Without --policy: every family, and each torch setting the input suggests on top of
        # the run's own (analysis.tried_settings: what analyze's advice may name).
        tried = [] if policies else [tried_policy(s.baseline, x) for x in s.tried]
        unique: dict[str, Policy] = {}  # a policy named twice runs once
        for p in (named or default_policies(s)) + tried:
            unique.setdefault(p.name, p)
        spaces.append(rank_policies(s, list(unique.values()), errors.get(s.device)))
    return WhatifReport(str(path), kind, level, spaces, notes, validation)


def default_policies(source: RequestSource) -> list[Policy]:
    """What runs without --policy, by the kind of program: a snapshot's every family (and the
    torch settings it suggests, added by the caller); a program that calls the driver directly,
    the remedies analyze names for it; a caching allocator's segments, nothing but the record
    (their what-if belongs to a memory snapshot)."""
    names = {PROGRAM_DRIVER: DRIVER_REMEDIES, PROGRAM_SEGMENTS: ()}.get(
        source.program, DEFAULT_POLICIES
    )
    return [parse_policy(name) for name in names]

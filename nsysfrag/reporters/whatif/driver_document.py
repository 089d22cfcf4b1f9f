"""The ``driver`` section of a what-if space's JSON: an nsys trace's kind of program, its
recorded failures and each remedy against the recorded driver behaviour (null for a snapshot)."""

from __future__ import annotations

from typing import Any

from nsysfrag.whatif.recommend import DriverVerdict, Remedy


def _span(room: tuple[int, int] | None) -> dict[str, int] | None:
    return None if room is None else {"min_bytes": room[0], "max_bytes": room[1]}


def remedy_document(r: Remedy) -> dict[str, Any]:
    return {
        "policy": r.policy,
        "description": r.description,
        "peak_reserved_bytes": r.peak_reserved_bytes,
        "saving_bytes": r.saving_bytes,
        "saving_ratio": r.saving_ratio,
        "new_failures": r.new_failures,
        "roomier_at_failures": r.roomier,
        "room_at_failures": _span(r.room_bytes),
        "validated": False,
    }


def driver_document(d: DriverVerdict | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {
        "program": d.program,
        "recorded_failures": d.failures,
        "driver_room_at_failures": _span(d.driver_room_bytes),
        "remedies": [remedy_document(r) for r in d.remedies],
        "pick": d.pick.policy if d.pick else None,
        "reason": d.reason,
    }

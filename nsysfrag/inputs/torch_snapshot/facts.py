"""The device facts ``nsysfrag record`` writes beside each snapshot (``X.device.json`` beside
``X.pickle``), read back: above all each device's total memory, the capacity a snapshot alone
cannot give.

The file is input like any other: it is read only if it is a regular file of at most
FACTS_MAX_BYTES, and every figure is checked; a file that fails is one warning, and the
snapshot is then rated as if the file were not there.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsysfrag.capacity import DeviceBytes
from nsysfrag.record.bootstrap.nsysfrag_recorder.names import FACTS_SCHEMA, facts_name

FACTS_MAX_BYTES = 16 << 20
_MAX_BYTES_VALUE = 1 << 60  # a device larger than an exabyte is no device


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What the record says about one process and its devices at one snapshot."""

    path: Path
    reason: str  # "exit", "oom", "state", "SIGTERM"
    rank: int | None
    world_size: int | None
    host: str | None
    pid: int | None
    torch_version: str | None
    time_unix_ns: int | None
    # device index -> bytes: the total, or the allowed maximum under a memory fraction
    total_memory: dict[int, int] = field(default_factory=dict)
    named_by: str | None = None  # the rule that named the rank: a launcher variable, "device", "pid"
    attempt: int = 0  # torchrun's restart count


def facts_path(snapshot: Path) -> Path:
    return snapshot.with_name(facts_name(snapshot.name))


def facts_beside(snapshot: Path, warnings: list[str]) -> DeviceFacts | None:
    """The facts beside ``snapshot``; None when there are none (a snapshot not from a record)
    or they cannot be used (then a warning says why)."""
    path = facts_path(snapshot)
    try:
        st = os.stat(path)
    except OSError:
        return None
    problem = None
    data: Any = None
    if not stat.S_ISREG(st.st_mode):
        problem = "not a regular file"
    elif st.st_size > FACTS_MAX_BYTES:
        problem = f"larger than {FACTS_MAX_BYTES >> 20} MiB"
    else:
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError) as err:
            problem = f"not readable JSON ({type(err).__name__})"
    facts = None if problem else parse_facts(path, data)
    if facts is None:
        warnings.append(
            f"{path.name} beside the snapshot is {problem or 'not a record of device facts'};"
            " the device's size is estimated as for any snapshot"
        )
    return facts


def parse_facts(path: Path, data: Any) -> DeviceFacts | None:
    """The facts in ``data`` (a facts file's JSON), None unless every figure checks out."""
    if not isinstance(data, dict) or data.get("schema") != FACTS_SCHEMA:
        return None
    devices = data.get("devices")
    if not isinstance(devices, list):
        return None
    totals: dict[int, int] = {}
    for d in devices[:4096]:
        if not isinstance(d, dict):
            return None
        index, total = _count(d.get("index"), 1 << 16), d.get("total_memory_bytes")
        if index is None:
            return None
        if total is not None:
            if _count(total, _MAX_BYTES_VALUE) is None or total < 1:
                return None
            totals[index] = _allowed(total, d.get("memory_fraction"))
    oom = data.get("oom")
    if isinstance(oom, dict):  # the OOM observer's figure: the allowed maximum, under a fraction
        index, allowed = _count(oom.get("device"), 1 << 16), _count(oom.get("device_total_bytes"), _MAX_BYTES_VALUE)
        total = totals.get(index) if index is not None else None
        if index is not None and total is not None and allowed and allowed < total:
            totals[index] = DeviceBytes(allowed, allowed / total)
    return DeviceFacts(
        path=path,
        reason=_text(data.get("reason")) or "?",
        rank=_count(data.get("rank"), 1 << 31),
        world_size=_count(data.get("world_size"), 1 << 31),
        host=_text(data.get("host")),
        pid=_count(data.get("pid"), 1 << 31),
        torch_version=_text(data.get("torch_version")),
        time_unix_ns=_count(data.get("time_unix_ns"), 1 << 63),
        total_memory=totals,
        named_by=_text(data.get("named_by")),
        attempt=_count(data.get("attempt"), 1 << 31) or 0,
    )


def _allowed(total: int, fraction: Any) -> int:
    """The device's memory this process may use: ``total``, or under a memory fraction below 1
    the allowed maximum PyTorch computes (fraction x total)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        return total
    return DeviceBytes(max(1, int(fraction * total)), float(fraction))


def _count(value: Any, limit: int) -> int | None:
    """A non-negative integer below ``limit`` (a bool is not one), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        return None
    return value


def _text(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) else None

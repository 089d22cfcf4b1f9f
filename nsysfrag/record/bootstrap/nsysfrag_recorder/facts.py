"""Who this process is and what its devices are: the facts a snapshot does not record.

A snapshot never says how large the device was, which rank wrote it, or what the allocator
reported beside it; these are read here from the environment and from torch, each in its own
``try`` (a fact torch cannot give is left out, the rest still written).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

from .names import FACTS_SCHEMA

# The launchers' own names for the global rank and the world size, first match wins.
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
WORLD_VARIABLES = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
LOCAL_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING")
# The memory_stats() keys a timeline line keeps (the facts beside a snapshot keep them all).
TIMELINE_STATS = {
    "reserved_bytes": "reserved_bytes.all.current",
    "reserved_bytes_peak": "reserved_bytes.all.peak",
    "allocated_bytes": "allocated_bytes.all.current",
    "allocated_bytes_peak": "allocated_bytes.all.peak",
    "active_bytes": "active_bytes.all.current",
    "requested_bytes": "requested_bytes.all.current",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "segments": "segment.all.current",
    "alloc_retries": "num_alloc_retries",
    "ooms": "num_ooms",
}


# torchrun counts the restarts of its workers; each attempt of a rank is kept apart.
RESTART_VARIABLE = "TORCHELASTIC_RESTART_COUNT"
MAX_RANK = 1 << 31


def number(text: str) -> int | None:
    """A launcher's count (``"3"``, ``"0000000001"``) as an int; None for anything else: a
    superscript digit is a digit to ``str.isdigit`` but not to ``int``, and a sign or a space
    inside is no rank."""
    value = text.strip()
    if not value or not value.isascii() or not value.isdigit():
        return None
    digits = value.lstrip("0") or "0"
    return int(digits) if len(digits) < 10 and int(digits) < MAX_RANK else None


def launcher_rank() -> tuple[int, str] | None:
    """The global rank the launcher gave this process and the variable that said it; None
    when no launcher variable holds a rank."""
    for name in RANK_VARIABLES:
        value = number(os.environ.get(name, ""))
        if value is not None:
            return value, name
    return None


def _first_int(names: tuple[str, ...]) -> int | None:
    for name in names:
        value = number(os.environ.get(name, ""))
        if value is not None:
            return value
    return None


def rank() -> int | None:
    """The global rank the launcher gave this process; None when it gave none."""
    found = launcher_rank()
    return None if found is None else found[0]


def restart_count() -> int:
    """Which attempt of its rank this process is (torchrun's restarts; 0 without one)."""
    return number(os.environ.get(RESTART_VARIABLE, "")) or 0


def identity(torch: Any) -> dict[str, Any]:
    """Rank, world size, host, pid, program and versions."""
    out: dict[str, Any] = {
        "rank": rank(),
        "local_rank": _first_int(LOCAL_VARIABLES),
        "world_size": _first_int(WORLD_VARIABLES),
        "attempt": restart_count(),
        "host": _safe(socket.gethostname),
        "pid": os.getpid(),
        "argv": [str(a)[:200] for a in getattr(sys, "argv", [])[:32]],
        "python": sys.version.split()[0],
        "torch_version": str(getattr(torch, "__version__", "")) or None,
        "cuda_version": _safe(lambda: torch.version.cuda),
        "allocator_env": {k: os.environ[k] for k in ALLOC_CONF_VARIABLES if k in os.environ},
        "allocator_backend": _safe(lambda: torch.cuda.get_allocator_backend()),
    }
    return out


def devices(torch: Any, in_use: list[int], full_stats: bool) -> list[dict[str, Any]]:
    """Every visible device's name and total memory; for those in use also ``mem_get_info()``
    and ``memory_stats()`` (all of it with ``full_stats``, else the timeline's keys)."""
    out = []
    count = _safe(torch.cuda.device_count) or 0
    for d in range(int(count)):
        entry: dict[str, Any] = {"index": d}
        props = _safe(lambda d=d: torch.cuda.get_device_properties(d))
        if props is not None:
            entry["name"] = str(getattr(props, "name", ""))
            total = getattr(props, "total_memory", None)
            if isinstance(total, int):
                entry["total_memory_bytes"] = total
        if d in in_use:
            entry.update(usage(torch, d, full_stats))
        out.append(entry)
    return out


def usage(torch: Any, device: int, full_stats: bool) -> dict[str, Any]:
    """``mem_get_info()`` and ``memory_stats()`` of one device, now."""
    out: dict[str, Any] = {}
    info = _safe(lambda: torch.cuda.mem_get_info(device))
    if info is not None:
        out["device_free_bytes"], out["device_total_bytes"] = int(info[0]), int(info[1])
    # set_per_process_memory_fraction: the allocator refuses beyond fraction x total (PyTorch
    # 2.5 and later can say it; before, the OOM observer's figure tells).
    fraction = _safe(lambda: torch.cuda.get_per_process_memory_fraction(device))
    if isinstance(fraction, float):
        out["memory_fraction"] = fraction
    stats = _safe(lambda: torch.cuda.memory_stats(device)) or {}
    if full_stats:
        out["memory_stats"] = {str(k): v for k, v in stats.items() if isinstance(v, (int, float))}
    else:
        out.update({name: stats[key] for name, key in TIMELINE_STATS.items() if key in stats})
    return out


def facts(
    torch: Any, who: dict[str, Any], in_use: list[int], reason: str, **extra: Any
) -> dict[str, Any]:
    """The facts file beside a snapshot taken for ``reason`` ("exit", "oom", "state", ...)."""
    return {
        "schema": FACTS_SCHEMA,
        "reason": reason,
        "time_unix_ns": time.time_ns(),
        **who,
        "devices": devices(torch, in_use, full_stats=reason != "state"),
        **extra,
    }


def _safe(read: Any) -> Any:
    try:
        return read()
    except Exception:  # noqa: BLE001  (a fact torch cannot give is left out)
        return None

"""What each check of ``record_check.py`` must have observed: the rules the script applies on
the GPU and ``tests/test_record_truth.py`` applies again to every committed truth file (and to
the script's run on the fake torch). ``problems(check, observed)``: empty when it holds."""

from __future__ import annotations

import os
from typing import Any

# No pause over 50 ms on a GPU. The fake torch's allocator is Python, and a loaded test machine
# stretches it: tests/test_record_truth.py proves the script's structure there with a looser bound.
MAX_PAUSE_S = float(os.environ.get("RECORD_CHECK_MAX_PAUSE_S", "0.05"))
MiB = 1 << 20


def _ranks(o: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    listed = o.get("ranks") or [{"folders": []}]
    return list(listed[0].get("folders", [])), list(listed[1:])


def problems(check: str, o: dict[str, Any]) -> list[str]:
    """Why ``o`` (what ``check`` observed) breaks the rules; empty when it keeps them."""
    return [why for ok, why in RULES[check](o) if not ok]


def _torchrun_2(o: dict[str, Any]) -> list[tuple[bool, str]]:
    folders, ranks = _ranks(o)
    by = {r["rank"]: r for r in ranks}
    r1 = by.get(1, {})
    total = o.get("device_total_bytes")
    oom = o.get("rank1_oom") or {}
    return [
        (o.get("exit_code") == 1, f"exit code {o.get('exit_code')}, not torchrun's 1"),
        ({"rank0", "rank1"} <= set(folders), f"rank folders {folders}"),
        (all(by.get(k, {}).get("named_by") == "RANK" for k in (0, 1)), "a rank not named by RANK"),
        (r1.get("ooms", [None])[:1] == ["fragmentation"], f"rank 1's OOM verdicts {r1.get('ooms')}"),
        (o.get("rank0_final_reason") == "SIGTERM", f"rank 0's final reason {o.get('rank0_final_reason')}"),
        (r1.get("capacity_source") in ("oom", "device"), f"rank 1's capacity source {r1.get('capacity_source')}"),
        (isinstance(total, int) and isinstance(r1.get("capacity_bytes"), int) and r1["capacity_bytes"] <= total,
         "rank 1's capacity is above the device's memory"),
        (oom.get("device_total_bytes") == total, "no memory fraction, yet the observer's total is not the device's"),
        (o.get("alerts", 0) >= 1, "no alert for rank 1"),
    ]  # fmt: skip


def _spawn_2(o: dict[str, Any]) -> list[tuple[bool, str]]:
    folders, ranks = _ranks(o)
    named = sorted(str(r.get("named_by")) for r in ranks)
    peaks = sorted(r.get("allocated_bytes_peak") or 0 for r in ranks)
    return [
        (o.get("exit_code") == 0, f"exit code {o.get('exit_code')}"),
        (named == ["device", "pid"], f"named by {named}, not one device and one pid"),
        ("rank0" in folders and any(f.startswith("pid") for f in folders), f"folders {folders}"),
        (peaks == [64 * MiB, 128 * MiB], f"peaks {peaks}: the job mixed the processes up"),
    ]


def _sigterm(o: dict[str, Any]) -> list[tuple[bool, str]]:
    return [
        (o.get("exit_code") == 143, f"exit code {o.get('exit_code')}, not 128 + SIGTERM"),
        (o.get("final_reason") == "SIGTERM", f"final snapshot's reason {o.get('final_reason')}"),
        (bool(o.get("said")), "nothing said about the SIGTERM"),
    ]


def _fraction(o: dict[str, Any]) -> list[tuple[bool, str]]:
    _, ranks = _ranks(o)
    r = ranks[0] if ranks else {}
    total = o.get("device_total_bytes") or 0
    allowed = int(o.get("fraction", 0) * total)
    return [
        (o.get("exit_code") == 0, f"exit code {o.get('exit_code')}"),
        (r.get("capacity_bytes") == allowed, f"capacity {r.get('capacity_bytes')}, not the allowed {allowed}"),
        (r.get("capacity_source") == "device", f"capacity source {r.get('capacity_source')}"),
        ("set_per_process_memory_fraction" in str(r.get("capacity_basis")), "the basis does not name the fraction"),
        ((o.get("oom") or {}).get("device_total_bytes") == allowed, "the observer was not handed the allowed maximum"),
    ]  # fmt: skip


def _entries_100k(o: dict[str, Any]) -> list[tuple[bool, str]]:
    _, ranks = _ranks(o)
    r = ranks[0] if ranks else {}
    pause = (r.get("pause_s") or {}).get("max")
    return [
        (o.get("exit_code") == 0, f"exit code {o.get('exit_code')}"),
        (isinstance(pause, float) and pause <= MAX_PAUSE_S, f"longest pause {pause} s"),
        ((r.get("state_snapshots") or 0) + (r.get("states_refused") or 0) >= 1, "no state was due"),
        (isinstance((o.get("unrecorded") or {}).get("memory_snapshot_s"), float), "the unrecorded cost is missing"),
    ]


def _monitor_step(o: dict[str, Any]) -> list[tuple[bool, str]]:
    rated = o.get("rated")
    pause = o.get("longest_pause_s")
    return [
        (o.get("exit_code") == 0, f"exit code {o.get('exit_code')}: {o.get('error')}"),
        (isinstance(pause, float) and pause <= MAX_PAUSE_S, f"longest pause {pause} s"),
        (str(rated).isdigit() and 1 <= int(rated) < o.get("steps", 0), f"{rated} of {o.get('steps')} steps rated: the budget did not decide"),
    ]  # fmt: skip


RULES = {"torchrun_2": _torchrun_2, "spawn_2": _spawn_2, "sigterm": _sigterm, "fraction": _fraction,
         "entries_100k": _entries_100k, "monitor_step": _monitor_step}  # fmt: skip

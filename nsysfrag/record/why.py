"""Why a record holds no snapshot, in one sentence, from ``processes.jsonl``: the line each
Python process of the command wrote at start, on importing torch, on initializing CUDA, and on
a recorder error."""

from __future__ import annotations

from pathlib import Path

from nsysfrag.record.layout import process_events, rank_folders


def nothing_recorded(out: Path) -> str:
    """The line that says why ``out`` holds no snapshot to analyze."""
    events = process_events(out)
    for e in events:
        if e.get("event") == "unsupported":  # the torch is too old: its own line, once
            return str(e.get("error"))[:300]
    refused = [e for e in events if e.get("event") == "no_history"]
    if refused:
        sampled = [str(r.path.relative_to(out) / r.timeline.name) for r in rank_folders(out)
                   if r.timeline.is_file()]  # fmt: skip
        where = f" ({', '.join(sampled[:4])})" if sampled else ""
        return (
            f"{str(refused[0].get('error'))[:300]}{where}; there is no snapshot to analyze"
            " (the default backend records one)"
        )
    return f"nothing was recorded: {_why_nothing(out, events)}"


def _why_nothing(out: Path, events: list[dict[str, object]]) -> str:
    by_kind: dict[str, set[int]] = {}
    for e in events:
        pid = e.get("pid")
        if isinstance(pid, int):
            by_kind.setdefault(str(e.get("event")), set()).add(pid)
    errors = [str(e.get("error"))[:300] for e in events if e.get("event") == "error"]
    pythons = len(by_kind.get("python", ()))
    if errors:
        return (
            f"the recorder could not start in {len(by_kind.get('error', ()))} process(es):"
            f" {errors[0]}"
        )
    if any(r.path for r in rank_folders(out)):
        return (
            "a process initialized CUDA but left no snapshot (it was killed, called os._exit,"
            " or could not write one: see its warnings); see the timeline in its rank folder"
        )
    if "cuda" in by_kind:
        return "a process initialized CUDA but wrote nothing (its rank folder is gone)"
    if "torch" in by_kind:
        n = len(by_kind["torch"])
        return (
            f"{n} process{'es' if n > 1 else ''} imported torch but none initialized CUDA (the"
            " program ran on the CPU, or torch.cuda.is_available() was false)"
        )
    if pythons:
        return (
            f"{pythons} Python process{'es' if pythons > 1 else ''} ran, but none imported torch"
        )
    return (
        "no Python process of the command ran the recorder: the command is not a Python"
        " program, or its Python ignores PYTHONPATH (started with -I or -E, or a frozen"
        " executable)"
    )

"""A record folder as nsysfrag sees it: made ready before the command starts, its ranks and
the snapshot of each that a later ``analyze`` reads (``bootstrap/nsysfrag_recorder/names.py``
lists the files).

A rank's snapshot is ``final.pickle`` (its history up to exit); for a rank that died before
exit, its newest ``oom-{k}.pickle``, else its newest ``state-{n}.pickle`` (the layout only).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsysfrag import __version__
from nsysfrag.errors import InputError
from nsysfrag.record.bootstrap.nsysfrag_recorder.names import (
    FINAL,
    MARKER,
    OOM_PREFIX,
    PROCESS,
    PROCESSES,
    RANK_PREFIX,
    RECORD_SCHEMA,
    STATE_PREFIX,
    TIMELINE,
    numbered,
)

_RANK_FOLDER = re.compile(rf"^{RANK_PREFIX}(\d{{1,9}})(?:-pid(\d{{1,9}}))?$")
MARKER_MAX_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class RankFolder:
    """One process's folder: its rank, and the snapshots it left."""

    rank: int
    path: Path
    pid_suffix: int | None  # rank{R}-pid{P}: a second process of rank R
    final: Path | None
    ooms: tuple[Path, ...]  # in order
    state: Path | None  # the newest state snapshot

    @property
    def snapshot(self) -> Path | None:
        """The snapshot that stands for the rank: final, else the newest OOM, else the state."""
        if self.final is not None:
            return self.final
        if self.ooms:
            return self.ooms[-1]
        return self.state

    @property
    def timeline(self) -> Path:
        return self.path / TIMELINE

    @property
    def process(self) -> Path:
        return self.path / PROCESS


def is_record(path: Path | str) -> bool:
    """A folder with a ``record.json`` in it."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MARKER))


def rank_folders(out: Path) -> list[RankFolder]:
    """Every rank folder of the record, by rank (a rank's second process after its first)."""
    found = []
    try:
        names = sorted(os.listdir(out))
    except OSError as err:
        raise InputError(f"{out}: cannot list the record folder ({err.strerror})") from None
    for name in names:
        m = _RANK_FOLDER.match(name)
        path = out / name
        if m is None or not path.is_dir():
            continue
        files = sorted(os.listdir(path))
        ooms = sorted((n, f) for f in files if (n := numbered(f, OOM_PREFIX)) is not None)
        states = sorted((n, f) for f in files if (n := numbered(f, STATE_PREFIX)) is not None)
        found.append(
            RankFolder(
                rank=int(m.group(1)),
                path=path,
                pid_suffix=int(m.group(2)) if m.group(2) else None,
                final=path / FINAL if FINAL in files else None,
                ooms=tuple(path / f for _, f in ooms),
                state=path / states[-1][1] if states else None,
            )
        )
    found.sort(key=lambda r: (r.rank, r.pid_suffix is not None, r.pid_suffix or 0))
    return found


def job_inputs(out: Path) -> tuple[list[tuple[Path, int]], list[str]]:
    """The snapshot of each rank, with its rank, and a note for each rank folder that gives
    none (a rank that died before its first snapshot, a second process of a rank)."""
    inputs, notes, taken = [], [], set()
    for r in rank_folders(out):
        if r.rank in taken:
            notes.append(
                f"rank {r.rank} ran a second CUDA process ({r.path.name}); the job shows the"
                f" first, analyze {r.path / FINAL if r.final else r.path} alone for this one"
            )
            continue
        if r.snapshot is None:
            notes.append(
                f"rank {r.rank} left no snapshot (it ended before its first one was written);"
                f" its samples are in {r.timeline}"
            )
            continue
        taken.add(r.rank)
        inputs.append((r.snapshot, r.rank))
        if r.final is None:
            notes.append(
                f"rank {r.rank} has no final snapshot (it did not exit normally); analyzing"
                f" {r.snapshot.name}"
            )
    return inputs, notes


def prepare(out: Path, command: tuple[str, ...], options: dict[str, Any], overwrite: bool) -> None:
    """Make ``out`` a fresh record folder, before the command starts: refused when it holds a
    record (unless ``overwrite``), holds anything else, or cannot be written."""
    if out.exists() and not out.is_dir():
        raise InputError(f"-o {out}: is a file, not a folder; name a folder for the record")
    if is_record(out):
        if not overwrite:
            raise InputError(
                f"-o {out}: already holds a record; pass --overwrite to replace it, or name"
                " another folder"
            )
        clear(out)
    elif out.is_dir() and any(out.iterdir()):
        raise InputError(
            f"-o {out}: the folder is not empty and holds no record; name a new or empty folder"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_marker(out, {
            "schema": RECORD_SCHEMA,
            "command": list(command),
            "options": options,
            "started_unix_ns": time.time_ns(),
            "nsysfrag_version": __version__,
            "status": "running",
        })
    except OSError as err:
        raise InputError(
            f"-o {out}: cannot write the record there ({err.strerror}); choose a writable folder"
        ) from None


def clear(out: Path) -> None:
    """Remove what a record wrote in ``out`` (its rank folders and files), nothing else."""
    for name in os.listdir(out):
        path = out / name
        if _RANK_FOLDER.match(name) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif name in (MARKER, PROCESSES):
            path.unlink()


def write_marker(out: Path, marker: dict[str, Any]) -> None:
    temporary = out / f".{MARKER}.part"
    temporary.write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, out / MARKER)


def read_marker(out: Path) -> dict[str, Any]:
    """``record.json``, or an empty dict when it is missing or not a record's."""
    path = out / MARKER
    try:
        if path.stat().st_size > MARKER_MAX_BYTES:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {}
    return data if isinstance(data, dict) and data.get("schema") == RECORD_SCHEMA else {}


def update_marker(out: Path, **changes: Any) -> None:
    marker = read_marker(out)
    if marker:
        try:
            write_marker(out, {**marker, **changes})
        except OSError:
            pass  # the record stays readable without its end time


def process_events(out: Path) -> list[dict[str, Any]]:
    """``processes.jsonl``: each Python process of the command and how far it got."""
    events = []
    try:
        with open(out / PROCESSES, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    events.append(event)
    except OSError:
        pass
    return events

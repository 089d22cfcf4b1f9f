"""A record folder as nsysfrag sees it: made ready before the command starts, its ranks and
the snapshot of each that a later ``analyze`` reads (``bootstrap/nsysfrag_recorder/names.py``
lists the files).

A rank's snapshot is ``final.pickle`` (its history up to exit); for a rank that died before
exit, its newest ``oom-{k}.pickle``, else its newest ``state-{n}.pickle`` (the layout only).
A rank restarted by torchrun (``rank{R}-attempt{A}``) stands by its newest attempt; a process
named by its pid (``pid{P}``: no launcher's rank, no device of its own) gets the next rank after
the named ones.

Several hosts may record into one folder (a shared file system): the first writes
``record.json``, each other ``record-{host}.json``; ``--overwrite`` clears only the rank folders
whose ``process.json`` names this host. Nothing in a record folder may be a link: a rank folder
that is one is refused, and ``clear`` removes links instead of following them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nsysfrag import __version__, destinations
from nsysfrag.errors import InputError
from nsysfrag.record.bootstrap.nsysfrag_recorder.names import (
    FINAL,
    HOST_MARKER_PREFIX,
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

_RANK_FOLDER = re.compile(
    rf"^(?:{RANK_PREFIX}(\d{{1,9}})(?:-attempt(\d{{1,9}}))?(?:-pid(\d{{1,9}}))?|pid(\d{{1,9}}))$"
)
_HOST_MARKER = re.compile(rf"^{HOST_MARKER_PREFIX}[A-Za-z0-9._-]{{1,64}}\.json$")
MARKER_MAX_BYTES = 1 << 20
PROCESS_MAX_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class RankFolder:
    """One process's folder: its rank, and the snapshots it left."""

    rank: int
    path: Path
    pid_suffix: int | None  # rank{R}-pid{P}: a second process of rank R
    final: Path | None
    ooms: tuple[Path, ...]  # in order
    state: Path | None  # the newest state snapshot
    attempt: int = 0  # rank{R}-attempt{A}: torchrun's restart A of rank R
    by_pid: bool = False  # pid{P}: named by its pid; ``rank`` is given by the job's order
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


def rank_folders(out: Path, links: str = "refuse") -> list[RankFolder]:
    """Every rank folder of the record, by rank (a rank's attempts in order, its second process
    after them; processes named by their pid after every named rank). A rank folder that is a
    link is refused (``links="skip"``: left out, for the code that clears a record)."""
    found = []
    try:
        names = sorted(os.listdir(out))
    except OSError as err:
        raise InputError(f"{out}: cannot list the record folder ({err.strerror})") from None
    for name in names:
        m = _RANK_FOLDER.match(name)
        path = out / name
        if m is None:
            continue
        if path.is_symlink():
            if links == "skip":
                continue
            raise InputError(
                f"{path}: is a symbolic link; a record's rank folders are never links (remove it,"
                " or analyze the snapshot it points to by its own path)"
            )
        if not path.is_dir():
            continue
        # A link inside a rank folder is no file of the record's: never read through it.
        files = sorted(f for f in os.listdir(path) if not (path / f).is_symlink())
        ooms = sorted((n, f) for f in files if (n := numbered(f, OOM_PREFIX)) is not None)
        states = sorted((n, f) for f in files if (n := numbered(f, STATE_PREFIX)) is not None)
        rank, attempt, pid_suffix, by_pid = m.groups()
        found.append(
            RankFolder(
                rank=int(rank) if rank is not None else -1,
                path=path,
                pid_suffix=int(pid_suffix) if pid_suffix else None,
                final=path / FINAL if FINAL in files else None,
                ooms=tuple(path / f for _, f in ooms),
                state=path / states[-1][1] if states else None,
                attempt=int(attempt) if attempt else 0,
                by_pid=by_pid is not None,
            )
        )
    named = [r for r in found if not r.by_pid]
    named.sort(key=lambda r: (r.rank, r.pid_suffix is not None, r.attempt, r.pid_suffix or 0))
    after = max((r.rank for r in named), default=-1) + 1
    unnamed = sorted((r for r in found if r.by_pid), key=lambda r: r.path.name)
    return named + [replace(r, rank=after + k) for k, r in enumerate(unnamed)]


def job_inputs(out: Path) -> tuple[list[tuple[Path, int]], list[str]]:
    """The snapshot of each rank, with its rank, and a note for each rank folder that gives
    none (a rank that died before its first snapshot, a second process of a rank, an attempt
    torchrun restarted, a process named by its pid)."""
    folders = rank_folders(out)
    newest = {}
    for r in folders:
        if r.pid_suffix is None and r.snapshot is not None:
            newest[r.rank] = max(newest.get(r.rank, 0), r.attempt)
    inputs, notes, taken = [], [], set()
    for r in folders:
        if r.rank in taken or (r.pid_suffix is None and r.attempt < newest.get(r.rank, r.attempt)):
            what = (
                f"ran a second CUDA process ({r.path.name})" if r.pid_suffix is not None
                else f"was restarted: attempt {r.attempt} ({r.path.name}) is not the one shown"
            )  # fmt: skip
            notes.append(
                f"rank {r.rank} {what}; the job shows its newest attempt, analyze"
                f" {r.path / FINAL if r.final else r.path} alone for this one"
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
        if r.by_pid:
            notes.append(
                f"{r.path.name} had no launcher's rank and no CUDA device of its own; it is rank"
                f" {r.rank} of this job"
            )
        if r.final is None:
            notes.append(
                f"rank {r.rank} has no final snapshot (it did not exit normally); analyzing"
                f" {r.snapshot.name}"
            )
    return inputs, notes


def this_host() -> str:
    """This host's name as marker files and rank folders give it."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64]
    return name or "localhost"


def folder_host(folder: RankFolder) -> str | None:
    """The host a rank folder's ``process.json`` names (None when it names none)."""
    try:
        st = os.lstat(folder.process)
        if not stat.S_ISREG(st.st_mode) or st.st_size > PROCESS_MAX_BYTES:
            return None
        data = json.loads(folder.process.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    host = data.get("host") if isinstance(data, dict) else None
    return re.sub(r"[^A-Za-z0-9._-]", "_", host)[:64] if isinstance(host, str) else None


def marker_path(out: Path, host: str) -> Path:
    """This host's marker: ``record.json`` when this host began the record (or it is not
    begun), else ``record-{host}.json``."""
    first = read_marker(out)
    if not first or first.get("host", host) == host:
        return out / MARKER
    return out / f"{HOST_MARKER_PREFIX}{host}.json"


def _hosts_of(out: Path) -> set[str]:
    """The hosts that have recorded into ``out``: its markers' and its rank folders'."""
    hosts = {str(read_marker(out).get("host"))}
    for name in os.listdir(out):
        if _HOST_MARKER.match(name):
            hosts.add(name[len(HOST_MARKER_PREFIX) : -len(".json")])
    return hosts


def _mine(out: Path, host: str) -> list[RankFolder]:
    """The rank folders this host wrote (a folder that names no host is the first host's)."""
    first = str(read_marker(out).get("host", host))
    return [r for r in rank_folders(out, links="skip") if (folder_host(r) or first) == host]


def prepare(out: Path, command: tuple[str, ...], options: dict[str, Any], overwrite: bool) -> None:
    """Make ``out`` ready for this host's record, before the command starts: refused when this
    host's ranks in it hold a snapshot (unless ``overwrite``, which clears only those), when it
    holds anything else than a record, or cannot be written. Another host's record in it is
    joined (a job on several hosts writing to one shared folder); a record with nothing
    recorded is replaced without a word."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        what = "a symbolic link" if out.is_symlink() else "a file"
        raise InputError(f"-o {out}: is {what}, not a folder; name a folder for the record")
    host = this_host()
    if is_record(out):
        mine = _mine(out, host)
        if any(r.snapshot is not None for r in mine) and not overwrite:
            raise InputError(
                f"-o {out}: already holds a record of this host; pass --overwrite to replace it,"
                " or name another folder"
            )
        clear(out, mine, host)
    elif out.is_dir() and any(out.iterdir()):
        raise InputError(
            f"-o {out}: the folder is not empty and holds no record; name a new or empty folder"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_marker(marker_path(out, host), {
            "schema": RECORD_SCHEMA,
            "host": host,
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


def clear(out: Path, folders: list[RankFolder], host: str) -> None:
    """Remove what this host's record wrote in ``out`` (``folders``, its marker), and a link
    at any name a record uses (removed, never followed); nothing of another host's."""
    for folder in folders:
        shutil.rmtree(folder.path)
    for name in os.listdir(out):
        path = out / name
        if path.is_symlink() and (_RANK_FOLDER.match(name) or _HOST_MARKER.match(name)
                                  or name in (MARKER, PROCESSES)):  # fmt: skip
            path.unlink()
    only_host = _hosts_of(out) <= {host, "None"}
    if only_host:
        for name in (MARKER, PROCESSES):
            with contextlib.suppress(FileNotFoundError):
                (out / name).unlink()
    else:
        with contextlib.suppress(FileNotFoundError):
            marker_path(out, host).unlink()


def write_marker(path: Path, marker: dict[str, Any]) -> None:
    """A marker written as every report is (a temporary name, no link followed, renamed)."""
    destinations.write_text(path, json.dumps(marker, indent=1) + "\n", "-o")


def read_marker(out: Path, name: str = MARKER) -> dict[str, Any]:
    """``record.json`` (or another host's ``name``), or an empty dict when it is missing, a
    link, or not a record's."""
    path = out / name
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MARKER_MAX_BYTES:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {}
    return data if isinstance(data, dict) and data.get("schema") == RECORD_SCHEMA else {}


def update_marker(out: Path, **changes: Any) -> None:
    """This host's marker with ``changes`` (how the command ended)."""
    path = marker_path(out, this_host())
    marker = read_marker(out, path.name)
    if marker:
        try:
            write_marker(path, {**marker, **changes})
        except (OSError, InputError):
            pass  # the record stays readable without its end time


def process_events(out: Path) -> list[dict[str, Any]]:
    """``processes.jsonl``: each Python process of the command and how far it got."""
    events: list[dict[str, Any]] = []
    if (out / PROCESSES).is_symlink():
        return events
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


LINES_MAX = 2_000_000  # a timeline of a week at one sample a second


def json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a rank's ``.jsonl`` file (its timeline, ratings, alerts, steps),
    within its first ``LINES_MAX`` lines: a line that is not one is skipped (a rank killed
    mid-line leaves a partial last line), and a file that cannot be read holds none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f):
                if n >= LINES_MAX:
                    return
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    yield record
    except OSError:
        return

"""Which files make up a job, and the rank of each.

Arguments are files, folders (their traces and snapshots, not recursive), shell-style globs
(``runs/*.nsys-rep``) or the very name given to ``nsys profile -o`` (``rank%q{RANK}``: each
``%q{VAR}`` matches what nsys put there). A rank comes from the file name — ``rank3``,
``rank_3``, ``_3.`` before the suffix, or a name that is only the number — else from the
input's position in the list; ``--rank-pattern REGEX`` reads it from the path instead.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from nsysfrag.errors import InputError
from nsysfrag.inputs.nsys import REPORT_SUFFIXES
from nsysfrag.inputs.torch_snapshot.reader import SNAPSHOT_SUFFIXES
from nsysfrag.limits import MAX_RANK

INPUT_SUFFIXES = (".sqlite", *REPORT_SUFFIXES, *SNAPSHOT_SUFFIXES)
# Tried in order on the file name; the first that matches gives the rank.
_NAME_RANKS = (
    re.compile(r"rank[_-]?(\d+)", re.IGNORECASE),
    # The number right before the one suffix: "snapshot_3.pickle", not "model_1.3b.pickle".
    re.compile(r"_(\d+)\.[A-Za-z][\w-]*$"),
    re.compile(r"^(\d+)\.[A-Za-z][\w-]*$"),
)
_NSYS_VARIABLE = re.compile(r"%q\{([^}]*)\}|%[phn%]")


@dataclass(frozen=True, slots=True)
class RankInput:
    """One rank of the job and the input that holds it, as the user named it."""

    rank: int
    path: Path
    rank_from: str  # "name", "pattern" or "position": said in the duplicate-rank error


def is_job(arguments: Sequence[Path]) -> bool:
    """More than one input, or one argument that names several: a folder, a glob, a pattern."""
    if len(arguments) != 1:
        return True
    text = str(arguments[0])
    if os.path.isdir(text):
        return True
    if os.path.lexists(text):
        return False
    return glob.has_magic(text) or _NSYS_VARIABLE.search(text) is not None


def job_inputs(arguments: Sequence[Path], rank_pattern: str | None = None) -> list[RankInput]:
    """Every input of the job, ranked and sorted by rank; InputError when two share a rank."""
    pattern = _compile(rank_pattern) if rank_pattern is not None else None
    paths: list[tuple[Path, int | None]] = []
    seen: set[str] = set()
    for argument in arguments:
        for path, rank in _expand(argument):
            key = os.path.realpath(path)
            if key not in seen:  # a file named twice (a folder and a glob) is one input
                seen.add(key)
                paths.append((path, rank))
    ranked = []
    for position, (path, rank) in enumerate(paths):
        if pattern is not None:
            ranked.append(RankInput(_rank_by_pattern(path, pattern, rank_pattern or ""), path, "pattern"))
        elif rank is not None:
            ranked.append(RankInput(rank, path, "name"))
        else:
            named = rank_from_name(path.name)
            if named is not None:
                ranked.append(RankInput(named, path, "name"))
            else:
                ranked.append(RankInput(position, path, "position"))
    for r in ranked:
        if r.rank > MAX_RANK:
            raise InputError(
                f"{r.path}: rank {r.rank} (from its {r.rank_from}) is larger than any job has"
                f" (at most {MAX_RANK:,}); name the file by its rank, or pass --rank-pattern"
                " REGEX whose group reads the rank from the path"
            )
    ranked.sort(key=lambda r: r.rank)
    for a, b in pairwise(ranked):
        if a.rank == b.rank:
            raise InputError(
                f"rank {a.rank} twice: {a.path} (from its {a.rank_from}) and {b.path} (from its"
                f" {b.rank_from}); give each rank one input, or pass --rank-pattern REGEX whose"
                " group reads the rank from the path"
            )
    return ranked


def rank_from_name(name: str) -> int | None:
    """``rank3.sqlite``, ``rank_3``, ``snapshot_3.pickle``, ``3.nsys-rep`` -> 3; else None."""
    for regex in _NAME_RANKS:
        m = regex.search(name)
        if m:
            return int(m.group(1))
    return None


def _compile(rank_pattern: str) -> re.Pattern[str]:
    try:
        pattern = re.compile(rank_pattern)
    except re.error as err:
        raise InputError(f"--rank-pattern {rank_pattern!r}: not a regular expression ({err})") from None
    if pattern.groups != 1 and "rank" not in pattern.groupindex:
        raise InputError(
            f"--rank-pattern {rank_pattern!r}: needs one group that captures the rank (or a group"
            r" named rank), e.g. 'node\d+_gpu(\d+)'"
        )
    return pattern


def _rank_by_pattern(path: Path, pattern: re.Pattern[str], text: str) -> int:
    m = pattern.search(str(path))
    group = "rank" if "rank" in pattern.groupindex else 1
    if m is None or m.group(group) is None:
        raise InputError(
            f"{path}: --rank-pattern {text!r} does not match this path; write a pattern that every"
            " input's path matches"
        )
    try:
        return int(m.group(group))
    except ValueError:
        raise InputError(
            f"{path}: --rank-pattern {text!r} captured {m.group(group)!r}, not a rank number;"
            r" capture only the digits, e.g. (\d+)"
        ) from None


def _expand(argument: Path) -> list[tuple[Path, int | None]]:
    """The inputs one argument names, in order, with the rank a ``%q{VAR}`` pattern gave."""
    text = str(argument)
    if os.path.isdir(text):
        from nsysfrag.record.layout import is_record

        if is_record(text):
            return _record_inputs(Path(text))
        found = _traces_in([Path(text, name) for name in sorted(os.listdir(text))])
        if not found:
            raise InputError(
                f"{text}: no traces or snapshots in this folder ({', '.join(INPUT_SUFFIXES)});"
                " pass the files, or a folder that holds them"
            )
        return [(p, None) for p in found]
    if os.path.lexists(text):
        return [(argument, None)]
    if _NSYS_VARIABLE.search(text):
        return _expand_nsys_name(text)
    if glob.has_magic(text):
        matches = [Path(m) for m in sorted(glob.glob(text)) if not os.path.isdir(m)]
        found = _traces_in(matches, keep_unknown=True)
        if not found:
            raise InputError(f"{text}: matches no file; check the pattern (quote it for the shell)")
        return [(p, None) for p in found]
    raise InputError(f"{text}: no such file; pass traces (.sqlite, .nsys-rep), snapshots, folders or globs")


def _record_inputs(folder: Path) -> list[tuple[Path, int | None]]:
    """A record folder (``nsysfrag record``): each rank's snapshot, ranked by its folder."""
    from nsysfrag.record.layout import job_inputs as record_inputs

    inputs, _ = record_inputs(folder)
    if not inputs:
        raise InputError(
            f"{folder}: the record holds no snapshot (no process of its command used CUDA, or"
            " each died before writing one); see its processes.jsonl"
        )
    return [(path, rank) for path, rank in inputs]


def _expand_nsys_name(text: str) -> list[tuple[Path, int | None]]:
    """``runs/rank%q{RANK}`` -> every ``runs/rank<N>.<suffix>``, ranked by the ``%q{RANK}`` part."""
    folder, name = os.path.split(text)
    variables = [m.group(1) for m in _NSYS_VARIABLE.finditer(name) if m.group(1) is not None]
    ranked = [i for i, v in enumerate(variables) if _is_global_rank(v)]
    if len(variables) > 1 and len(ranked) != 1:
        raise InputError(
            f"{text}: cannot tell which %q{{…}} is the rank (RANK, OMPI_COMM_WORLD_RANK,"
            " SLURM_PROCID, …); pass the files with --rank-pattern REGEX"
        )
    rank_index = ranked[0] if ranked else 0
    parts, index = [], 0
    for piece in re.split(r"(%q\{[^}]*\}|%[phn%])", name):
        if piece.startswith("%q{"):
            parts.append(r"(\d+)" if index == rank_index else r"[^/]*?")
            index += 1
        elif piece == "%%":
            parts.append("%")
        elif piece in ("%p", "%h", "%n"):
            parts.append(r"[^/]*?")
        else:
            parts.append(re.escape(piece))
    stem = "".join(parts)
    suffixes = "|".join(re.escape(s) for s in INPUT_SUFFIXES)
    # nsys adds the suffix to -o's name; a pattern that already names one keeps it.
    regex = re.compile(stem + ("" if name.endswith(INPUT_SUFFIXES) else f"(?:{suffixes})") + "$")
    listing = sorted(os.listdir(folder or ".")) if os.path.isdir(folder or ".") else []
    found = _traces_in([Path(folder, n) for n in listing if regex.fullmatch(n)], keep_unknown=True)
    if not found:
        raise InputError(f"{text}: no file matches this nsys output name; check the folder and the name")
    out = []
    for path in found:
        m = regex.fullmatch(path.name)
        assert m is not None
        out.append((path, int(m.group(1)) if variables else None))
    return out


def _is_global_rank(variable: str) -> bool:
    """RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID; not LOCAL_RANK or NODE_RANK."""
    name = variable.upper()
    return name == "SLURM_PROCID" or ("RANK" in name and "LOCAL" not in name and "NODE" not in name)


def _traces_in(paths: list[Path], keep_unknown: bool = False) -> list[Path]:
    """The inputs among ``paths``: ``X.sqlite`` (or ``X.nsysfrag.sqlite``) beside ``X.nsys-rep``
    is that report's export, so the report stands for both (it reuses the export)."""
    names = {p.name for p in paths}
    out = []
    for path in paths:
        name = path.name
        if not keep_unknown and not name.endswith(INPUT_SUFFIXES):
            continue
        if name.endswith(".sqlite"):
            stem = name[: -len(".nsysfrag.sqlite")] if name.endswith(".nsysfrag.sqlite") else name[: -len(".sqlite")]
            if any(stem + s in names for s in REPORT_SUFFIXES):
                continue
        out.append(path)
    return out

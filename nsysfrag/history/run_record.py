"""What one run is as the history stores it: the record made from an analyze JSON document
(its trace's hash, its spaces' values by column and its other numeric keys), and the tags it
carries. No database here: ``store`` writes these records and reads them back."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from nsysfrag.checks.keys import numeric_keys
from nsysfrag.errors import InputError
from nsysfrag.history.schema import OPTIONAL_FIELDS, SPACE_FIELDS
from nsysfrag.inputs.files import display_path
from nsysfrag.limits import MAX_RANK
from nsysfrag.models.observed import MODEL_NAME
from nsysfrag.reporters.json_report import SCHEMA

_HASH_CHUNK = 1 << 20


def parse_tags(texts: Sequence[str], option: str = "--tag") -> tuple[tuple[str, str], ...]:
    """``["model=llama-8b", "gpu=h100"]`` -> ``(("gpu", "h100"), ("model", "llama-8b"))``."""
    tags: dict[str, str] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise InputError(f"{option} {text!r}: write KEY=VALUE, e.g. {option} model=llama-8b")
        if key in tags and tags[key] != value:
            raise InputError(
                f"{option} {key}=…: given twice ({tags[key]!r} and {value!r}); keep one"
            )
        tags[key] = value
    return tuple(sorted(tags.items()))


# ---------------------------------------------------------------- what is stored


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One analysed run, ready to store: the trace, how it was analysed, and its spaces."""

    trace_path: str
    trace_sha256: str
    model: str
    granularity_bytes: int
    spaces: tuple[Mapping[str, Any], ...]  # values by SPACE_FIELDS path
    capacity_override_bytes: int | None = None
    nsys_version: str | None = None
    label: str | None = None
    tags: tuple[tuple[str, str], ...] = ()
    host: str | None = None
    recorded_at: datetime | None = None  # None: now
    rank: int | None = None  # the rank of a distributed job's input (analyze with several)
    # Per space (as ``spaces``): its other numeric keys by dotted path (checks.keys).
    values: tuple[Mapping[str, float], ...] = ()

    @classmethod
    def from_document(
        cls,
        document: Mapping[str, Any],
        trace_path: Path,
        *,
        label: str | None = None,
        tags: Sequence[tuple[str, str]] = (),
        capacity_override_bytes: int | None = None,
        rank: int | None = None,
    ) -> RunRecord:
        """A record of an analyze JSON document (``nsysfrag analyze --json``) of ``trace_path``."""
        if document.get("schema") != SCHEMA or not isinstance(document.get("spaces"), list):
            raise InputError(f"not an nsysfrag analysis (schema {SCHEMA}); nothing recorded")
        model = document.get("model", {})
        if rank is not None and not 0 <= rank <= MAX_RANK:
            raise InputError(f"rank {rank}: not a rank number (0 to {MAX_RANK:,}); nothing recorded")
        return cls(
            trace_path=display_path(Path(trace_path).resolve()),  # text, as reports write it
            trace_sha256=sha256_file(trace_path),
            model=str(model.get("name", "observed")),
            granularity_bytes=int(model["granularity_bytes"]),
            capacity_override_bytes=capacity_override_bytes,
            nsys_version=document.get("trace", {}).get("nsys_version"),
            label=label,
            tags=tuple(tags),
            host=socket.gethostname(),
            spaces=tuple(flatten_space(s) for s in document["spaces"]),
            rank=rank,
            values=tuple(space_values(s) for s in document["spaces"]),
        )


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
    except OSError as err:
        raise InputError(f"{path}: cannot read the trace to record it ({err.strerror})") from None
    return digest.hexdigest()


def flatten_space(space: Mapping[str, Any]) -> dict[str, Any]:
    """An analyze JSON space as ``{"peak.global_frag": 0.31, …}`` over SPACE_FIELDS."""
    values: dict[str, Any] = {}
    for f in SPACE_FIELDS:
        node: Any = space
        for part in f.path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                if f.path == "model":  # JSON documents before models had names
                    node = MODEL_NAME
                    break
                if f.path in OPTIONAL_FIELDS:
                    node = None
                    break
                raise InputError(
                    f"the analysis document has no {f.path!r} in a space; re-run"
                    " `nsysfrag analyze` with this version to record it"
                )
            node = node[part]
        values[f.path] = node
    return values


def space_values(space: Mapping[str, Any]) -> dict[str, float]:
    """The numeric keys of an analyze JSON space that run_spaces has no column for."""
    columns = {f.path for f in SPACE_FIELDS}
    return {k: v for k, v in numeric_keys(space).items() if k not in columns}

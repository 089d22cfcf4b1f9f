"""The record's ``processes.jsonl``: a line per process of the command and per step it reached
(started, torch imported, CUDA initialized, its folder, an error), which ``nsysfrag record``
reads to say why nothing was recorded. Every Python process of the command writes here at
start-up, before it does anything else.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .names import PROCESSES

_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)


def log_process(out_dir: str, event: str, **fields: Any) -> None:
    """A line in the record's ``processes.jsonl``: which processes got how far (what
    ``nsysfrag record`` says when nothing was recorded)."""
    record = {"event": event, "pid": os.getpid(), "time_unix_ns": time.time_ns(), **fields}
    if event == "python":
        import sys

        record["argv"] = [str(a)[:200] for a in getattr(sys, "argv", [])[:8]]
    line = (_json(record) + "\n").encode()
    try:
        # Never through a link planted at the name (files.append_bytes; not imported: json).
        fd = os.open(os.path.join(out_dir, PROCESSES), _APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass  # a record folder that vanished: nothing to tell


# JSON for the processes log without the json module (and the re it imports): every Python
# process of the command writes a line at start-up, and most of them never use CUDA.
_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord("\\"): "\\\\", ord('"'): '\\"'})


def _json(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.translate(_ESCAPES) + '"'
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_json(str(k))}: {_json(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_json(v) for v in value) + "]"
    return _json(str(value))

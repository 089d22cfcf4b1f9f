"""What kind of nsys file a path names, before anything reads it (the package and
``export_file`` both ask; kept apart so that neither looks up at the other)."""

from __future__ import annotations

from pathlib import Path

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
TRACE_FILE = "pass a trace file (.sqlite or .nsys-rep)"  # what to pass instead of a folder


def is_report(path: Path) -> bool:
    """True for an nsys report (``.nsys-rep``, or ``.qdrep`` from nsys before 2021.4)."""
    return path.name.lower().endswith(REPORT_SUFFIXES)

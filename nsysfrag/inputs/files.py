"""The checks every input file passes before it is opened: one line per problem that says what
to pass instead."""

from __future__ import annotations

import os
from pathlib import Path

from nsysfrag.errors import InputError


def check_input_file(path: Path, *, expected: str, directory: str, empty: str | None = None) -> None:
    """Raise :class:`InputError` unless ``path`` is a readable file (and, with ``empty``, a
    non-empty one). ``expected`` says what to pass when the file is missing, ``directory``
    when it is a folder, ``empty`` how to get a whole file."""
    if not path.exists():
        raise InputError(f"{path}: no such file; {expected}")
    if path.is_dir():
        raise InputError(f"{path}: is a directory; {directory}")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: permission denied; make the file readable")
    if empty is not None and path.stat().st_size == 0:
        raise InputError(f"{path}: the file is empty; {empty}")

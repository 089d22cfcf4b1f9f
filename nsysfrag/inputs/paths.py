"""The check every input path passes before anything opens it.

Opening a FIFO for reading blocks until some other program writes to it, and a character device
such as ``/dev/zero`` never ends: a CI job given one would hang. Readers also read their input
more than once (a header, then the file), which only a regular file supports. So anything but a
regular file (or a directory or missing file, which each reader explains in its own words) is
refused here, from ``stat`` alone, before any ``open``.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from nsysfrag.errors import InputError

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_regular_file(path: Path) -> None:
    """Raise :class:`InputError` for a path that cannot be read as an ordinary file."""
    st = _stat(path, "pass the path of an existing file")
    if st is None:
        return  # the reader says which file it expected
    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
        return
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
    raise InputError(
        f"{path}: is {kind}, not a regular file; nsysfrag reads its input more than once, so"
        " save the data to a file and pass that"
    )


def check_output_path(path: Path) -> None:
    """Raise :class:`InputError` for an output path the file system cannot even look up (a
    name over 255 bytes, say), before any work; whether it can be written is found out later."""
    _stat(path, "choose a shorter one")


def _stat(path: Path, fix: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        if err.errno == errno.ENAMETOOLONG:
            raise InputError(
                f"{path}: the name is too long for the file system (at most 255 bytes per"
                f" name); {fix}"
            ) from None
        raise InputError(f"{path}: cannot be used ({err.strerror}); {fix}") from None


def display_path(path: Path | str) -> str:
    """``path`` as reports write it: a name that is not valid UTF-8 (Python keeps its bytes as
    lone surrogates, which no UTF-8 output can encode) shows those bytes as ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")

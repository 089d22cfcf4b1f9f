"""The checks every input file passes before it is opened: one line per problem that says what
to pass instead.

Opening a FIFO for reading blocks until some other program writes to it, and a character device
such as ``/dev/zero`` never ends: a CI job given one would hang. Readers also read their input
more than once (a header, then the file), which only a regular file supports. So anything but a
regular file is refused from ``stat`` alone, before any ``open``.
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


def check_input_file(path: Path, *, expected: str, directory: str, empty: str | None = None) -> None:
    """Raise :class:`InputError` unless ``path`` is a readable regular file (and, with
    ``empty``, a non-empty one). ``expected`` says what to pass when the file is missing,
    ``directory`` when it is a folder, ``empty`` how to get a whole file."""
    st = stat_path(path, "pass the path of an existing file")
    if st is None:
        raise InputError(f"{path}: no such file; {expected}")
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: is a directory; {directory}")
    _refuse_special(path, st)
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: permission denied; make the file readable")
    if empty is not None and st.st_size == 0:
        raise InputError(f"{path}: the file is empty; {empty}")


def check_regular_file(path: Path) -> None:
    """The part of :func:`check_input_file` a command runs before it knows the input's format
    (recognising a format may read the file's first bytes): refuse a FIFO, a device or a
    socket. A missing file or a folder passes, for the reader to explain in its own words."""
    st = stat_path(path, "pass the path of an existing file")
    if st is not None:
        _refuse_special(path, st)


def present_bytes(path: Path | str) -> int:
    """The bytes really in the file: its size, or less when it is sparse (a hole of a
    terabyte at its end holds no data, and no limit keyed on the size may count it). The
    blocks the file system allocated, where it says (``st_blocks``)."""
    st = os.stat(path)
    blocks = getattr(st, "st_blocks", None)
    return st.st_size if blocks is None else min(st.st_size, blocks * 512)


def display_path(path: Path | str) -> str:
    """``path`` as reports write it: a name that is not valid UTF-8 (Python keeps its bytes as
    lone surrogates, which no UTF-8 output can encode) shows those bytes as ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _refuse_special(path: Path, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
        return
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
    raise InputError(
        f"{path}: is {kind}, not a regular file; nsysfrag reads its input more than once, so"
        " save the data to a file and pass that"
    )


def stat_path(path: Path, fix: str) -> os.stat_result | None:
    """``os.stat(path)``, None when nothing is there; :class:`InputError` (ending in ``fix``)
    when the file system refuses to look the name up at all (a name over 255 bytes, say)."""
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

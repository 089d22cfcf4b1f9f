"""Writing a rank's files so that a reader never finds half of one, and saying a failure once.

A snapshot or facts file is written beside its name and renamed into place, so a rank that
dies (or a disk that fills) mid-write leaves the previous file or none, never a truncated one;
timeline lines are appended one ``write`` each. A failure to write is one warning line: the
program never sees an exception from here.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Callable  # noqa: UP035  (the program may run Python 3.8)

from .stderr import warn

_said_lock = threading.Lock()


class Folder:
    """One rank's folder: atomic files, appended lines, and the first write failure kept."""

    def __init__(self, path: str, who: str) -> None:
        self.path = path
        self.who = who  # "rank 1 (pid 4242)": how warnings name the process
        self.failure: str | None = None  # the first write that failed, in words

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    def append_line(self, name: str, record: dict[str, Any]) -> bool:
        line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
        try:
            fd = os.open(self.join(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                written = os.write(fd, line)
            finally:
                os.close(fd)
            if written != len(line):
                raise OSError(28, "short write")  # ENOSPC: what a partial append means
        except OSError as err:
            self._failed(name, err)
            return False
        return True

    def write_json(self, name: str, record: dict[str, Any]) -> bool:
        data = json.dumps(record, indent=1, sort_keys=True).encode()
        return self.write_atomic(name, lambda f: f.write(data))

    def write_atomic(self, name: str, write: Callable[[Any], object]) -> bool:
        """``write(file)`` into a temporary file beside ``name``, then rename it into place."""
        final = self.join(name)
        temporary = self.join(f".{name}.{os.getpid()}.part")
        try:
            with open(temporary, "wb") as f:
                write(f)
            os.replace(temporary, final)
        except OSError as err:
            _remove(temporary)
            self._failed(name, err)
            return False
        except BaseException:
            _remove(temporary)
            raise
        return True

    def write_with(self, name: str, dump: Callable[[str], object]) -> bool:
        """``dump(path)`` (a function that writes a file by name, such as torch's
        ``_dump_snapshot``) into a temporary name, then renamed into place."""
        final = self.join(name)
        temporary = self.join(f".{name}.{os.getpid()}.part")
        try:
            dump(temporary)
            os.replace(temporary, final)
        except OSError as err:
            _remove(temporary)
            self._failed(name, err)
            return False
        except BaseException:
            _remove(temporary)
            raise
        return True

    def remove(self, name: str) -> None:
        _remove(self.join(name))

    def _failed(self, name: str, err: OSError) -> None:
        what = f"cannot write {self.join(name)} ({err.strerror or err})"
        with _said_lock:
            first = self.failure is None
            if first:
                self.failure = what
        if first:
            warn(f"{self.who}: {what}; nothing more is sampled, the program runs on")


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

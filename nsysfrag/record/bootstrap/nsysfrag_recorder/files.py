"""Writing a rank's files so that a reader never finds half of one, and saying a failure once.

A snapshot or facts file is written beside its name and renamed into place, so a rank that
dies (or a disk that fills) mid-write leaves the previous file or none, never a truncated one;
timeline lines are appended one ``write`` each. A failure to write is one warning line: the
program never sees an exception from here.

No link is ever followed: a record folder may be shared (a job's file system, a copied record,
a co-tenant of /tmp), and a link planted at one of its names would send the write elsewhere.
Every file is created with ``O_NOFOLLOW`` (a temporary one also ``O_EXCL`` under a random
name), torch's ``_dump_snapshot``, which opens its file by name itself, writes into a private
folder of ours, and a rename replaces a link at the final name instead of writing through it.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Callable  # noqa: UP035  (the program may run Python 3.8)

from .stderr import warn

_said_lock = threading.Lock()
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW
CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW


def append_bytes(path: str, data: bytes) -> int:
    """Append ``data`` to ``path`` in one write (created if missing, never through a link)."""
    fd = os.open(path, APPEND, 0o644)
    try:
        return os.write(fd, data)
    finally:
        os.close(fd)


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
            written = append_bytes(self.join(name), line)
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
        temporary = self.join(f".{name}.{os.urandom(8).hex()}.part")
        try:
            with os.fdopen(os.open(temporary, CREATE, 0o644), "wb") as f:
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
        ``_dump_snapshot``, with a plain ``open``) into a private folder of ours (mode 0700:
        no one else can plant a link in it), then renamed into place."""
        final = self.join(name)
        # os.mkdir, not tempfile: this runs at exit too, and importing tempfile there after an
        # unhandled Ctrl-C made the process exit 1 instead of by SIGINT (test_record_cases).
        private = self.join(f".{name}.{os.urandom(8).hex()}.part")
        temporary = os.path.join(private, name)
        try:
            os.mkdir(private, 0o700)
            dump(temporary)
            os.replace(temporary, final)
        except OSError as err:
            self._failed(name, err)
            return False
        finally:
            _remove(temporary)
            try:
                os.rmdir(private)
            except OSError:
                pass
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

"""Where nsysfrag writes a file: one check at the moment it is opened, then an atomic rename.

Every file nsysfrag writes (a report, each figure in a ``--png`` folder, an nsys export or
recording, a new history database) goes through here:

- it is written under a temporary name of its own, created with ``O_CREAT | O_EXCL |
  O_NOFOLLOW`` in the target folder (a file or tool that writes for itself, like nsys, gets a
  private temporary folder there instead), so no link placed in that folder is ever followed
  and no other file is ever opened for writing;
- once complete it is renamed over the name asked for, which replaces that name and never
  writes into what it was: a hard link to the input stays the input;
- just before the rename, and when the run checks its outputs before any work, the name is
  checked against the files the run must never replace (:func:`protect`: its inputs, a
  baseline, the history database) and against every other output of the run, by the folder
  with its links resolved plus the name, and by file identity (device and inode): two paths
  that resolve to one file that does not exist yet are one output;
- a name that is a symbolic link is refused (the link is the user's, and what it points to is
  not this run's to replace); a character device or a FIFO (``/dev/null``, ``/dev/stdout``
  on a pipe) is written as a stream, never replaced;
- a write that fails removes its temporary file or folder, nothing else.

A command starts with :func:`begin_run`; ``cli.main`` calls it, so each run (and each call of
``main`` in one process) has its own files to keep.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from nsysfrag.errors import InputError

Key = tuple[str, str]  # (the folder with its links resolved, the name in it)
Identity = tuple[int, int]  # (st_dev, st_ino)

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
TEMP_PREFIX = ".nsysfrag-"
# The writers that are not an option: what nsys writes for nsysfrag.
NSYS_EXPORT = "the export"
NSYS_RECORDING = "the recording"


@dataclass
class _Run:
    """The files of the current run: those to keep, and the outputs written so far."""

    protected: list[tuple[str, Path, str | None]] = field(default_factory=list)  # + its writer
    written: dict[Key, tuple[str, Identity | None]] = field(default_factory=dict)


_run = _Run()


def begin_run() -> None:
    """Forget the files of an earlier run (one call of ``cli.main``)."""
    global _run
    _run = _Run()


def protect(role: str, path: Path | str, writer: str | None = None) -> None:
    """Never write over ``path`` in this run, except as ``writer`` (the export of an input
    report is written by the export, and then read); ``role`` names it in the refusal ("the
    input trace"). It need not exist yet (the history database, an export still to be made)."""
    entry = (role, Path(path), writer)
    if entry not in _run.protected:
        _run.protected.append(entry)


def key_of(path: Path | str) -> Key:
    """The folder with every link resolved, and the name in it (the name itself not followed)."""
    text = os.fspath(path)
    folder, name = os.path.split(text)
    if name in ("", ".", ".."):  # a folder named by its own path: never a file we write
        return os.path.realpath(text), ""
    return os.path.realpath(folder or "."), name


def _identities(path: Path | str) -> set[Identity]:
    """The file at ``path`` and, for a link, the file it points to."""
    found = set()
    for follow in (False, True):
        try:
            st = os.stat(path, follow_symlinks=follow)
        except (OSError, ValueError):
            continue
        found.add((st.st_dev, st.st_ino))
    return found


def _display(path: Path | str) -> str:
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def refusal(path: Path | str, option: str) -> str | None:
    """Why writing ``path`` for ``option`` would replace a file this run must keep, or None."""
    key, ids = key_of(path), _identities(path)
    for role, kept, writer in _run.protected:
        if writer == option:
            continue
        same_name = key in (key_of(kept), key_of(os.path.realpath(kept)))
        if same_name or ids & _identities(kept):
            shown = "" if Path(path) == kept else f" ({_display(kept)}: the same file)"
            return f"refusing to overwrite {role}{shown}; choose another path"
    for written_key, (other, identity) in _run.written.items():
        if other != option and (written_key == key or (identity is not None and identity in ids)):
            return f"{other} writes this file too; give each output its own path"
    return None


def same_destination(a: Path | str, b: Path | str) -> bool:
    """Whether writing ``a`` and ``b`` would write one file: the same resolved name, or (both
    existing) one file under two names."""
    return key_of(a) == key_of(b) or bool(_identities(a) & _identities(b))


def check(path: Path | str, option: str) -> None:
    """InputError when ``path`` may not be written for ``option`` (see :func:`refusal`), or is
    a folder, a link or something else nsysfrag cannot replace."""
    why = refusal(path, option)
    if why is not None:
        raise InputError(f"{option} {_display(path)}: {why}")
    _kind(path, option)


def _kind(path: Path | str, option: str) -> str:
    """"new", "file" (a regular file, replaced) or "stream" (a device or FIFO, written into)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "new"
    except OSError as err:
        raise _cannot(path, option, err) from None
    if stat.S_ISREG(st.st_mode):
        return "file"
    shown = _display(path)
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.stat(path)
        except OSError:
            target = None
        if target is not None and (stat.S_ISCHR(target.st_mode) or stat.S_ISFIFO(target.st_mode)):
            return "stream"  # /dev/stdout on a pipe or a terminal, bash's >(…)
        raise InputError(
            f"{option} {shown}: is a symbolic link; nsysfrag never writes through a link, so give"
            " the path of the file itself (or '-' for stdout)"
        )
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{option} {shown}: is a folder; give a file name")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return "stream"
    raise InputError(f"{option} {shown}: is not a regular file; give a file name")


def _cannot(path: Path | str, option: str, err: OSError) -> InputError:
    why = err.strerror or type(err).__name__
    return InputError(f"{option} {_display(path)}: cannot write ({why}); choose a writable path")


def _written(path: Path | str, option: str) -> None:
    ids = _identities(path)
    _run.written[key_of(path)] = (option, next(iter(ids)) if ids else None)


class Batch:
    """Files written together: each to a temporary name first, every one renamed into place
    only when all are complete (:func:`writing`)."""

    def __init__(self, option: str) -> None:
        self.option = option
        self._staged: list[tuple[Path, Path, str]] = []  # (temporary, destination, kind)
        self._streams: list[IO[bytes]] = []

    @contextlib.contextmanager
    def open(self, path: Path | str, *, binary: bool = False) -> Iterator[IO[str] | IO[bytes]]:
        """``path`` opened for writing (text: UTF-8, newlines as written)."""
        path = Path(path)
        check(path, self.option)
        kind = _kind(path, self.option)
        if kind == "stream":
            handle = self._open_stream(path)
            with handle if binary else _text(handle) as f:
                yield f
            return
        temporary = path.with_name(f"{TEMP_PREFIX}{secrets.token_hex(8)}.part")
        mode = 0o666
        if kind == "file":
            with contextlib.suppress(OSError):
                mode = stat.S_IMODE(os.stat(path).st_mode)  # a replaced report keeps its mode
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
                         0o666)  # fmt: skip
        except OSError as err:
            raise _cannot(path, self.option, err) from None
        self._staged.append((temporary, path, kind))
        if kind == "file":
            with contextlib.suppress(OSError):
                os.chmod(fd, mode)
        raw = os.fdopen(fd, "wb")
        with raw if binary else _text(raw) as f:
            yield f

    def _open_stream(self, path: Path) -> IO[bytes]:
        # A FIFO nobody reads would block the open: non-blocking, it fails at once instead.
        try:
            fd = os.open(path, os.O_WRONLY | _NOCTTY | _CLOEXEC | _NONBLOCK)
            os.set_blocking(fd, True)
        except OSError as err:
            if err.errno == errno.ENXIO:
                raise InputError(
                    f"{self.option} {_display(path)}: a FIFO that no program is reading; start"
                    " the reader first, or give a file name"
                ) from None
            raise _cannot(path, self.option, err) from None
        stream = os.fdopen(fd, "wb")
        self._streams.append(stream)
        return stream

    def commit(self) -> None:
        """Rename every staged file into place, each checked once more just before."""
        staged, self._staged = self._staged, []
        for done, (temporary, path, _) in enumerate(staged):
            try:
                check(path, self.option)
                os.replace(temporary, path)
            except OSError as err:
                self._discard(staged[done:])
                raise _cannot(path, self.option, err) from None
            except BaseException:
                self._discard(staged[done:])
                raise
            _written(path, self.option)

    def discard(self) -> None:
        staged, self._staged = self._staged, []
        self._discard(staged)

    @staticmethod
    def _discard(staged: list[tuple[Path, Path, str]]) -> None:
        for temporary, _, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _text(raw: IO[bytes]) -> IO[str]:
    import io

    return io.TextIOWrapper(raw, encoding="utf-8", newline="")  # type: ignore[arg-type]


@contextlib.contextmanager
def writing(option: str) -> Iterator[Batch]:
    """A :class:`Batch` whose files land together when the block ends, none if it fails; an
    OSError while writing becomes one line naming ``option``."""
    batch = Batch(option)
    try:
        yield batch
    except OSError as err:
        batch.discard()
        raise InputError(
            f"{option}: cannot write ({err.strerror or type(err).__name__}); choose a writable"
            " path"
        ) from None
    except BaseException:
        batch.discard()
        raise
    batch.commit()


def write_bytes(path: Path | str, data: bytes, option: str) -> None:
    with writing(option) as batch, batch.open(path, binary=True) as f:
        f.write(data)  # type: ignore[arg-type]


def write_text(path: Path | str, text: str, option: str) -> None:
    with writing(option) as batch, batch.open(path) as f:
        f.write(text)  # type: ignore[arg-type]


@contextlib.contextmanager
def folder_batch(path: Path | str, option: str) -> Iterator[tuple[Path, Batch]]:
    """The folder an output fills (``--png DIR``), created when missing, and
    the :class:`Batch` its files are written in; a failure leaves no file, and no folder this
    run created."""
    path = Path(path)
    why = refusal(path, option)
    if why is not None:
        raise InputError(f"{option} {_display(path)}: {why}")
    created = False
    try:
        # The command line checked the parent exists (pipeline.outputs); a library caller
        # may name a new one.
        os.makedirs(path.parent, exist_ok=True)
        os.mkdir(path)
        created = True
    except FileExistsError:
        if not path.is_dir():
            raise InputError(
                f"{option} {_display(path)}: not a folder; {option} takes a folder"
            ) from None
    except OSError as err:
        raise _cannot(path, option, err) from None
    try:
        with writing(option) as batch:
            yield path, batch
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(path)  # only when empty: nothing else's files go with it
        raise


@contextlib.contextmanager
def staging_folder(near: Path | str, option: str) -> Iterator[Path]:
    """A private folder beside ``near`` (same file system, so :func:`place` is a rename) for a
    program that writes its own files, removed with what is left in it when the block ends."""
    import tempfile

    folder = Path(near).parent
    try:
        staging = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=folder))
    except OSError as err:
        raise _cannot(near, option, err) from None
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def place(staged: Path, path: Path | str, option: str) -> None:
    """Rename the file a program wrote into a staging folder onto ``path``, checked first."""
    check(path, option)
    if _kind(path, option) == "stream":
        raise InputError(f"{option} {_display(path)}: is not a regular file; give a file name")
    try:
        os.replace(staged, path)
    except OSError as err:
        raise _cannot(path, option, err) from None
    _written(path, option)


def create_empty(path: Path | str, option: str) -> bool:
    """Create ``path`` as an empty file unless something is there; True when this run made it.
    ``O_EXCL | O_NOFOLLOW``: a dangling link there is never followed into a new file."""
    check(path, option)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666)
    except FileExistsError:
        return False
    except OSError as err:
        raise _cannot(path, option, err) from None
    os.close(fd)
    _written(path, option)
    return True

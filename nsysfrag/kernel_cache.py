"""Where numba keeps nsysfrag's compiled kernels: the user's cache folder, never the package.

numba's default puts its cache in a ``__pycache__`` folder beside the source, i.e. inside the
installed package. pip does not know those files, so uninstalling leaves
``site-packages/nsysfrag/`` behind as a folder of cache files, which then shadows the next
(editable) install as an empty namespace package: ``cannot import name '__version__'``. So
every kernel module calls :func:`install` before defining its kernels, and their cache goes to

- ``$XDG_CACHE_HOME/nsysfrag`` (an absolute path), else the platform's cache folder
  (``~/.cache/nsysfrag``, ``~/Library/Caches/nsysfrag``, ``%LOCALAPPDATA%\\nsysfrag\\Cache``);
- a folder of the user's in the temporary directory when that one cannot be written.

numba keys each entry by the source file's path and contents, so two installs never share one
by mistake and a reinstall compiles afresh. But only by the kernel's own file, while a kernel
compiles in what it calls from other files (the treap's queries, the heap's steps): after one of
those alone changed, numba would load the old machine code. So the folder holds a subfolder per
state of all the kernel-bearing sources together (:func:`sources_key`), and a change to any of
them compiles every kernel afresh. A user who set ``NUMBA_CACHE_DIR`` gets numba's own
behaviour: that folder. Compiled code is cached only for nsysfrag's own modules; nothing else
in the process is affected.

Each state of the sources leaves its subfolder behind (every upgrade, every edit of a checkout),
tens of MB each. So the first time a process puts kernels in a subfolder (:func:`note_use`), it
stamps a marker file there, at most once a day, and on that day's stamp removes the sibling
``kernels-*`` subfolders not used for :data:`UNUSED_FOR` seconds: plain ``os`` calls, no numba.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
# A source that names numba or one of the package's compile decorators (jit.njit, kernel_step)
# may hold code a kernel compiles in; one that only mentions them costs a recompile when it
# changes, nothing worse.
_KERNEL_BEARING = (b"numba", b"njit", b"kernel_step")


def sources_key(package: Path = PACKAGE_DIR) -> str:
    """A name for the present contents of the package's kernel-bearing sources, each by path
    within the package: the subfolder of the cache its compiled kernels go to. (os.walk and
    plain reads: a few ms for the whole package, where pathlib's rglob alone took tens.)"""
    sources = sorted(
        os.path.relpath(os.path.join(folder, name), package)
        for folder, _, names in os.walk(package)
        for name in names
        if name.endswith(".py")
    )
    digest = hashlib.sha256()
    for relative in sources:
        with open(os.path.join(package, relative), "rb") as f:
            text = f.read()
        if any(word in text for word in _KERNEL_BEARING):
            digest.update(relative.replace(os.sep, "/").encode() + b"\0")
            digest.update(hashlib.sha256(text).digest())
    return f"kernels-{digest.hexdigest()[:16]}"


# A folder of kernels unused this long is another state of the sources nobody runs any more.
UNUSED_FOR = 30 * 86400
# The marker is stamped at most this often: a run then costs one stat, the sweep once a day.
_STAMP_EVERY = 86400
MARKER = "last-used"
_KEY_NAME = re.compile(r"kernels-[0-9a-f]{16}")


@cache
def current_sources_key() -> str:  # read once a process: the sources do not change under a run
    """:func:`sources_key` of the installed package, the subfolder its kernels are cached in."""
    return sources_key()


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """The user's cache folder for nsysfrag (see the module's docstring)."""
    xdg = environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):  # the XDG spec says to ignore a relative one
        return Path(xdg) / "nsysfrag"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "nsysfrag"
    if sys.platform == "win32" and environ.get("LOCALAPPDATA"):
        return Path(environ["LOCALAPPDATA"]) / "nsysfrag" / "Cache"
    return Path.home() / ".cache" / "nsysfrag"


def fallback_root() -> Path | None:
    """Where kernels go when the user's cache folder cannot be written: a folder of this user's
    in the temporary directory, or None when that name is taken by anyone else (a cache file
    is unpickled when loaded, so no other user may be able to write there)."""
    if not hasattr(os, "getuid"):
        return None
    root = Path(tempfile.gettempdir()) / f"nsysfrag-{os.getuid()}-cache"
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(root)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return root


def _locator_class() -> type[Any]:
    from numba.core import caching

    base = _numba_class(caching, "UserProvidedCacheLocator")

    class UserCacheLocator(base):  # type: ignore[misc, valid-type]
        """nsysfrag's kernels in the user's cache folder (numba's locator protocol)."""

        def __init__(self, py_func: Any, py_file: str, root: Path) -> None:
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            subpath = self.get_suitable_cache_subpath(py_file)
            self._cache_path = str(root / current_sources_key() / subpath)

        def get_cache_path(self) -> str:
            return self._cache_path

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            from numba.core import config

            if vars(config).get("CACHE_DIR") or not _in_package(py_file):
                return None  # numba's own choice: the user's NUMBA_CACHE_DIR, or not ours
            for root in (cache_root(), fallback_root()):
                if root is None:
                    continue
                locator = cls(py_func, py_file, root)
                try:
                    locator.ensure_cache_path()
                except OSError:
                    continue
                note_use(root)
                return locator
            return None

    return UserCacheLocator


def _numba_class(module: object, name: str) -> Any:
    """``name`` from numba's caching module: public since numba 0.61, ``_name`` before."""
    found = vars(module).get(name) or vars(module).get(f"_{name}")
    if found is None:
        raise ImportError(f"numba.core.caching has no {name}; nsysfrag needs numba >= 0.59")
    return found


def _in_package(py_file: str) -> bool:
    try:
        return Path(py_file).resolve().is_relative_to(PACKAGE_DIR)
    except OSError:
        return False


_noted = False


def note_use(root: Path) -> None:
    """The process puts kernels under ``root``: stamp its subfolder, sweep the old ones (see the
    module's docstring); once a process, and never raises: a cache that cannot be stamped or
    swept (read-only, removed under us) just keeps what it has."""
    global _noted
    if _noted:
        return
    _noted = True
    try:
        sweep_unused(root, current_sources_key(), time.time())
    except Exception:  # noqa: BLE001  (housekeeping must not fail the run that uses the cache)
        pass


def sweep_unused(root: Path, key: str, now: float) -> list[str]:
    """Stamp ``root/key``'s marker unless it was stamped within a day; when stamped, remove
    every other ``kernels-*`` folder of ``root`` whose last use (its marker's time, else the
    folder's own, for one made before markers) is over :data:`UNUSED_FOR` seconds before
    ``now``. The names removed; anything else in ``root`` is never touched."""
    marker = os.path.join(root, key, MARKER)
    try:
        if now - os.stat(marker).st_mtime < _STAMP_EVERY:
            return []
    except FileNotFoundError:
        pass
    with open(marker, "a"):
        pass
    os.utime(marker, (now, now))
    removed = []
    with os.scandir(root) as entries:
        siblings = [e for e in entries if e.name != key and _KEY_NAME.fullmatch(e.name)]
    for entry in siblings:
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if now - _last_use(entry.path) > UNUSED_FOR:
                shutil.rmtree(entry.path)
                removed.append(entry.name)
        except OSError:  # gone already, or not ours to remove: the next sweep tries again
            continue
    return removed


def _last_use(folder: str) -> float:
    try:
        return os.stat(os.path.join(folder, MARKER)).st_mtime
    except FileNotFoundError:
        return os.lstat(folder).st_mtime


_installed = False
# numba is imported on whichever thread first needs it (the trace's reading thread loads a kernel
# while the main thread asks the cache about another). Two threads importing numba's package at
# once can each hold a module lock the other waits for: CPython then breaks the deadlock by
# handing one of them a partially initialized module ("cannot import name 'NullCache' from
# partially initialized module 'numba.core.caching'", seen once in the docs' examples). One lock
# around the first import makes it one thread's; later imports find numba whole.
_numba_import = threading.RLock()


def import_numba() -> None:
    """Import numba (once a process, one thread at a time) and put nsysfrag's locator first."""
    with _numba_import:
        importlib.import_module("numba")  # the package whole, before any module of it is named

        install()


def install() -> None:
    """Put nsysfrag's locator first in numba's list, once; call before any ``cache=True``."""
    global _installed
    with _numba_import:
        if _installed:
            return
        from numba.core import caching

        impl = _numba_class(caching, "CacheImpl")
        impl._locator_classes.insert(0, _locator_class())
        _installed = True


def cached(kernel: Any) -> bool:
    """Whether numba's cache holds ``kernel`` compiled from its present source for this
    machine: calling it then loads machine code instead of compiling. It reads the kernel's
    index file only (a few kB, no LLVM): an entry counts when its source hash and its machine
    (target, CPU, features) are this process's own, so an index left by an older install or by
    another machine sharing the home folder does not (numba would compile for those)."""
    cache = getattr(kernel, "_cache", None)
    try:  # numba's internals, behind a blind except: a change there means "not known cached"
        index = cache._cache_file._load_index()  # type: ignore[union-attr]
        wanted = cache._index_key(None, kernel.targetctx.codegen())[1:]  # type: ignore[union-attr]
        return any(tuple(key[1:]) == wanted for key in index)
    except Exception:  # noqa: BLE001
        return False


def writable_root() -> Path | None:
    """The folder the kernels are cached in, made if missing; None when neither can be written."""
    for root in (cache_root(), fallback_root()):
        if root is None:
            continue
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(root, os.W_OK):
            return root
    return None

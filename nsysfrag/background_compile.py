"""Compile, in a detached process, the kernels a run interpreted because none was cached.

A small input runs the kernels' interpreted twins when nothing is cached (nsysfrag.interpreted):
no compile wait, but every later run would interpret again, several times slower than loading
the compiled kernels. So after such a run the command line writes what ran interpreted (each
kernel and its argument types) to a pending file in the kernels' cache folder and starts
``python -m nsysfrag.background_compile``: a process of its own session, with no terminal and
its output discarded, that compiles those kernels into numba's cache and exits. The user waits
for none of it; the next run finds the kernels cached and runs them compiled.

One compiler at a time: it holds a lock on ``compile.lock`` in the cache folder while it works,
and takes every pending file that appears meanwhile; a run that finds the lock held only leaves
its pending file. Nothing starts when ``NSYSFRAG_KERNELS`` forces a way, under ``CI=true``, when
``NSYSFRAG_BACKGROUND_COMPILE=off`` (the tests set it: no stray compilers), or where the
platform has no ``fcntl`` locks. ``NSYSFRAG_BACKGROUND_COMPILE=list`` starts the process but it
only writes the kernels' names to ``background-compile.log``, compiling nothing: what the tests
observe without waiting for numba.
"""

from __future__ import annotations

import copyreg
import importlib
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from nsysfrag import interpreted, kernel_cache

ENVIRONMENT = "NSYSFRAG_BACKGROUND_COMPILE"
LOCK = "compile.lock"
LOG = "background-compile.log"
_PENDING = "pending-compile-"

Request = tuple[str, str, tuple[Any, ...]]  # module, kernel's name, stand-ins for its arguments


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a run may start a background compile at all (see the module's docstring)."""
    return (
        environ.get(ENVIRONMENT, "on").lower() != "off"
        and environ.get("CI", "").lower() != "true"
        and environ.get("NSYSFRAG_KERNELS", "auto") not in ("compiled", "interpreted")
    )


def start(environ: Mapping[str, str] = os.environ) -> bool:
    """After a run: leave what it interpreted for want of a cached kernel in a pending file and
    start the compiler unless one is running; whether a pending file was left. Never raises:
    a run that could not arrange it just runs interpreted next time too."""
    requests = interpreted.uncached()
    if not requests or not wanted(environ):
        return False
    try:
        import fcntl  # noqa: F401  (POSIX only: without its locks, no background compile)
    except ImportError:
        return False
    root = kernel_cache.writable_root()
    if root is None:
        return False
    try:
        _write_pending(root, requests)
        if running(root):
            return True  # the running compiler takes this file too
        subprocess.Popen(  # noqa: S603  (our own interpreter and module)
            [sys.executable, "-m", "nsysfrag.background_compile"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
            env={**environ, "NSYSFRAG_KERNELS": "compiled"},
        )  # fmt: skip
    except Exception:  # noqa: BLE001  (a type that will not pickle, a full disk: no compile)
        return False
    return True


def _write_pending(root: Path, requests: list[Request]) -> None:
    """The requests, pickled, renamed into place whole: the compiler never reads half a file."""
    fd, name = tempfile.mkstemp(prefix=".tmp-", dir=root)
    try:
        with os.fdopen(fd, "wb") as f:
            pickler = pickle.Pickler(f)
            pickler.dispatch_table = {**copyreg.dispatch_table, np.ndarray: interpreted.reduce_stand_in}
            pickler.dump(requests)
        os.replace(name, root / f"{_PENDING}{os.getpid()}-{time.monotonic_ns()}.pickle")
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


def running(root: Path) -> bool:
    """Whether a compiler holds the lock in ``root`` now."""
    with _lock(root) as held:
        return not held


@contextmanager
def _lock(root: Path) -> Iterator[bool]:
    """Whether this process holds the compiler's lock for the block (never waits for it)."""
    import fcntl

    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing it releases the lock


def compile_pending(root: Path, environ: Mapping[str, str] = os.environ) -> int:
    """The compiler: every pending request in ``root``, until none is left; how many kernels
    it compiled (or, in ``list`` mode, listed). Returns 0 at once when another holds the lock."""
    listing = environ.get(ENVIRONMENT, "").lower() == "list"
    done = 0
    with _lock(root) as held:
        if not held:
            return 0
        while pending := sorted(root.glob(f"{_PENDING}*.pickle")):
            requests: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
            for path in pending:
                try:
                    # Our own file in the user's private cache folder, as numba's cache files
                    # beside it are (which numba unpickles too).
                    for module, name, args in pickle.loads(path.read_bytes()):
                        requests.setdefault((module, name), []).append(args)
                except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError,
                        TypeError, ValueError):  # a file of another version: compiled at use
                    pass
                path.unlink(missing_ok=True)
            for (module, name), calls in requests.items():
                if not listing:
                    for args in calls:
                        _compile(module, name, args)
                with (root / LOG).open("a") as log:
                    log.write(f"{module}.{name}\n")
                done += 1
    return done


def _compile(module: str, name: str, types_of: tuple[Any, ...]) -> None:
    if not module.startswith("nsysfrag."):
        return  # only nsysfrag's own kernels, whatever a pending file says
    kernel = getattr(importlib.import_module(module), name, None)
    try:
        from numba.core.types import Type

        # The run noted a stand-in per argument (nsysfrag.interpreted.stand_in), which numba
        # types here as it would have typed the argument; a type itself passes as it is.
        signature = tuple(
            a if isinstance(a, Type) else kernel.typeof_pyval(a)  # type: ignore[union-attr]
            for a in types_of
        )
        kernel.compile(signature)  # type: ignore[union-attr]  (numba saves it in its cache)
    except Exception:  # noqa: BLE001  (a kernel that will not compile runs interpreted, as before)
        pass


def main() -> int:
    root = kernel_cache.writable_root()
    if root is not None:
        os.environ["NSYSFRAG_KERNELS"] = "compiled"
        compile_pending(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())

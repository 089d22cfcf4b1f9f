"""nsysfrag's compiled kernels, defined without importing numba until one is run compiled.

Importing numba takes a process about 0.4 s and 90 MiB (benchmarks/bench_startup.py), more
than all of ``analyze`` on a small input, which runs the kernels' interpreted twins anyway
(nsysfrag.interpreted). So a kernel module decorates its kernels with :func:`njit` instead of
``numba.njit``: each becomes a :class:`LazyKernel`, which holds the Python function and
numba's options and imports nothing. The first time any kernel is wanted compiled (called,
or asked for numba's own attributes: ``overloads``, ``compile``, ...), :func:`make_all`
imports numba, puts nsysfrag's cache locator first (nsysfrag.kernel_cache), makes every
kernel's numba dispatcher with its options, and makes each name in nsysfrag's modules that
held a lazy kernel name its dispatcher instead. numba reads a kernel's callees from its
module's names when it compiles or loads it, so it sees exactly the dispatchers that
``numba.njit`` at import would have made: the same compiled code, the same cache entries.
Kernels defined after that are numba's dispatchers at once.

Whether a kernel may be in numba's cache is known without numba (:func:`maybe_cached`): its
index file's name is numba's, in nsysfrag's cache folder. Only when the file is there does the
question go to numba (nsysfrag.kernel_cache.cached), which reads it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from nsysfrag import kernel_cache

Function = TypeVar("Function", bound=Callable[..., Any])

_lock = threading.RLock()
_kernels: list[LazyKernel] = []
_made = False
# (started, finished) of each block that watches numba compile (:func:`watching_compiles`).
_watchers: list[tuple[Callable[[], None], Callable[[], None]]] = []
_listening = False
# What must be told to numba before any kernel compiles (an overload), run by make_all.
_on_made: list[Callable[[], None]] = []


class LazyKernel:
    """A kernel numba has not been asked for yet: the function and numba's options."""

    def __init__(self, py_func: Callable[..., Any], options: dict[str, Any]) -> None:
        self.py_func = py_func
        self.options = options
        self.dispatcher: Any = None
        self.__name__ = py_func.__name__
        self.__qualname__ = py_func.__qualname__
        self.__module__ = py_func.__module__
        self.__doc__ = py_func.__doc__
        self.__wrapped__ = py_func

    def compiled(self) -> Any:
        """numba's dispatcher for this kernel (made, with every other, on first use)."""
        if self.dispatcher is None:
            make_all()
        return self.dispatcher

    def __call__(self, *args: Any) -> Any:
        return self.compiled()(*args)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # pickle, copy and friends probing: not numba's business
            raise AttributeError(name)
        return getattr(self.compiled(), name)

    def __repr__(self) -> str:
        return f"<lazy kernel {self.__module__}.{self.__qualname__}>"


def njit(fn: Function | None = None, **options: Any) -> Any:
    """``numba.njit(**options)``, made when first used (see the module's docstring); as
    ``@njit(cache=True)`` or ``njit(**options)(fn)``."""

    def decorate(function: Function) -> Function:
        with _lock:
            if _made:
                return _numba_njit(function, options)  # type: ignore[no-any-return]
            kernel = LazyKernel(function, options)
            _kernels.append(kernel)
            return kernel  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate


def is_kernel(value: object) -> bool:
    """Whether ``value`` is a kernel: lazy, or numba's dispatcher (without importing numba)."""
    if isinstance(value, LazyKernel):
        return True
    dispatcher = sys.modules.get("numba.core.dispatcher")
    return dispatcher is not None and isinstance(value, dispatcher.Dispatcher)


def py_func(value: object) -> Any:
    """The Python function of a kernel (lazy or numba's), else None."""
    return getattr(value, "py_func", None) if is_kernel(value) else None


def compiled(kernel: Any) -> Any:
    """numba's dispatcher of ``kernel`` (``kernel`` itself when it is one already)."""
    return kernel.compiled() if isinstance(kernel, LazyKernel) else kernel


def made() -> bool:
    """Whether numba's dispatchers are made (numba is imported) in this process."""
    return _made


def when_made(callback: Callable[[], None]) -> None:
    """``callback()`` once numba is imported, before any kernel is made (now, if it is)."""
    with _lock:
        if not _made:
            _on_made.append(callback)
            return
    callback()


def make_all() -> None:
    """Import numba and make every kernel's dispatcher, once (see the module's docstring)."""
    global _made
    with _lock:
        if _made:
            return
        kernel_cache.import_numba()  # and our cache locator, before any cache=True dispatcher
        from numba.core.typing.typeof import typeof_impl

        # A lazy kernel some container kept (not a module's name) still types as its dispatcher.
        typeof_impl.register(LazyKernel)(lambda value, c: typeof_impl(value.compiled(), c))
        for callback in _on_made:
            callback()
        for kernel in _kernels:
            kernel.dispatcher = _numba_njit(kernel.py_func, kernel.options)
        _made = True
        for name, module in list(sys.modules.items()):
            if name == "nsysfrag" or name.startswith("nsysfrag."):
                names = vars(module)
                for key, value in list(names.items()):
                    if isinstance(value, LazyKernel):
                        names[key] = value.dispatcher
        _listen()


def _numba_njit(fn: Callable[..., Any], options: dict[str, Any]) -> Any:
    import numba

    return numba.njit(**options)(fn)


def maybe_cached(kernel: LazyKernel) -> bool:
    """Whether numba's cache may hold ``kernel``: its index file is where numba would look
    (nsysfrag's cache folder, its fallback, or the user's ``NUMBA_CACHE_DIR``). numba names it
    after the source's folder, the file, the function, its first line and Python's version."""
    fn = kernel.py_func
    source = os.path.abspath(fn.__code__.co_filename)  # as numba names it: not resolved
    folder = os.path.dirname(source)
    subpath = f"{os.path.basename(folder)}_{hashlib.sha1(folder.encode()).hexdigest()}"
    version = f"{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"
    stem = os.path.splitext(os.path.basename(source))[0]
    name = f"{stem}.{fn.__qualname__}".replace("<", "").replace(">", "")
    index = f"{name}-{fn.__code__.co_firstlineno}.py{version}.nbi"
    user_dir = os.environ.get("NUMBA_CACHE_DIR", "")
    if user_dir:  # numba's own folder, numba's own layout
        return (Path(user_dir) / subpath / index).is_file()
    # nsysfrag's folders keep one subfolder per state of the kernel-bearing sources
    key = kernel_cache.current_sources_key()
    roots = [kernel_cache.cache_root(), _fallback_folder()]
    return any(root is not None and (root / key / subpath / index).is_file() for root in roots)


def _fallback_folder() -> Path | None:
    """kernel_cache.fallback_root's folder, not made: only looked in."""
    if not hasattr(os, "getuid"):
        return None
    import tempfile

    return Path(tempfile.gettempdir()) / f"nsysfrag-{os.getuid()}-cache"


@contextmanager
def watching_compiles(started: Callable[[], None], finished: Callable[[], None]) -> Iterator[None]:
    """``started()`` when numba begins an outermost compile inside the block, ``finished()``
    when it ends; numba need not be imported yet (nor ever, when nothing runs compiled)."""
    watcher = (started, finished)
    with _lock:
        _watchers.append(watcher)
        if "numba" in sys.modules:  # imported by someone else: listen from now on
            _listen()
    try:
        yield
    finally:
        with _lock:
            _watchers.remove(watcher)


def _listen() -> None:
    """One listener for the process, from when numba is imported: it tells the watchers."""
    global _listening
    with _lock:
        if _listening:
            return
        from numba.core import event

        class _Compiles(event.Listener):  # type: ignore[misc]
            """Counts nested compiles: compiling a kernel compiles the kernels it calls."""

            depth = 0

            def on_start(self, ev: object) -> None:
                with _lock:
                    self.depth += 1
                    told = list(_watchers) if self.depth == 1 else []
                for started, _ in told:
                    started()

            def on_end(self, ev: object) -> None:
                with _lock:
                    self.depth -= 1
                    told = list(_watchers) if self.depth == 0 else []
                for _, finished in told:
                    finished()

        event.register("numba:compile", _Compiles())
        _listening = True

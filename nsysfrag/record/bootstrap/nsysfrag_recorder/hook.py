"""Call a function once torch has initialized CUDA in this process, and never before.

Importing torch here would slow every Python process down and change nothing for most of
them, so an import watcher waits for the program to import ``torch.cuda``. Then the function is
queued with ``torch.cuda._lazy_call``: torch runs its queued calls inside ``_lazy_init`` right
after ``torch._C._cuda_init()``, before any tensor reaches the allocator, so the history holds
every allocation and the out-of-memory observer is attached only once the allocator exists
(attaching it earlier crashes, pytorch#107330). A torch without ``_lazy_call`` is polled
instead. Whatever the function raises is caught: a queued call that raises would make torch's
own CUDA initialization fail.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Sequence  # noqa: UP035  (Python 3.8)

from .stderr import warn

if TYPE_CHECKING:
    import importlib.machinery

WATCHED = "torch.cuda"
POLL_S = 0.1


def when_cuda_initialized(callback: Callable[[Any], None], on_import: Callable[[], None]) -> None:
    """``callback(torch)`` once CUDA is initialized; ``on_import()`` when torch.cuda loads."""
    cuda = sys.modules.get(WATCHED)
    if cuda is not None:  # already imported (the Python API starts after the program did)
        _arm(cuda, callback)
        return
    sys.meta_path.insert(0, _Watcher(callback, on_import))


def _arm(cuda: Any, callback: Callable[[Any], None]) -> None:
    torch = sys.modules.get("torch")
    once = _Once(callback, torch)
    try:
        if cuda.is_initialized():
            once()
            return
    except Exception:  # noqa: BLE001, S110  (an odd torch: try _lazy_call)
        pass
    lazy_call = getattr(cuda, "_lazy_call", None)
    if callable(lazy_call):
        try:
            lazy_call(once)
            return
        except Exception as err:  # noqa: BLE001
            warn(f"torch.cuda._lazy_call refused the recorder ({err}); polling instead")
    import threading

    threading.Thread(target=_poll, args=(cuda, once), name="nsysfrag-record-poll", daemon=True).start()


def _poll(cuda: Any, once: _Once) -> None:
    import threading

    stop = threading.Event()
    while not stop.wait(POLL_S):
        try:
            if cuda.is_initialized():
                once()
                return
        except Exception:  # noqa: BLE001
            return


class _Once:
    """The callback, run at most once, its errors caught and said."""

    def __init__(self, callback: Callable[[Any], None], torch: Any) -> None:
        import threading

        self.callback = callback
        self.torch = torch
        self.done = False
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            if self.done:
                return
            self.done = True
        try:
            self.callback(self.torch if self.torch is not None else sys.modules.get("torch"))
        except Exception as err:  # noqa: BLE001  (never into torch's CUDA initialization)
            warn(f"the recorder could not start ({type(err).__name__}: {err}); the program runs on unrecorded")


class _Watcher:
    """A meta path finder that finds nothing itself: it hands ``torch.cuda``'s own spec back
    with a loader that, once the module has run, arms the callback; then it leaves
    ``sys.meta_path``. (No importlib.abc base: importing that costs every Python process of the
    command milliseconds at start-up.)"""

    def __init__(self, callback: Callable[[Any], None], on_import: Callable[[], None]) -> None:
        self.callback = callback
        self.on_import = on_import
        self.busy = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != WATCHED or self.busy:
            return None
        self.busy = True
        try:
            spec: importlib.machinery.ModuleSpec | None = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)  # a finder's own: untyped
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            spec.loader = _ArmingLoader(spec.loader, self)  # type: ignore[assignment]
            return spec
        except Exception as err:  # noqa: BLE001
            warn(f"could not watch the import of torch.cuda ({err}); the program runs on unrecorded")
            return None
        finally:
            self.busy = False
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass


class _ArmingLoader:
    """torch.cuda's loader, plus arming the callback once the module has run."""

    def __init__(self, loader: Any, watcher: _Watcher) -> None:
        self.loader = loader
        self.watcher = watcher

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        # The module keeps its own loader: inspect, linecache and importlib.resources use it.
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        try:
            self.watcher.on_import()
            _arm(module, self.watcher.callback)
        except Exception as err:  # noqa: BLE001
            warn(f"the recorder could not arm itself ({err}); the program runs on unrecorded")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

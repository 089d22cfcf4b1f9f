"""The compiled kernels run as plain Python on small inputs: no compile wait on a first run.

numba compiles a kernel the first time it is called, and the first run after installing pays
for every kernel the command needs (seconds to a minute: benchmarks/bench_startup.py) while the
replay itself, on the few thousand events of a small trace, takes a fraction of a second even
interpreted. So each call site asks :func:`chosen` for the kernel to run: the compiled one for
an input of more than :data:`INTERPRET_UP_TO` items, else its interpreted twin — the same
Python source, each compiled function it names replaced by its own twin, run by CPython. Both
compute the same thing (the property tests run every kernel both ways and compare), so an
input's figures never depend on which ran.

Once a kernel is in numba's cache (:func:`nsysfrag.kernel_cache.cached`), it runs compiled
whatever the size: loading it costs less than interpreting. A twin that ran because its kernel
was not cached is noted with the argument types it was called with (:func:`uncached`), so that
the command line can compile those kernels afterwards in a process of their own
(:mod:`nsysfrag.background_compile`) and the next run finds them cached.

``NSYSFRAG_KERNELS=compiled`` (or ``interpreted``) forces one way for every input: the tests
use it, and so can a user who would rather compile once up front.

What the twin needs from the source, which numba compiles either way: integer arithmetic that
means the same on Python ints and numpy scalars (a hash that must wrap says so with
``np.uint64``; overflow warnings are off inside a twin), and record fields read from arrays
whose records allow it (:func:`records`).
"""

from __future__ import annotations

import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from numba.core.dispatcher import Dispatcher

from nsysfrag import kernel_cache

Kernel = TypeVar("Kernel", bound=Callable[..., Any])

# Above this many events (or entries, rows, bytes / 64 of a pickle: what the call site counts),
# compiling pays for itself on the first run; below it the interpreted twin is done sooner.
INTERPRET_UP_TO = 20_000
_MODES = ("auto", "compiled", "interpreted")

_twins: dict[int, Any] = {}
_lock = threading.RLock()  # a module twin makes twins while one is being made


def mode() -> str:
    """``auto`` unless ``NSYSFRAG_KERNELS`` names another of :data:`_MODES`."""
    chosen_mode = os.environ.get("NSYSFRAG_KERNELS", "auto")
    return chosen_mode if chosen_mode in _MODES else "auto"


def interpret(size: int, kernel: Callable[..., Any] | None = None) -> bool:
    """Whether an input of ``size`` items runs the interpreted twins (of ``kernel``: not when
    it is compiled already, in this process or in the cache, say after an earlier run)."""
    current = mode()
    if current == "auto":
        return size <= INTERPRET_UP_TO and (kernel is None or not _compiled(kernel))
    return current == "interpreted"


def chosen(kernel: Kernel, size: int) -> Kernel:
    """``kernel`` itself, or its interpreted twin for an input of ``size`` items (noted for a
    later compile when it is the twin because nothing was cached)."""
    if not interpret(size, kernel):
        return kernel
    run = twin(kernel)
    if mode() != "auto" or not isinstance(kernel, Dispatcher):
        return run

    def noted(*args: Any) -> Any:
        note(kernel, args)
        return run(*args)

    return noted  # type: ignore[return-value]


def _compiled(kernel: Callable[..., Any]) -> bool:
    """Whether calling ``kernel`` would load compiled code rather than compile it."""
    if not isinstance(kernel, Dispatcher):
        return False
    return bool(kernel.overloads) or kernel_cache.cached(kernel)


# (module, name, argument types) of each kernel whose twin ran for want of a cached kernel.
_uncached: dict[tuple[str, str, tuple[Any, ...]], None] = {}


def note(kernel: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Note that ``kernel``'s twin ran on ``args`` (as the compiled kernel would take them)
    because ``kernel`` was not cached; a kernel that is not a module's own name is not noted
    (a later process could not find it)."""
    if not isinstance(kernel, Dispatcher) or mode() != "auto":
        return
    fn = kernel.py_func
    module = sys.modules.get(fn.__module__)
    if module is None or getattr(module, fn.__name__, None) is not kernel:
        return
    try:
        types_of = tuple(kernel.typeof_pyval(a) for a in args)
    except Exception:  # noqa: BLE001  (an argument numba cannot type: the call would say so)
        return
    with _lock:
        _uncached[(fn.__module__, fn.__name__, types_of)] = None


def uncached() -> list[tuple[str, str, tuple[Any, ...]]]:
    """What :func:`note` noted in this process: (module, kernel's name, argument types)."""
    with _lock:
        return list(_uncached)


def twin(kernel: Kernel) -> Kernel:
    """``kernel``'s interpreted twin (made once): its Python source, run by CPython."""
    with _lock:
        made = _twin_of(kernel)
    return _entry(made)  # type: ignore[no-any-return]


def _entry(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        with np.errstate(over="ignore"):  # numba's integers wrap silently; so do the twin's
            return fn(*(records(a) for a in args))

    return run


def records(value: Any) -> Any:
    """``value`` with every structured array in it (a tuple's too) viewed as a
    :class:`RecordArray`: compiled code reads ``array[i].field``; so can the twin, on the same
    memory."""
    if isinstance(value, np.ndarray):
        if value.dtype.names is not None and not isinstance(value, RecordArray):
            return value.view(RecordArray)
        return value
    if isinstance(value, tuple):
        items = [records(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


class RecordArray(np.ndarray):  # type: ignore[type-arg]
    """A structured array whose items are :class:`Record` s. (numpy's own record arrays let a
    method shadow a field: ``row.flags`` is numpy's flags, not the field named ``flags``.)"""

    _fields: dict[str, np.ndarray] | None = None  # type: ignore[type-arg]

    def _columns(self) -> dict[str, np.ndarray]:  # type: ignore[type-arg]
        if self._fields is None:  # each field's column, a view: the same memory
            plain = self.view(np.ndarray)
            self._fields = {name: plain[name] for name in plain.dtype.names or ()}
        return self._fields

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)):
            return Record(self._columns(), int(key))
        return super().__getitem__(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, Record):  # ``a[i] = b[j]``: a copy of the record, field by field
            for name, column in self._columns().items():
                column[key] = getattr(value, name)
            return
        super().__setitem__(key, value)


class Record:
    """Item ``index`` of a structured array: each field an attribute, read and written in
    place, as in compiled code."""

    __slots__ = ("_fields", "_index")

    def __init__(self, fields: dict[str, np.ndarray], index: int) -> None:  # type: ignore[type-arg]
        object.__setattr__(self, "_fields", fields)
        object.__setattr__(self, "_index", index)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fields[name][self._index]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self._fields[name][self._index] = value

    __getitem__ = __getattr__
    __setitem__ = __setattr__


def _twin_of(value: Any) -> Any:
    if isinstance(value, Dispatcher):
        return _function_twin(value)
    if isinstance(value, types.ModuleType) and value.__name__.startswith("nsysfrag."):
        key = id(value)
        if key not in _twins:
            _twins[key] = _ModuleTwin(value)
        return _twins[key]
    return value


def _function_twin(kernel: Dispatcher) -> Callable[..., Any]:
    key = id(kernel)
    if key in _twins:
        return _twins[key]  # type: ignore[no-any-return]
    fn = kernel.py_func
    names: dict[str, Any] = {}
    closure = None
    if fn.__closure__ is not None:
        closure = tuple(types.CellType(_twin_of(c.cell_contents)) for c in fn.__closure__)
    made = types.FunctionType(fn.__code__, names, fn.__name__, fn.__defaults__, closure)
    _twins[key] = made  # before its names: a kernel may name itself, or one that names it
    names.update(fn.__globals__)
    for name in _global_names(fn.__code__):
        if name in names:
            names[name] = _twin_of(names[name])
    return made


def _global_names(code: types.CodeType) -> set[str]:
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _global_names(const)
    return found


class _ModuleTwin:
    """A module as a twin sees it: the module's compiled functions are their twins (kernels
    that name another module's functions as ``module.name`` keep numba's cache per module)."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        with _lock:
            value = _twin_of(getattr(self._module, name))
        setattr(self, name, value)
        return value


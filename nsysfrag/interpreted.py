"""The compiled kernels run as plain Python on small inputs: no compile wait on a first run.

numba compiles a kernel the first time it is called, and the first run after installing pays
for every kernel the command needs (seconds to a minute: benchmarks/bench_startup.py) while the
replay itself, on the few thousand events of a small trace, takes a fraction of a second even
interpreted. So each call site asks :func:`chosen` for the kernel to run: the compiled one for
an input of more than :data:`INTERPRET_UP_TO` items, else its interpreted twin — the same
Python source, each compiled function it names replaced by its own twin, run by CPython. Both
compute the same thing (the property tests run every kernel both ways and compare), so an
input's figures never depend on which ran.

Once a kernel is in numba's cache (:func:`nsysfrag.kernel_cache.cached`), it runs compiled,
loaded rather than interpreted — except on a tiny input in a process that has not imported
numba yet. Loading a cached kernel is cheap, but importing numba and loading the first one
is not (:data:`NUMBA_LOAD_US`: a real export's 19 memory events replay interpreted in a few
ms, against 0.3 s and 90 MiB for numba). So, while numba is not imported, each kernel's twin
runs as long as the twins of the run add up to less than :data:`TINY_BUDGET_US` of work, each
call costed as its size times what its twin takes per item (:data:`TWIN_US_PER_ITEM`: the call
sites count different things: events, rows, bytes / 64 of a pickle). The first call past the
budget imports numba; from then on every cached kernel loads. A run that turns out larger than
tiny so loses at most the budget; a tiny one saves numba's import. A twin that ran because its
kernel was not cached is noted with the argument types it was called with (:func:`uncached`),
so that the command line can compile those kernels afterwards in a process of their own
(:mod:`nsysfrag.background_compile`) and the next run finds them cached; one that ran because
the input was tiny, its kernel cached, is not.

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

from nsysfrag import jit, kernel_cache

Kernel = TypeVar("Kernel", bound=Callable[..., Any])

# Above this many events (or entries, rows, bytes / 64 of a pickle: what the call site counts),
# compiling pays for itself on the first run; below it the interpreted twin is done sooner.
INTERPRET_UP_TO = 20_000
_MODES = ("auto", "compiled", "interpreted")

# Measured in one run (benchmarks/bench_tiny_inputs.py, at load 12 on 2 cores: the ratios hold
# where the seconds do not): importing numba and loading a first cached kernel, and each twin's
# time per item its call site counts, on the samples (the largest per item of its calls).
NUMBA_LOAD_US = 2_500_000
TWIN_US_PER_ITEM: dict[str, float] = {
    "nsysfrag.allocators.torch.kernel._torch_kernel": 457.0,
    "nsysfrag.inputs.torch_snapshot.pickle_scan._scan": 378.0,  # per 64 bytes of pickle
    "nsysfrag.allocators.heap._heap_kernel": 190.0,
    "nsysfrag.reporters.address_raster._paint": 154.0,
    "nsysfrag.allocators.slab._slab_kernel": 152.0,
    "nsysfrag.models.observed.kernel._replay_kernel": 143.0,
    "nsysfrag.allocators.buddy._buddy_kernel": 140.0,
    "nsysfrag.models.segments.kernel.replay_forward": 115.0,
    "nsysfrag.whatif.layout._tile": 94.0,
    "nsysfrag.models.observed.slots._slots": 21.0,
    "nsysfrag.models.segments.kernel.rebuild_window": 7.9,
    "nsysfrag.models.segments.requests._requests": 6.8,
    "nsysfrag.models.observed.slots._distinct": 1.9,
}
# A kernel not measured is costed as the costliest.
_UNMEASURED_US_PER_ITEM = max(TWIN_US_PER_ITEM.values())
# Twins run in place of cached kernels while the run's twins cost less than this in all: a
# quarter of numba's import, so a run that turns out larger than tiny loses at most that (an
# even split, the whole import, would save more on mid-sized inputs and lose twice as much on
# those just above: the sample snapshot's scan alone is past a quarter and loads at once).
TINY_BUDGET_US = NUMBA_LOAD_US / 4
_spent_us = 0.0  # what this process's twins cost so far, as estimated

_twins: dict[int, Any] = {}
_lock = threading.RLock()  # a module twin makes twins while one is being made


def mode() -> str:
    """``auto`` unless ``NSYSFRAG_KERNELS`` names another of :data:`_MODES`."""
    chosen_mode = os.environ.get("NSYSFRAG_KERNELS", "auto")
    return chosen_mode if chosen_mode in _MODES else "auto"


def interpret(size: int, kernel: Callable[..., Any] | None = None) -> bool:
    """Whether an input of ``size`` items runs the interpreted twins (of ``kernel``: not when
    it is compiled already, in this process or in the cache, say after an earlier run, unless
    the input is tiny and numba not imported: see the module's docstring)."""
    current = mode()
    if current != "auto":
        return current == "interpreted"
    if size > INTERPRET_UP_TO:
        return False
    if kernel is None:
        return True
    if not numba_loaded() and _within_budget(size, kernel):
        return True
    return not _compiled(kernel)


def numba_loaded() -> bool:
    """Whether this process has imported numba (loading a cached kernel is cheap then)."""
    return jit.made() or "numba" in sys.modules


def twin_cost_us(size: int, kernel: Callable[..., Any]) -> float:
    """What ``kernel``'s twin takes on ``size`` items, as measured (:data:`TWIN_US_PER_ITEM`)."""
    fn = jit.py_func(kernel) or kernel
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"
    return size * TWIN_US_PER_ITEM.get(name, _UNMEASURED_US_PER_ITEM)


def _within_budget(size: int, kernel: Callable[..., Any]) -> bool:
    """Whether the twin on ``size`` items keeps the run's twins within :data:`TINY_BUDGET_US`
    (counted as spent when it does: a call site that asks twice is charged twice, which errs
    towards loading the compiled kernel)."""
    global _spent_us
    cost = twin_cost_us(size, kernel)
    with _lock:
        if _spent_us + cost > TINY_BUDGET_US:
            return False
        _spent_us += cost
        return True


def chosen(kernel: Kernel, size: int) -> Kernel:
    """``kernel`` itself, or its interpreted twin for an input of ``size`` items (noted for a
    later compile when it is the twin because nothing was cached)."""
    if not interpret(size, kernel):
        return kernel
    run = twin(kernel)
    if mode() != "auto" or not jit.is_kernel(kernel):
        return run

    def noted(*args: Any) -> Any:
        note(kernel, args)
        return run(*args)

    return noted  # type: ignore[return-value]


def _compiled(kernel: Callable[..., Any]) -> bool:
    """Whether calling ``kernel`` would load compiled code rather than compile it (numba is
    not imported to answer no for a kernel whose cache file is not even there)."""
    if isinstance(kernel, jit.LazyKernel):
        if kernel.dispatcher is None and not jit.maybe_cached(kernel):
            return False
        kernel = kernel.compiled()
    elif not jit.is_kernel(kernel):
        return False
    return bool(kernel.overloads) or kernel_cache.cached(kernel)


# Each kernel whose twin ran for want of a cached kernel: (module, name, what numba would type
# its arguments by) -> stand-ins for the arguments (:func:`stand_in`).
_uncached: dict[tuple[str, str, tuple[Any, ...]], tuple[Any, ...]] = {}


def note(kernel: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Note that ``kernel``'s twin ran on ``args`` (as the compiled kernel would take them)
    because ``kernel`` was not cached; a kernel that is not a module's own name is not noted
    (a later process could not find it). numba is not imported for it: what is noted is a
    stand-in for each argument, small, that numba types as it would type the argument."""
    if not jit.is_kernel(kernel) or mode() != "auto":
        return
    if not numba_loaded() and isinstance(kernel, jit.LazyKernel) and jit.maybe_cached(kernel):
        # The twin ran because the input was tiny; its index is there (were it an old one,
        # the next larger input compiles it, as it would have anyway).
        return
    fn = kernel.py_func  # type: ignore[attr-defined]
    module = sys.modules.get(fn.__module__)
    named = getattr(module, fn.__name__, None) if module is not None else None
    if named is None or jit.py_func(named) is not fn:
        return
    try:
        stand_ins = tuple(stand_in(a) for a in args)
        key = tuple(_typed_by(a) for a in args)
    except _Untyped:
        return
    with _lock:
        _uncached[(fn.__module__, fn.__name__, key)] = stand_ins


def uncached() -> list[tuple[str, str, tuple[Any, ...]]]:
    """What :func:`note` noted in this process: (module, kernel's name, stand-ins for its
    arguments), for ``kernel.compile`` after ``kernel.typeof_pyval`` of each."""
    with _lock:
        return [(module, name, args) for (module, name, _), args in _uncached.items()]


class _Untyped(Exception):
    """An argument no stand-in stands for: the kernel is not noted."""


def stand_in(value: Any) -> Any:
    """A value numba types as it types ``value``: an array the same type (element, dimensions,
    layout, writeable) but of a few items, a tuple of stand-ins; anything else itself."""
    if isinstance(value, np.ndarray):
        if not value.flags.aligned:
            raise _Untyped
        return array_stand_in(value.dtype, value.ndim, _layout(value), bool(value.flags.writeable))
    if isinstance(value, tuple):
        items = [stand_in(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def array_stand_in(dtype: np.dtype, ndim: int, layout: str, writeable: bool) -> np.ndarray:  # type: ignore[type-arg]
    """A few items of ``dtype`` that numba types as an array of ``ndim`` dimensions, ``layout``
    and ``writeable``."""
    if layout == "C":
        made = np.zeros((1,) * ndim, dtype=dtype)
    elif layout == "F":
        made = np.zeros((2,) * ndim, dtype=dtype, order="F")
    else:  # every other item: contiguous in no order
        made = np.zeros((3,) * ndim, dtype=dtype)[(slice(None, None, 2),) * ndim]
    made.setflags(write=writeable)
    return made


def reduce_stand_in(array: np.ndarray) -> tuple[Any, ...]:  # type: ignore[type-arg]
    """How a stand-in array pickles: numpy's own pickling keeps neither the layout (it stores the
    items contiguous) nor a read-only flag (it comes back writeable), so a background compile of
    an unpickled stand-in would compile a signature the next run does not ask for."""
    return array_stand_in, (array.dtype, array.ndim, _layout(array), bool(array.flags.writeable))


def _layout(array: np.ndarray) -> str:  # type: ignore[type-arg]
    """numba's layout of ``array``: C-contiguous first, as numba asks."""
    if array.flags.c_contiguous:
        return "C"
    return "F" if array.flags.f_contiguous else "A"


def _typed_by(value: Any) -> Any:
    """What numba's type of ``value`` depends on, hashable (the key a kernel is noted by)."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype, value.ndim, _layout(value), value.flags.writeable)
    if isinstance(value, tuple):
        return (type(value), tuple(_typed_by(v) for v in value))
    if isinstance(value, int) and not isinstance(value, bool):
        return (int, -(2**63) <= value < 2**63)  # int64, else uint64
    try:
        hash(value)
    except TypeError:
        raise _Untyped from None
    return (type(value),)


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
    if jit.is_kernel(value):
        return _function_twin(value)
    if isinstance(value, types.ModuleType) and value.__name__.startswith("nsysfrag."):
        key = id(value)
        if key not in _twins:
            _twins[key] = _ModuleTwin(value)
        return _twins[key]
    return value


def _function_twin(kernel: Any) -> Callable[..., Any]:
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


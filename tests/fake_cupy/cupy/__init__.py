"""A stand-in for CuPy on machines without a GPU, for tests: only ``cupy.cuda.runtime``'s raw
memory calls, backed by a simulated driver (``cupy/cuda/runtime.py`` says which)."""

from __future__ import annotations

from cupy import cuda as cuda

__version__ = "0+fake"

"""The caching allocator's rules (:mod:`nsysfrag.models.segments.rules`) compiled for the
``torch`` kernel, from the very same functions."""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

from nsysfrag.models.segments.rules import allocation_size, division_interval, rounded, split_rule

interval_kernel = numba.njit(cache=True)(division_interval)
rounded_kernel = numba.njit(cache=True)(rounded)
allocation_size_kernel = numba.njit(cache=True)(allocation_size)
should_split_kernel = numba.njit(cache=True)(split_rule)


@numba.njit(cache=True)
def round_size_kernel(size: int, divisions: npt.NDArray[np.int64]) -> int:
    """round_size in a kernel: ``divisions`` holds one count per interval."""
    return int(rounded_kernel(size, divisions[interval_kernel(max(size, 1))]))

"""The caching allocator's rules (:mod:`nsysfrag.models.segments.rules`) compiled for the
``torch`` kernel, from the very same functions."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from nsysfrag.allocators.base import kernel_step
from nsysfrag.models.segments.rules import allocation_size, division_interval, rounded, split_rule

interval_kernel = kernel_step(division_interval)
rounded_kernel = kernel_step(rounded)
allocation_size_kernel = kernel_step(allocation_size)
should_split_kernel = kernel_step(split_rule)


@kernel_step
def round_size_kernel(size: int, divisions: npt.NDArray[np.int64]) -> int:
    """round_size in a kernel: ``divisions`` holds one count per interval."""
    return int(rounded_kernel(size, divisions[interval_kernel(max(size, 1))]))

"""Run a test module twice: on the compiled kernels and on their interpreted twins.

Small inputs run interpreted (nsysfrag.interpreted), large ones compiled; the property tests
hold both to the same reference. A module imports :func:`both_kernels` (an autouse fixture)
and every test in it runs once per way, ``[compiled]`` and ``[interpreted]``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

KERNEL_MODES = ("compiled", "interpreted")


@pytest.fixture(scope="module", autouse=True, params=KERNEL_MODES)
def both_kernels(request: pytest.FixtureRequest) -> Iterator[str]:
    before = os.environ.get("NSYSFRAG_KERNELS")
    os.environ["NSYSFRAG_KERNELS"] = request.param
    try:
        yield request.param
    finally:
        if before is None:
            os.environ.pop("NSYSFRAG_KERNELS", None)
        else:
            os.environ["NSYSFRAG_KERNELS"] = before

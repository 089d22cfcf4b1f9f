"""``driver``: ``cudaMalloc`` on the driver's pages, as an nsys trace recorded it.

Not a model to replay requests through: it is what the program did, read by the observed model
exactly as ``analyze`` reads it, and so the baseline of a ``whatif`` of an nsys trace whose
program called the driver directly (``nsysfrag.whatif.driver``). Named here so that the
baseline is a policy like every other in the reports and ``--policy driver`` means it.
"""

from __future__ import annotations

from nsysfrag.allocators.base import RequestStream, SimResult
from nsysfrag.allocators.family import PolicyFamily
from nsysfrag.errors import InputError

NAME = "driver"


def _recorded_only(stream: RequestStream, capacity_bytes: int, options: object) -> SimResult:
    raise InputError(
        "--policy driver: the driver's own behaviour exists only as an nsys trace recorded it"
        " (it is the baseline of an nsys trace of a program calling cudaMalloc directly);"
        " leave it out for this input"
    )


FAMILY = PolicyFamily(
    NAME,
    ("observed", "cudamalloc"),
    "cudaMalloc on the driver's pages, as recorded (observed model)",
    _recorded_only,
)

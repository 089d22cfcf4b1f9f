"""Byte sizes as people write them: the one parser behind every option that takes bytes, and
the one way reports write them back (``format_bytes``).

``--capacity``, ``--granularity`` (analyze, profile, whatif) and the values of ``--fail-on``
gates all read sizes here, so ``2G`` means the same everywhere. Decimal prefixes are powers of
1000 and binary ones powers of 1024, whatever the case: ``k``/``kB`` = 1,000, ``KiB`` = 1,024,
``M``/``MB`` = 10**6, ``MiB`` = 2**20, and so on up to ``E``/``EiB``. A bare number is bytes.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# Every figure nsysfrag computes is a signed 64-bit integer (addresses, sums of sizes): one
# exbibyte leaves room for sums of a few thousand such sizes and is far beyond any device.
MAX_BYTES = 1 << 60
MAX_TEXT = "1 EiB"

_PREFIXES = "kmgtpe"
UNITS: dict[str, int] = {"": 1, "b": 1}
for _power, _prefix in enumerate(_PREFIXES, start=1):
    UNITS[_prefix] = UNITS[_prefix + "b"] = 1000**_power
    UNITS[_prefix + "ib"] = 1024**_power
EXAMPLES = "85899345920, 80GiB, 80GB or 512"

_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d{1,3}))?\s*([A-Za-z]*)\s*")


class SizeError(ValueError):
    """Why a text is not an acceptable size; ``str(err)`` completes "VALUE: ..."."""


def parse_bytes(text: str, *, minimum: int = 0) -> int:
    """``"80GiB"`` -> 85899345920; fractions of a byte are dropped (``1.5KiB`` -> 1536).

    Raises SizeError for a malformed text, an unknown unit, or a size outside
    ``[minimum, MAX_BYTES]``.
    """
    m = _SIZE.fullmatch(text)
    if m is None:
        raise SizeError(f"not a size; write e.g. {EXAMPLES}")
    number, exponent, unit = m.groups()
    if unit.lower() not in UNITS:
        raise SizeError(
            f"unknown unit {unit!r}; use B, kB/KiB, MB/MiB, GB/GiB, TB/TiB, PB/PiB or EB/EiB"
        )
    try:
        # Decimal, not float: 9223372036854775807 must not round up to 2**63.
        value = Decimal(number).scaleb(int(exponent or 0)) * UNITS[unit.lower()]
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
        raise SizeError(f"not a size; write e.g. {EXAMPLES}") from None
    if value > MAX_BYTES:
        raise SizeError(f"larger than {MAX_TEXT} ({MAX_BYTES} bytes), the most nsysfrag accepts")
    size = int(value)
    if size < minimum:
        raise SizeError(f"must be at least {minimum} byte{'s' if minimum != 1 else ''}")
    return size


_FORMAT_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: float) -> str:
    """Human units, binary prefixes: ``1536`` -> ``1.50 KiB``."""
    value = float(n)
    for unit in _FORMAT_UNITS:
        if abs(value) < 1024 or unit == _FORMAT_UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")

"""How far a snapshot pickle may expand before it is refused as a memo bomb.

Pickle's memo lets a small file name the same list or dict again and again: a 2 MB file can
hold a trace list referenced a thousand times (a billion trace entries), or a segment whose
block list is shared by ten thousand segments. Unpickling such a file is cheap (the objects are
shared), walking it is not. Every object torch writes is its own, so each trace entry, block or
stack frame costs at least a few bytes of the file; a snapshot that has more of them than one
per ``BYTES_PER_ITEM`` bytes is refused before it is walked, with a message that names the
limit and how to raise it (``NSYSFRAG_SNAPSHOT_MAX_ITEMS``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nsysfrag.errors import InputError

ENV_MAX_ITEMS = "NSYSFRAG_SNAPSHOT_MAX_ITEMS"
BYTES_PER_ITEM = 4  # a real trace entry takes 40-250 bytes, a block 30-100, a frame reference 2-5
FLOOR_ITEMS = 100_000  # small files may always expand this far: walking it takes milliseconds


@dataclass(frozen=True, slots=True)
class ExpansionLimit:
    """The most trace entries, blocks, or frames in one stack, a snapshot file may expand to."""

    path: str
    file_bytes: int
    items: int
    from_env: bool

    @classmethod
    def for_file(cls, path: str, file_bytes: int) -> ExpansionLimit:
        raw = os.environ.get(ENV_MAX_ITEMS)
        if raw is not None and raw.strip():
            try:
                items = int(raw.replace("_", "").replace(",", ""))
            except ValueError:
                items = -1
            if items < 1:
                raise InputError(
                    f"{ENV_MAX_ITEMS}={raw[:40]!r} is not a positive count; set it to the number of"
                    " trace entries, blocks or stack frames a snapshot may hold, or unset it"
                )
            return cls(path, file_bytes, items, True)
        return cls(path, file_bytes, max(FLOOR_ITEMS, file_bytes // BYTES_PER_ITEM), False)

    def check(self, count: int, what: str) -> None:
        """Refuse ``count`` ``what`` (e.g. "trace entries") beyond the limit."""
        if count <= self.items:
            return
        basis = (
            f"{ENV_MAX_ITEMS}={self.items}"
            if self.from_env
            else f"one per {BYTES_PER_ITEM} bytes of the file"
        )
        raise InputError(
            f"{self.path}: the pickle expands to {count:,} {what}, more than the limit of"
            f" {self.items:,} ({basis}); its objects repeat through the pickle memo, which torch"
            f" never writes (a memo bomb?); set {ENV_MAX_ITEMS}={count} to read it anyway"
        )

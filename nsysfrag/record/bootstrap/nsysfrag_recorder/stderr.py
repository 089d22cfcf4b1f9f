"""The recorder's one way to speak: a warning line on stderr that can never raise."""

from __future__ import annotations

import sys


def warn(message: str) -> None:
    """``nsysfrag record: warning: MESSAGE`` (nothing, if stderr is closed or broken)."""
    try:
        sys.stderr.write(f"nsysfrag record: warning: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001, S110  (nowhere left to say it)
        pass

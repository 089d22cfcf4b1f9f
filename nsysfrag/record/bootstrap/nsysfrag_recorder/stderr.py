"""The recorder's one way to speak: a warning line on stderr that can never raise."""

from __future__ import annotations

import sys


def warn(message: str) -> None:
    """``nsysfrag record: warning: MESSAGE`` (nothing, if stderr is closed or broken)."""
    line(f"nsysfrag record: warning: {message}")


def line(text: str) -> None:
    """``text`` as a line of its own (a line that names nsysfrag itself)."""
    try:
        sys.stderr.write(f"{text}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001, S110  (nowhere left to say it)
        pass

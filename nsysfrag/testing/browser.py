"""Where a Chromium or Chrome is, for the tests and benchmarks that open a report in one."""

from __future__ import annotations

import shutil

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The path of the first Chromium or Chrome on PATH, or None."""
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None

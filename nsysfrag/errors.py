"""The one error type users see: a message that says what to do next, and an exit code."""

from __future__ import annotations

# Exit codes (docs/reports.md, "Exit codes").
EXIT_GATE = 1
EXIT_INPUT = 2
EXIT_NSYS = 3


class NsysfragError(Exception):
    """A problem the user can fix; ``str(err)`` is the one line we print."""

    exit_code = EXIT_INPUT


class InputError(NsysfragError):
    """Unreadable, unsupported or incomplete input (exit 2)."""

    exit_code = EXIT_INPUT


class NsysError(NsysfragError):
    """nsys is missing or failed (exit 3)."""

    exit_code = EXIT_NSYS

"""nsysfrag: how fragmented is GPU device memory, how it got that way, and what to change."""

from __future__ import annotations

__version__ = "0.1.0"

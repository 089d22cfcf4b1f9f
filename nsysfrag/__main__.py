from __future__ import annotations

from nsysfrag.cli import run

run()

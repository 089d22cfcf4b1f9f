from __future__ import annotations

from nsysfrag.cli import main

main()

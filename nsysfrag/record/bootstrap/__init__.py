"""The folder ``nsysfrag record`` puts first on the command's ``PYTHONPATH``.

It holds a ``sitecustomize`` module, which every Python process imports at start-up, and the
recorder package it arms. Nothing in it imports nsysfrag or any third-party package except
torch, and only once the program has imported torch itself.
"""

from __future__ import annotations

from pathlib import Path

BOOTSTRAP_DIR = Path(__file__).resolve().parent

from __future__ import annotations

from cupy.cuda import runtime as runtime

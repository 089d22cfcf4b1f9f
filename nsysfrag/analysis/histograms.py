"""Size histograms by size class ``[2**k, 2**(k+1))``."""

from __future__ import annotations

import numpy as np

from nsysfrag.analysis.metrics import size_class
from nsysfrag.analysis.results import Bucket
from nsysfrag.events import I64


def histogram(sizes: I64) -> list[Bucket]:
    """Count and bytes of the positive ``sizes`` per size class, smallest class first."""
    sizes = np.sort(sizes[sizes > 0])
    if len(sizes) == 0:
        return []
    k = size_class(sizes)
    classes, first, counts = np.unique(k, return_index=True, return_counts=True)
    totals = np.add.reduceat(sizes, first)
    return [
        Bucket(1 << c, 1 << (c + 1), n, t)
        for c, n, t in zip(classes.tolist(), counts.tolist(), totals.tolist(), strict=True)
    ]

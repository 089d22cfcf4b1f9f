"""Out-of-order free hotspots (docs/metrics.md): which sites free blocks that leave holes, and which
sites' blocks pin those holes."""

from __future__ import annotations

import numpy as np

from nsysfrag.analysis.metrics import size_class
from nsysfrag.analysis.results import Hotspot
from nsysfrag.models.series import StateSeries


def hotspots_of(series: StateSeries) -> list[Hotspot]:
    """Out-of-order frees grouped by (site, size class) of the freed block, most hole bytes
    first."""
    site_codes, site_names = series.site, series.site_names
    frees = np.flatnonzero(series.out_of_order)
    if len(frees) == 0:
        return []
    freed = series.freed_alloc[frees]
    hole = series.hole[frees]
    sizes = series.bytes[freed]
    # One group per (site, size class), keyed site * 64 + class; aggregated with bincount (no
    # sort: there are few sites and 64 classes, far fewer keys than frees).
    keys = (site_codes[freed] << 6) | size_class(sizes)
    frees_per_key = np.bincount(keys)
    groups = np.flatnonzero(frees_per_key)
    group_of = np.searchsorted(groups, keys)
    n_groups = len(groups)
    frees_per_group = frees_per_key[groups]
    holes_per_group = np.bincount(group_of[hole], minlength=n_groups)
    hole_bytes = np.zeros(n_groups, dtype=np.int64)
    stranded = sizes if series.hole_bytes is None else series.hole_bytes[frees]
    np.add.at(hole_bytes, group_of[hole], stranded[hole])
    # Pinning sites: count (group, site) pairs over the blocks that pin each hole (both
    # neighbours in a segment; in pages, the one or two whose pages keep it resident).
    pins = np.concatenate([series.pin_left[frees][hole], series.pin_right[frees][hole]])
    pin_groups = np.concatenate([group_of[hole], group_of[hole]])
    pinned_hole = pins >= 0
    pin_sites, pin_groups = site_codes[pins[pinned_hole]], pin_groups[pinned_hole]
    pair_keys = pin_groups * len(site_names) + pin_sites
    if n_groups * len(site_names) <= 1 << 24:
        pair_counts = np.bincount(pair_keys)
        pairs = np.flatnonzero(pair_counts)
        pair_counts = pair_counts[pairs]
    else:
        pairs, pair_counts = np.unique(pair_keys, return_counts=True)
    pinned: dict[int, list[tuple[int, str]]] = {}
    for pair, count in zip(pairs.tolist(), pair_counts.tolist(), strict=True):
        group, site = divmod(pair, len(site_names))
        pinned.setdefault(group, []).append((-count, site_names[site]))
    hotspots = [
        Hotspot(
            site=site_names[key >> 6],
            size_lo_bytes=1 << (key & 0x3F),
            out_of_order_frees=int(frees_per_group[g]),
            hole_creating_frees=int(holes_per_group[g]),
            hole_bytes=int(hole_bytes[g]),
            pinned_by=tuple(name for _, name in sorted(pinned.get(g, []))),
        )
        for g, key in enumerate(groups.tolist())
    ]
    hotspots.sort(key=lambda h: (-h.hole_bytes, -h.out_of_order_frees, h.site, h.size_lo_bytes))
    return hotspots

"""Metric formulas, health levels and size classes (docs/metrics.md); pure functions."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from nsysfrag.events import I64, BoolArray
from nsysfrag.units import format_bytes as format_bytes  # re-exported: the reports' byte words

F64 = npt.NDArray[np.float64]
# local_frag and free_blocks rate a space only where at least this share of the device is free:
# when almost nothing is free, the shape of that little free memory decides nothing.
MATERIAL_SHARE = 0.05
RATED_METRICS = ("global_frag", "local_frag", "free_blocks")  # also the order ties are broken in


class Health(enum.IntEnum):
    OK = 0
    WARN = 1
    CRITICAL = 2

    @property
    def label(self) -> str:
        return self.name.lower()


def global_frag(free_bytes: I64, largest_free_bytes: I64, capacity_bytes: int) -> F64:
    """``(F - L) / C``: free memory outside the largest free block, as a share of the device;
    at most 1 (more is free than the device has only when the capacity is wrong for the
    space, which its warnings say)."""
    # In place: a trace has millions of points, and every temporary is as large as the trace.
    ratio: F64 = np.subtract(free_bytes, largest_free_bytes, dtype=np.float64)
    ratio /= float(capacity_bytes)
    np.minimum(ratio, 1.0, out=ratio)
    return ratio


def local_frag(free_bytes: I64, largest_free_bytes: I64) -> F64:
    """``1 - L / F`` (0 when ``F == 0``): the share of free memory a maximal request cannot use."""
    out = np.zeros(len(free_bytes), dtype=np.float64)
    np.divide(largest_free_bytes, free_bytes, out=out, where=free_bytes > 0)
    np.subtract(1.0, out, out=out, where=free_bytes > 0)
    return out


def global_frag_health(value: float) -> Health:
    """ok below 0.20, warn from 0.20 to below 0.40, critical from 0.40."""
    return Health.OK if value < 0.20 else Health.WARN if value < 0.40 else Health.CRITICAL


def local_frag_health(value: float) -> Health:
    """ok below 0.30, warn from 0.30 to 0.60 inclusive, critical above 0.60."""
    return Health.OK if value < 0.30 else Health.WARN if value <= 0.60 else Health.CRITICAL


def free_blocks_health(value: int) -> Health:
    """ok below 100, warn from 100 to 500 inclusive, critical above 500."""
    return Health.OK if value < 100 else Health.WARN if value <= 500 else Health.CRITICAL


def overall_health(max_global: float, max_local: float, max_free_blocks: int) -> Health:
    """The worst level of the three rated metrics, each at its maximum over the trace."""
    return max(
        global_frag_health(max_global),
        local_frag_health(max_local),
        free_blocks_health(max_free_blocks),
    )


@dataclass(frozen=True, slots=True)
class HealthBasis:
    """The metric, value and moment that set a space's health level."""

    metric: str  # one of RATED_METRICS
    value: float  # the metric's maximum over the moments it is rated at (an int for free_blocks)
    time_ns: int  # the first moment it took that value
    point: int  # that moment's index in the state series


def basis_words(metric: str, value: object) -> str:
    """A health basis's metric and value as the reports write them: ``local frag 45.7%``,
    ``free blocks 12`` (a ratio as a percentage, a count as it is)."""
    name = metric.replace("_", " ")
    ratio = metric != "free_blocks" and isinstance(value, (int, float))
    return f"{name} {value:.1%}" if ratio else f"{name} {value}"


def material(free_bytes: I64, capacity_bytes: int) -> BoolArray:
    """The moments where local_frag and free_blocks count toward health: free memory (everything
    free on the device) at least MATERIAL_SHARE of the device, boundary included."""
    return np.asarray(free_bytes >= MATERIAL_SHARE * capacity_bytes, dtype=np.bool_)


def rate_health(
    global_frag: F64,
    local_frag: F64,
    free_blocks: npt.NDArray[np.integer],
    is_material: BoolArray,
    time_ns: I64,
) -> tuple[Health, HealthBasis | None]:
    """The worst level of the rated metrics, each at its maximum over the moments it is rated
    at (global_frag: every moment; the others: the material ones; a metric with no such moment
    does not rate), and what set it: of the metrics at that level, the one whose maximum came
    first, in RATED_METRICS order at the same moment. No basis when the space is ok."""
    levels = (global_frag_health, local_frag_health, free_blocks_health)
    worst, basis = Health.OK, None
    for name, values, level_of in zip(RATED_METRICS, (global_frag, local_frag, free_blocks), levels):
        rated = np.ones(len(values), dtype=np.bool_) if name == "global_frag" else is_material
        if not rated.any():
            continue
        candidates = np.flatnonzero(rated)
        point = int(candidates[int(np.argmax(values[candidates]))])  # argmax: the first maximum
        level = level_of(values[point])
        if level is Health.OK or level < worst:
            continue
        if level > worst or basis is None or point < basis.point:
            value = int(values[point]) if name == "free_blocks" else float(values[point])
            worst, basis = level, HealthBasis(name, value, int(time_ns[point]), point)
    return worst, basis


@dataclass(frozen=True, slots=True)
class Unrated:
    """A maximum above a health threshold that the health does not count: it fell at moments
    where less than MATERIAL_SHARE of the device was free (the materiality rule)."""

    metric: str  # local_frag or free_blocks
    value: float  # its maximum over every moment (an int for free_blocks)
    time_ns: int  # the first moment it took that value
    free_share: float  # free memory then, as a share of the device
    rated_value: float | None  # its maximum over the moments health counts; None: none


def unrated_maxima(
    local: F64,
    free_blocks: npt.NDArray[np.integer],
    free_bytes: I64,
    capacity_bytes: int,
    time_ns: I64,
) -> list[Unrated]:
    """The rated metrics whose maximum is at a higher level than health gives them (local_frag
    and free_blocks count only where at least 5 % of the device is free)."""
    is_material = material(free_bytes, capacity_bytes)
    out = []
    for name, values, level_of in (("local_frag", local, local_frag_health),
                                   ("free_blocks", free_blocks, free_blocks_health)):  # fmt: skip
        if not len(values):
            continue
        point = int(np.argmax(values))
        rated = values[is_material]
        rated_value = rated.max() if len(rated) else None
        if level_of(values[point]) <= (level_of(rated_value) if rated_value is not None else Health.OK):
            continue
        cast = int if name == "free_blocks" else float
        out.append(
            Unrated(
                name,
                cast(values[point]),
                int(time_ns[point]),
                float(free_bytes[point]) / capacity_bytes if capacity_bytes else 0.0,
                None if rated_value is None else cast(rated_value),
            )
        )
    return out


def unrated_words(u: Unrated, when: str) -> str:
    """``max local frag 61.6% is not counted in the health: it came at 0.312 s, when 1.2 % of
    the device was free …``: why a red maximum sits beside a healthier rating."""
    rated = (
        f"; over the moments it does count, {basis_words(u.metric, u.rated_value)} at most"
        if u.rated_value is not None
        else "; no moment had that much free"
    )
    return (
        f"max {basis_words(u.metric, u.value)} is not counted in the health: it came at {when},"
        f" when only {u.free_share:.1%} of the device was free, and the rating counts"
        f" {u.metric.replace('_', ' ')} only while at least {MATERIAL_SHARE:.0%} of the device is"
        f" free (the shape of that little free memory decides no request){rated}."
    )


def size_class(nbytes: I64) -> I64:
    """Class ``k`` holds sizes in ``[2**k, 2**(k+1))``; sizes must be >= 1."""
    # frexp is exact for every integer below 2**53, unlike log2 near powers of two.
    _, exponent = np.frexp(nbytes.astype(np.float64))
    k = exponent.astype(np.int64) - 1
    # Above 2**53 the float conversion can round up to the next power of two.
    for i in np.flatnonzero(nbytes >= 1 << 53):
        k[i] = int(nbytes[i]).bit_length() - 1
    return k


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def size_class_label(k: int) -> str:
    """``20`` -> ``1–2 MiB``; ``9`` -> ``512 B–1 KiB``."""
    lo_unit, hi_unit = k // 10, (k + 1) // 10
    lo, hi = 1 << (k - 10 * lo_unit), 1 << (k + 1 - 10 * hi_unit)
    if lo_unit == hi_unit:
        return f"{lo}–{hi} {_UNITS[lo_unit]}"
    return f"{lo} {_UNITS[lo_unit]}–{hi} {_UNITS[hi_unit]}"


def growth_per_second(time_ns: I64, values: F64, samples: int = 1000) -> float:
    """Least-squares slope of a step function per second (docs/metrics.md).

    Samples the function at ``samples`` evenly spaced times from the first to the last event
    (both included), each sample being the value after the last event at or before it; 0 when
    there are fewer than two distinct times.
    """
    if len(time_ns) == 0 or time_ns[0] == time_ns[-1]:
        return 0.0
    t0 = int(time_ns[0])
    # Work relative to the first event: absolute ns do not survive float arithmetic exactly.
    rel = (time_ns - t0).astype(np.float64)
    t = np.linspace(0.0, float(int(time_ns[-1]) - t0), samples)
    idx = np.searchsorted(rel, t, side="right") - 1
    y = values[idx]
    x = t / 1e9
    xm = x.mean()
    denom = float(((x - xm) ** 2).sum())
    return float(((x - xm) * (y - y.mean())).sum() / denom) if denom > 0 else 0.0

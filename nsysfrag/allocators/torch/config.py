"""The ``torch`` policy's options: PYTORCH_CUDA_ALLOC_CONF as the caching allocator reads it
(``expandable_segments``, ``max_split_size_mb``, ``max_non_split_rounding_mb``,
``roundup_power2_divisions``, ``garbage_collection_threshold``), parsed into a
:class:`TorchConfig`, and the same options as the compiled kernel takes them
(:class:`KernelConfig`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from nsysfrag.allocators.base import I64, UNLIMITED, MiB
from nsysfrag.errors import InputError
from nsysfrag.models.segments.rules import DIVISION_INTERVALS, K_LARGE_BUFFER, division_table


class KernelConfig(NamedTuple):
    """The options and the device as the kernel reads them."""

    max_split_size: int
    max_non_split_rounding: int
    expandable_segments: bool
    gc_limit: int  # garbage_collection_threshold x the allowed maximum, -1 when off
    capacity: int  # bytes the device can give this allocator
    expandable_va: int  # the virtual size of one expandable segment
    divisions: I64  # roundup_power2_divisions per interval


@dataclass(frozen=True)
class TorchConfig:
    """The PYTORCH_CUDA_ALLOC_CONF options the caching allocator's placement depends on."""

    max_split_size: int = UNLIMITED
    max_non_split_rounding: int = K_LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = (0,) * DIVISION_INTERVALS
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0
    given: dict[str, str] = field(default_factory=dict, compare=False)  # the options as written

    @classmethod
    def parse(cls, text: str) -> TorchConfig:
        """``expandable_segments:True,max_split_size_mb:128`` (``=`` works as well as ``:``)."""
        values: dict[str, object] = {}
        given: dict[str, str] = {}
        for item in split_options(text):
            m = re.fullmatch(r"\s*([A-Za-z0-9_]+)\s*[:=]\s*(.+?)\s*", item)
            if not m:
                raise InputError(
                    f"torch option {item!r}: write KEY=VALUE or KEY:VALUE, e.g."
                    " torch:expandable_segments=True,max_split_size_mb=128"
                )
            key, value = m.group(1), m.group(2)
            given[key] = value
            values[key] = _parse_option(key, value)
        kw = {_FIELDS[key]: value for key, value in values.items() if key in _FIELDS}
        return cls(**kw, given=given)  # type: ignore[arg-type]

    @classmethod
    def from_settings(
        cls,
        max_split_size: int | None,
        divisions: dict[int, int],
        expandable: bool,
        conf: str | None,
    ) -> TorchConfig:
        """The configuration a snapshot's ``allocator_settings`` record."""
        parsed = None
        if conf:
            try:
                parsed = cls.parse(conf)
            except InputError:
                parsed = None
        return cls(
            max_split_size=max_split_size if max_split_size else UNLIMITED,
            roundup_power2_divisions=division_table(divisions),
            expandable_segments=expandable,
            # The settings record these only in the PYTORCH_CUDA_ALLOC_CONF string.
            max_non_split_rounding=parsed.max_non_split_rounding if parsed else K_LARGE_BUFFER,
            garbage_collection_threshold=parsed.garbage_collection_threshold if parsed else 0.0,
            given=parsed.given if parsed else {},
        )

    def conf_string(self) -> str:
        """The PYTORCH_CUDA_ALLOC_CONF that sets this configuration ('' for the defaults)."""
        parts = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.max_split_size < UNLIMITED:
            parts.append(f"max_split_size_mb:{self.max_split_size // MiB}")
        if self.max_non_split_rounding != K_LARGE_BUFFER:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding // MiB}")
        if any(self.roundup_power2_divisions):
            divs = self.roundup_power2_divisions
            if len(set(divs)) == 1:
                parts.append(f"roundup_power2_divisions:{divs[0]}")
            else:
                items = [f"{1 << i}:{d}" for i, d in enumerate(divs)]
                parts.append("roundup_power2_divisions:[" + ",".join(items) + "]")
        if self.garbage_collection_threshold > 0:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold:g}")
        return ",".join(parts)

    def options(self) -> dict[str, object]:
        """The effective options, for the JSON report."""
        return {
            "expandable_segments": self.expandable_segments,
            "max_split_size_mb": None if self.max_split_size >= UNLIMITED else self.max_split_size // MiB,
            "max_non_split_rounding_mb": self.max_non_split_rounding // MiB,
            "roundup_power2_divisions": list(self.roundup_power2_divisions),
            "garbage_collection_threshold": self.garbage_collection_threshold,
        }

    def kernel_config(self, capacity_bytes: int, es_va_bytes: int | None = None) -> KernelConfig:
        gc = self.garbage_collection_threshold
        if es_va_bytes is None:
            es_va_bytes = min(capacity_bytes + capacity_bytes // 8, 1 << 50)
        return KernelConfig(
            max_split_size=self.max_split_size,
            max_non_split_rounding=self.max_non_split_rounding,
            expandable_segments=self.expandable_segments,
            gc_limit=int(gc * capacity_bytes) if gc > 0 else -1,
            capacity=capacity_bytes,
            expandable_va=es_va_bytes,
            divisions=np.asarray(self.roundup_power2_divisions, dtype=np.int64),
        )

    # PolicyOptions: what the policy registry asks of a family's options.

    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.given.items())

    def summary(self) -> dict[str, object]:
        return self.options()


_FIELDS = {  # option -> TorchConfig field
    "max_split_size_mb": "max_split_size",
    "max_non_split_rounding_mb": "max_non_split_rounding",
    "roundup_power2_divisions": "roundup_power2_divisions",
    "expandable_segments": "expandable_segments",
    "garbage_collection_threshold": "garbage_collection_threshold",
}


def split_options(text: str) -> list[str]:
    """Split on commas outside ``[...]`` (roundup_power2_divisions lists contain commas)."""
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    return [i for i in items if i.strip()]


_IGNORED = ("release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
            "pinned_num_register_threads", "pinned_use_background_threads",
            "graph_capture_record_stream_reuse", "pinned_reserve_segment_size_mb")  # fmt: skip


def _parse_option(key: str, value: str) -> object:
    v = value.strip()
    if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        if not v.isdigit():
            raise InputError(f"torch option {key}={value}: a whole number of MB (e.g. {key}=128)")
        mb = int(v)
        if mb < K_LARGE_BUFFER // MiB:
            raise InputError(f"torch option {key}={value}: PyTorch requires at least 20 (MB)")
        return mb * MiB
    if key == "expandable_segments":
        if v.lower() not in ("true", "false"):
            raise InputError(f"torch option expandable_segments={value}: True or False")
        return v.lower() == "true"
    if key == "garbage_collection_threshold":
        try:
            t = float(v)
        except ValueError:
            t = -1.0
        if not 0.0 < t < 1.0:
            raise InputError(
                f"torch option garbage_collection_threshold={value}: a fraction strictly between"
                " 0 and 1 (e.g. 0.6)"
            )
        return t
    if key == "roundup_power2_divisions":
        return _parse_divisions(v)
    if key == "backend":
        if v == "native":
            return None
        raise InputError(
            f"torch option backend={value}: the cudaMallocAsync backend is its own policy;"
            " pass --policy cuda-async"
        )
    if key in _IGNORED:
        return None
    raise InputError(
        f"torch option {key!r} is unknown; the placement options are expandable_segments,"
        " max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions and"
        " garbage_collection_threshold"
    )


def _division_value(text: str, where: str) -> int:
    if not text.strip().isdigit():
        raise InputError(f"torch option roundup_power2_divisions={where}: divisions are whole numbers")
    d = int(text)
    if d != 0 and d & (d - 1):
        raise InputError(
            f"torch option roundup_power2_divisions={where}: {d} is not a power of 2 (or 0)"
        )
    return d


def _parse_divisions(v: str) -> tuple[int, ...]:
    """A scalar for all intervals, or ``[k:v,…,>:v]`` with k in MB (PyTorch's roundup_power2_divisions syntax)."""
    if not v.startswith("["):
        return (_division_value(v, v),) * DIVISION_INTERVALS
    if not v.endswith("]"):
        raise InputError(f"torch option roundup_power2_divisions={v}: close the list with ]")
    divs = [0] * DIVISION_INTERVALS
    last = -1
    first = True
    for item in v[1:-1].split(","):
        if ":" not in item:
            raise InputError(f"torch option roundup_power2_divisions={v}: items are KEY:VALUE")
        k, d_text = (s.strip() for s in item.split(":", 1))
        d = _division_value(d_text, v)
        if k == ">":
            for i in range(last + 1, DIVISION_INTERVALS):
                divs[i] = d
            continue
        if not k.isdigit() or int(k) == 0 or int(k) & (int(k) - 1):
            raise InputError(
                f"torch option roundup_power2_divisions={v}: keys are powers of 2 in MB, or >"
            )
        idx = min(int(k).bit_length() - 1, DIVISION_INTERVALS - 1)
        if first:
            for i in range(idx):
                divs[i] = d
            first = False
        divs[idx] = d
        last = idx
    return tuple(divs)


"""CI gates: ``--fail-on "global_frag>0.3"`` expressions over the JSON document's space keys."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.errors import InputError
from nsysfrag.units import SizeError, parse_bytes

HEALTH_ORDER = {"ok": 0, "warn": 1, "critical": 2}
_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "!=": operator.ne,
    "==": operator.eq,
    ">": operator.gt,
    "<": operator.lt,
    "=": operator.eq,
}
_EXPRESSION = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(>=|<=|!=|==|>|<|=)\s*(\S.*?)\s*$")
# Bare names of the per-event metrics mean their maximum over the trace, which is what a gate
# on fragmentation is about; `peak.`/`final.` reach the other states.
_BARE_IN = ("max", "peak")
EXAMPLES = 'global_frag>0.3, local_frag>=0.6, free_blocks>500, alloc_failure_rate>0, health=critical'
_STATE = ("time_ns", "global_frag", "local_frag", "free_blocks", "largest_free_bytes", "free_bytes", "live_bytes")
_MAX = ("global_frag", "local_frag", "free_blocks", "live_bytes")
_COUNTS = ("allocations", "frees", "unmatched_frees", "overlaps", "zero_size_allocs",
           "failed_allocations", "other_kind_events")
_TOP = ("alloc_failure_rate", "internal_frag", "growth_per_s", "health", "out_of_order_frees",
        "hole_creating_frees", "capacity_bytes", "span_mode", "caching_allocator_suspected")
METRICS = frozenset(
    _TOP
    + _STATE
    + _COUNTS
    + tuple(f"peak.{k}" for k in _STATE)
    + tuple(f"final.{k}" for k in _STATE)
    + tuple(f"max.{k}" for k in _MAX)
    + tuple(f"counts.{k}" for k in _COUNTS)
)


@dataclass(frozen=True, slots=True)
class Gate:
    text: str
    metric: str
    op: str
    limit: float | str

    def check(self, space: dict[str, Any]) -> Trip | None:
        value = _lookup(space, self.metric)
        if value is None:
            raise InputError(f"--fail-on {self.text!r}: the analysis has no metric {self.metric!r}")
        if self.metric == "health":
            tripped = _OPERATORS[self.op](HEALTH_ORDER[str(value)], HEALTH_ORDER[str(self.limit)])
        else:
            tripped = _OPERATORS[self.op](float(value), float(self.limit))
        return Trip(self, space["pid"], space["device"], value) if tripped else None


@dataclass(frozen=True, slots=True)
class Trip:
    gate: Gate
    pid: int
    device: int
    value: Any

    def message(self, rank: int | None = None) -> str:
        """What tripped, where; ``rank`` names a job's rank first."""
        if self.gate.metric.endswith("_bytes"):
            value, limit = format_bytes(float(self.value)), format_bytes(float(self.gate.limit))
        else:
            value = f"{self.value:.6g}" if isinstance(self.value, float) else str(self.value)
            limit = f"{self.gate.limit:.6g}" if isinstance(self.gate.limit, float) else str(self.gate.limit)
        where = f"rank {rank}: " if rank is not None else ""
        return (
            f"gate tripped: {where}pid {self.pid} device {self.device}: {self.gate.metric} = {value}"
            f" {self.gate.op} {limit} (--fail-on {self.gate.text!r})"
        )


def _lookup(space: dict[str, Any], metric: str) -> Any:
    node: Any = space
    for part in metric.split("."):
        if not isinstance(node, dict) or part not in node:
            node = None
            break
        node = node[part]
    if node is None and "." not in metric:
        for section in _BARE_IN:
            if metric in space.get(section, {}):
                return space[section][metric]
        if metric in space.get("counts", {}):
            return space["counts"][metric]
    if isinstance(node, (dict, list)):
        return None
    return int(node) if isinstance(node, bool) else node


def parse_gate(text: str) -> Gate:
    """Parse ``METRIC OP VALUE``; raise InputError saying why when it is malformed."""
    m = _EXPRESSION.match(text)
    if not m:
        raise InputError(
            f"--fail-on {text!r}: not a gate; write METRIC OP VALUE, e.g. {EXAMPLES}"
        )
    metric, op, raw = m.groups()
    if metric not in METRICS:
        raise InputError(
            f"--fail-on {text!r}: unknown metric {metric!r}; use one of the JSON keys of a space,"
            f" e.g. {EXAMPLES}, peak.largest_free_bytes<2GiB, counts.overlaps>0"
        )
    if metric == "health":
        if raw.lower() not in HEALTH_ORDER:
            raise InputError(f"--fail-on {text!r}: health is one of ok, warn, critical")
        return Gate(text, metric, op, raw.lower())
    return Gate(text, metric, op, _number(text, raw))


def _number(text: str, raw: str) -> float:
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(%|[A-Za-z]+)?", raw)
    if not m:
        raise InputError(f"--fail-on {text!r}: {raw!r} is not a number (0.3, 30%, 2GiB)")
    unit = m.group(2) or ""
    if unit == "%":
        return float(m.group(1)) / 100
    if unit:
        try:
            return float(parse_bytes(raw))
        except SizeError as err:
            raise InputError(f"--fail-on {text!r}: {raw!r}: {err}") from None
    return float(m.group(1))


def evaluate(gates: list[Gate], document: dict[str, Any]) -> list[Trip]:
    """Every (space, gate) that trips, in space order."""
    trips = []
    for space in document["spaces"]:
        for gate in gates:
            trip = gate.check(space)
            if trip is not None:
                trips.append(trip)
    return trips

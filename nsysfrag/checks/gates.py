"""CI gates: ``--fail-on "global_frag>0.3"`` expressions over the JSON document's space keys
(every numeric key: ``checks.keys``)."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.checks.keys import HEALTH, KNOWN, nearest, numeric_keys, resolve
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
EXAMPLES = (
    "global_frag>0.3, local_frag>=0.6, free_blocks>500, alloc_failure_rate>0, health=critical,"
    " peak.reserved_bytes>70GiB, final.stranded_bytes>1GiB, ooms.count>0"
)
# Every numeric key of a space (checks.keys): the metrics a gate takes.
METRICS = KNOWN


@dataclass(frozen=True, slots=True)
class Gate:
    text: str
    metric: str  # as the user wrote it
    op: str
    limit: float | str
    path: str = ""  # the dotted key it means (checks.keys.resolve); "" for the metric itself

    def check(self, space: dict[str, Any]) -> Trip | None:
        key = self.path or self.metric
        value = space.get(HEALTH) if key == HEALTH else numeric_keys(space).get(key)
        if value is None:
            found = numeric_keys(space)
            near = nearest(key, found)
            hint = f"; it has {', '.join(near)}" if near else ""
            raise InputError(
                f"--fail-on {self.text!r}: this analysis has no {key!r} in pid"
                f" {space.get('pid')} device {space.get('device')}{hint}"
            )
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


def parse_gate(text: str) -> Gate:
    """Parse ``METRIC OP VALUE``; raise InputError saying why when it is malformed."""
    m = _EXPRESSION.match(text)
    if not m:
        raise InputError(
            f"--fail-on {text!r}: not a gate; write METRIC OP VALUE, e.g. {EXAMPLES}"
        )
    metric, op, raw = m.groups()
    try:
        path = resolve(metric)
    except InputError as err:
        raise InputError(f"--fail-on {text!r}: {err}") from None
    if metric == "health":
        if raw.lower() not in HEALTH_ORDER:
            raise InputError(f"--fail-on {text!r}: health is one of ok, warn, critical")
        return Gate(text, metric, op, raw.lower(), path)
    return Gate(text, metric, op, _number(text, raw), path)


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

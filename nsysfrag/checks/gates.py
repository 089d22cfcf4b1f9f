"""CI gates: ``--fail-on "global_frag>0.3"`` expressions over the JSON document's space keys
(every numeric key: ``checks.keys``)."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nsysfrag.checks.keys import HEALTH, KNOWN, nearest, numeric_keys, resolve
from nsysfrag.errors import InputError
from nsysfrag.units import UNITS, SizeError, parse_bytes

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
    written: tuple[str, str] = ("", "")  # the limit's number and unit as written ("60", "%")

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
        """What tripped, where, said as the gate was written: ``local_frag = 67.1 % ≥ 60 %``
        for ``local_frag>=60%``, sizes in the gate's unit; ``rank`` names a job's rank first."""
        gate = self.gate
        if gate.metric == "health":
            value, limit = str(self.value), str(gate.limit)
        else:
            value, limit = _in_gate_units(float(self.value), gate)
        said = f"{gate.metric} = {value}"
        if gate.op not in ("=", "=="):  # tripped equality: the limit is the value
            said += f" {_SYMBOLS.get(gate.op, gate.op)} {limit}"
        where = f"rank {rank}: " if rank is not None else ""
        return f"gate tripped: {where}pid {self.pid} device {self.device}: {said} (--fail-on {gate.text!r})"


_SYMBOLS = {">=": "≥", "<=": "≤", "!=": "≠"}


def _in_gate_units(value: float, gate: Gate) -> tuple[str, str]:
    """The value and the limit in the unit the limit was written in (a share as %, a size in
    its byte unit, else a plain number): the value with a decimal or two more than the limit
    was written with, more where it would otherwise read as the limit itself."""
    number, unit = gate.written
    scale, suffix = {"%": (0.01, " %"), "": (1.0, "")}.get(unit, (None, f" {unit}"))
    scale = scale or float(UNITS[unit.lower()])
    shown, limit = value / scale, float(gate.limit) / scale
    written_decimals = len(number.partition(".")[2]) if "e" not in number.lower() else 0
    if shown.is_integer() and limit.is_integer() and not suffix:
        return str(int(shown)), number  # counts and bytes: whole numbers
    least = written_decimals + (1 if unit == "%" else 2)
    text = ""
    for decimals in range(least, 12):
        text = f"{shown:.{decimals}f}"
        if shown == limit or float(text) != limit:
            break
    return text + suffix, number + suffix


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
    m = _LIMIT.fullmatch(raw)
    if not m:
        raise InputError(f"--fail-on {text!r}: {raw!r} is not a number (0.3, 30%, 2GiB)")
    return Gate(text, metric, op, _number(text, raw), path, (m.group(1), m.group(2) or ""))


_LIMIT = re.compile(r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(%|[A-Za-z]+)?")


def _number(text: str, raw: str) -> float:
    m = _LIMIT.fullmatch(raw)
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

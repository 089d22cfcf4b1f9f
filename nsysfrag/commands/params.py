"""Option value types shared by the commands: each refuses a bad value in one line that names
the option (click adds the option's name to the message)."""

from __future__ import annotations

import math

import click

from nsysfrag.errors import InputError
from nsysfrag.limits import Limit
from nsysfrag.units import SizeError, parse_bytes


class ByteSize(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """A byte count: ``85899345920``, ``80GiB``, ``80GB``, ``512`` (see nsysfrag.units)."""

    name = "BYTES"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_bytes(str(value), minimum=1)
        except SizeError as err:
            self.fail(f"{value!r}: {err}", param, ctx)


class Delta(click.ParamType):  # type: ignore[type-arg]
    """A finite, non-negative number such as a regression threshold: ``nan`` would silently
    switch a check off (every comparison with it is false), so it is refused."""

    name = "DELTA"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            number = value
        else:
            try:
                number = float(str(value))
            except ValueError:
                self.fail(f"{value!r} is not a number; write e.g. 0.05", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"{value!r}: must be a finite number, 0 or more (e.g. 0.05)", param, ctx)
        return number


class Seconds(click.ParamType):  # type: ignore[type-arg]
    """A time limit in seconds (``600``, ``2.5``): positive and finite, as ``limit`` says."""

    name = "SECONDS"

    def __init__(self, limit: Limit) -> None:
        self.limit = limit

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        source = param.opts[0] if param is not None and param.opts else "SECONDS"
        try:
            return self.limit.parse(str(value), source)
        except InputError as err:
            self.fail(str(err), param, ctx)

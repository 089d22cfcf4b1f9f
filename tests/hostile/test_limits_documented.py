"""The "Bad input and limits" page's table (docs/limits.md) names every limit and timeout of ``nsysfrag/limits.py`` with its
default, and each default as the table writes it is the value the code uses."""

from __future__ import annotations

import re

import pytest

from nsysfrag import limits
from nsysfrag.inputs.torch_snapshot.limits import BYTES_PER_ITEM, ENV_MAX_ITEMS, FLOOR_ITEMS
from nsysfrag.units import parse_bytes
from tests.conftest import REPO

PAGE = (REPO / "docs" / "limits.md").read_text(encoding="utf-8")
SECTION = PAGE[PAGE.index("Every limit and timeout") : PAGE.index("Command lines that would lose")]
ROWS = [line for line in SECTION.splitlines() if line.startswith("| ")]


def _row(name: str) -> str:
    found = [row for row in ROWS if f"`{name}`" in row]
    assert len(found) == 1, f"{name}: in {len(found)} rows of the Bad input table"
    return found[0]


@pytest.mark.parametrize("limit", limits.LIMITS, ids=lambda lim: lim.env or lim.what)
def test_every_limit_is_in_the_table_with_its_default(limit: limits.Limit) -> None:
    assert limit.env is not None
    row = _row(limit.env)
    assert limit.shown in row.split("|")[2], row
    if limit.option is not None:
        assert f"`{limit.option}`" in row


@pytest.mark.parametrize("limit", limits.LIMITS, ids=lambda lim: lim.env or lim.what)
def test_each_default_as_written_is_the_one_in_force(limit: limits.Limit) -> None:
    first = limit.shown.split(" + ")[0].replace(",", "")
    number = re.fullmatch(r"([\d.]+)( s| per byte)?", first)
    value = float(number.group(1)) if number else parse_bytes(first)
    assert value == limit.default == limit.value({})


def test_the_snapshot_expansion_limit_is_in_the_table_too() -> None:
    row = _row(ENV_MAX_ITEMS)
    assert f"one per {BYTES_PER_ITEM} bytes" in row and f"{FLOOR_ITEMS:,}" in row


def test_the_fixed_bounds_are_the_ones_in_the_table() -> None:
    assert f"to {limits.MAX_COLUMNS:,}" in _row("$COLUMNS")
    assert limits.MAX_RANK == 2**31 - 1 and "2^31 − 1" in SECTION

"""The history database as it is now: tables for queries, and the space scalars they hold.

``migrations.py`` builds this schema step by step in a database; this module is what the code
reads and writes once a database is current. A test checks that the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    UniqueConstraint,
)
from sqlalchemy.types import TypeEngine

metadata = MetaData()

# 0 stands for "no --capacity override": a NULL would make every such run distinct under the
# unique constraint (NULLs never compare equal), so re-recording would not be caught.
NO_CAPACITY_OVERRIDE = 0


def _run_rows(
    name: str, key: tuple[str, ...], *columns: Column[Any], index: Index | None = None
) -> Table:
    """A table of rows that belong to a run (they go when the run goes), keyed by the run and
    ``key``."""
    run_id = Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)
    extra = () if index is None else (index,)
    return Table(
        name, metadata, run_id, *columns, PrimaryKeyConstraint("run_id", *key, name=f"pk_{name}"),
        *extra,
    )


runs = Table(
    "runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("recorded_at", DateTime, nullable=False),  # UTC, naive: SQLite has no time zones
    Column("trace_path", String, nullable=False),
    Column("trace_sha256", String(64), nullable=False),
    Column("nsys_version", String),
    Column("host", String),
    Column("label", String),
    Column("model", String, nullable=False),
    Column("granularity_bytes", BigInteger, nullable=False),
    Column("capacity_override_bytes", BigInteger, nullable=False),
    Column("nsysfrag_version", String),
    Column("rank", Integer),  # NULL: not one rank of a job
    UniqueConstraint(
        "trace_sha256",
        "model",
        "granularity_bytes",
        "capacity_override_bytes",
        name="uq_runs_trace_options",
    ),
    Index("ix_runs_recorded_at", "recorded_at"),
)

run_tags = _run_rows(
    "run_tags", ("key",),
    Column("key", String, nullable=False),
    Column("value", String, nullable=False),
    index=Index("ix_run_tags_key_value", "key", "value"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class SpaceField:
    """One scalar of an analyze JSON space: where it sits in the JSON and in ``run_spaces``."""

    path: str  # e.g. "peak.global_frag"
    type: type[TypeEngine[Any]]

    @property
    def column(self) -> str:
        return self.path.replace(".", "_")

    @property
    def numeric(self) -> bool:
        return self.type in (BigInteger, Integer, Double)


_STATE: tuple[tuple[str, type[TypeEngine[Any]]], ...] = (
    ("time_ns", BigInteger),
    ("global_frag", Double),
    ("local_frag", Double),
    ("free_blocks", BigInteger),
    ("largest_free_bytes", BigInteger),
    ("free_bytes", BigInteger),
    ("live_bytes", BigInteger),
)
_COUNTS = (
    "allocations",
    "frees",
    "unmatched_frees",
    "overlaps",
    "zero_size_allocs",
    "failed_allocations",
    "other_kind_events",
)

# Every scalar of a space, in the JSON's order (plus device_name and process_name, which are
# extra keys of the document). pid, device and model identify the space: a document may hold
# one space under several models.
SPACE_FIELDS: tuple[SpaceField, ...] = (
    SpaceField("pid", BigInteger),
    SpaceField("device", Integer),
    SpaceField("model", String),
    SpaceField("device_name", String),
    SpaceField("process_name", String),
    SpaceField("capacity_bytes", BigInteger),
    SpaceField("base_address", BigInteger),
    SpaceField("span_mode", Boolean),
    *(SpaceField(f"counts.{name}", BigInteger) for name in _COUNTS),
    SpaceField("alloc_failure_rate", Double),
    *(SpaceField(f"peak.{name}", kind) for name, kind in _STATE),
    SpaceField("max.global_frag", Double),
    SpaceField("max.local_frag", Double),
    SpaceField("max.free_blocks", BigInteger),
    SpaceField("max.live_bytes", BigInteger),
    *(SpaceField(f"final.{name}", kind) for name, kind in _STATE),
    SpaceField("internal_frag", Double),
    SpaceField("growth_per_s", Double),
    SpaceField("health", String),
    SpaceField("out_of_order_frees", BigInteger),
    SpaceField("hole_creating_frees", BigInteger),
)
# May be absent from a document (extra keys) or a space row (recorded before schema 2).
OPTIONAL_FIELDS = frozenset({"device_name", "process_name"})

run_spaces = _run_rows(
    "run_spaces", ("pid", "device", "model"),
    *(Column(f.column, f.type(), nullable=f.path in OPTIONAL_FIELDS) for f in SPACE_FIELDS),
)  # fmt: skip

# Every other numeric key of a space (checks.keys.numeric_keys), one row each: trends and
# checks follow any key of the analyze JSON, not only the columns above.
run_space_values = _run_rows(
    "run_space_values", ("pid", "device", "model", "path"),
    Column("pid", BigInteger, nullable=False),
    Column("device", Integer, nullable=False),
    Column("model", String, nullable=False),
    Column("path", String, nullable=False),
    Column("value", Double, nullable=False),
)  # fmt: skip

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_at", DateTime, nullable=False),
)

TABLES = ("runs", "run_tags", "run_spaces", "run_space_values", "schema_version")

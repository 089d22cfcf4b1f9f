"""Schema versions of the history database, and the steps from each to the next.

A ``schema_version`` table holds one row per applied step. ``MIGRATIONS[i]`` takes a database
from version ``i`` to ``i + 1``; a new schema is a new function appended to the list, never an
edit of an old one, which is why each step spells out its own DDL instead of using the tables
of ``schema.py`` (those describe only the latest version).

Alembic would do this too, but it brings an ini file, an env.py and a versions/ folder to ship
inside the package for three tables; upgrading in place when the store opens is what we need,
and a list of functions does it in one transaction with one lock.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    DateTime,
    Double,
    ForeignKey,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    UniqueConstraint,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.types import TypeEngine

from nsysfrag.errors import InputError
from nsysfrag.history.schema import TABLES, schema_version

Migration = Callable[[Connection], None]

# Any number: the key of the PostgreSQL advisory lock that serializes migrations, so two CI jobs
# opening a new database at once do not both create the tables.
_PG_LOCK_KEY = 0x6E737966


def _v1_space_columns() -> list[Column[object]]:
    kinds: dict[str, type[TypeEngine[Any]]] = {
        "pid": BigInteger,
        "device": Integer,
        "model": String,
        "device_name": String,
        "capacity_bytes": BigInteger,
        "base_address": BigInteger,
        "span_mode": Boolean,
        "alloc_failure_rate": Double,
        "internal_frag": Double,
        "growth_per_s": Double,
        "health": String,
        "out_of_order_frees": BigInteger,
        "hole_creating_frees": BigInteger,
        "max_global_frag": Double,
        "max_local_frag": Double,
        "max_free_blocks": BigInteger,
        "max_live_bytes": BigInteger,
    }
    for name in (
        "allocations",
        "frees",
        "unmatched_frees",
        "overlaps",
        "zero_size_allocs",
        "failed_allocations",
        "other_kind_events",
    ):
        kinds[f"counts_{name}"] = BigInteger
    for state in ("peak", "final"):
        for name in ("time_ns", "free_blocks", "largest_free_bytes", "free_bytes", "live_bytes"):
            kinds[f"{state}_{name}"] = BigInteger
        kinds[f"{state}_global_frag"] = Double
        kinds[f"{state}_local_frag"] = Double
    return [Column(name, kind(), nullable=name == "device_name") for name, kind in kinds.items()]


def v1_initial(connection: Connection) -> None:
    """Runs, their tags and their spaces' summaries."""
    # These tables repeat much of schema.py on purpose: this step is frozen as version 1 made
    # them, and sharing code with the live schema would let a later change rewrite it.
    md = MetaData()
    Table(
        "runs",
        md,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("recorded_at", DateTime, nullable=False),
        Column("trace_path", String, nullable=False),
        Column("trace_sha256", String(64), nullable=False),
        Column("nsys_version", String),
        Column("host", String),
        Column("label", String),
        Column("model", String, nullable=False),
        Column("granularity_bytes", BigInteger, nullable=False),
        Column("capacity_override_bytes", BigInteger, nullable=False),
        UniqueConstraint(
            "trace_sha256",
            "model",
            "granularity_bytes",
            "capacity_override_bytes",
            name="uq_runs_trace_options",
        ),
    )
    Table(
        "run_tags",
        md,
        Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        Column("key", String, nullable=False),
        Column("value", String, nullable=False),
        PrimaryKeyConstraint("run_id", "key", name="pk_run_tags"),
    )
    Table(
        "run_spaces",
        md,
        Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        *_v1_space_columns(),
        PrimaryKeyConstraint("run_id", "pid", "device", "model", name="pk_run_spaces"),
    )
    md.create_all(connection)


def v2_provenance_and_indexes(connection: Connection) -> None:
    """Which nsysfrag recorded a run and each space's process name; indexes for the filters."""
    connection.execute(text("ALTER TABLE runs ADD COLUMN nsysfrag_version VARCHAR"))
    connection.execute(text("ALTER TABLE run_spaces ADD COLUMN process_name VARCHAR"))
    connection.execute(text("CREATE INDEX ix_runs_recorded_at ON runs (recorded_at)"))
    connection.execute(text("CREATE INDEX ix_run_tags_key_value ON run_tags (key, value)"))


def v3_job_rank(connection: Connection) -> None:
    """The rank of a run that is one input of a distributed job (`analyze` with several)."""
    connection.execute(text("ALTER TABLE runs ADD COLUMN rank INTEGER"))


def v4_space_values(connection: Connection) -> None:
    """Every numeric key of each space (checks.keys), beyond the columns of run_spaces: what
    `history --trend` and `--check` follow for any key of the analyze JSON."""
    md = MetaData()
    Table("runs", md, Column("id", Integer, primary_key=True))  # exists: the key's target
    values = Table(
        "run_space_values",
        md,
        Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        Column("pid", BigInteger, nullable=False),
        Column("device", Integer, nullable=False),
        Column("model", String, nullable=False),
        Column("path", String, nullable=False),
        Column("value", Double, nullable=False),
        PrimaryKeyConstraint("run_id", "pid", "device", "model", "path", name="pk_run_space_values"),
    )
    md.create_all(connection, tables=[values])


MIGRATIONS: tuple[Migration, ...] = (
    v1_initial,
    v2_provenance_and_indexes,
    v3_job_rank,
    v4_space_values,
)
LATEST = len(MIGRATIONS)


def current_version(connection: Connection) -> int:
    """The database's schema version: 0 for an empty database.

    Raises InputError for a database that holds something else (no ``schema_version`` table
    but tables of ours, or, in an SQLite file, any tables at all: say an nsys trace passed as
    ``--db``), so we never write our tables into someone else's file.
    """
    names = set(inspect(connection).get_table_names())
    if "schema_version" in names:
        found = connection.execute(select(func.max(schema_version.c.version))).scalar()
        return int(found or 0)
    foreign = names & set(TABLES) if connection.dialect.name != "sqlite" else names
    if foreign:
        listed = ", ".join(sorted(foreign)[:4])
        raise InputError(
            f"the database is not an nsysfrag history (it has tables {listed} but no"
            " schema_version); point --db (or NSYSFRAG_DB) at a new file or database"
        )
    return 0


def require_known(found: int, steps: tuple[Migration, ...] = MIGRATIONS) -> None:
    """Refuse a database written by a newer nsysfrag: its schema cannot be read correctly."""
    if found > len(steps):
        raise InputError(
            f"the history database has schema version {found}, newer than this nsysfrag knows"
            f" ({len(steps)}); upgrade nsysfrag (pip install -U nsysfrag)"
        )


def migrate(connection: Connection, steps: tuple[Migration, ...] = MIGRATIONS) -> int:
    """Apply every missing step inside the caller's transaction; return the version found.

    The caller's transaction must be a writing one (SQLite: BEGIN IMMEDIATE), so that two
    processes upgrading at once take turns; PostgreSQL takes a transaction-scoped lock here.
    """
    if connection.dialect.name == "postgresql":
        connection.execute(select(func.pg_advisory_xact_lock(_PG_LOCK_KEY)))
    found = current_version(connection)
    require_known(found, steps)
    if found < len(steps):
        schema_version.create(connection, checkfirst=True)
    for version in range(found + 1, len(steps) + 1):
        steps[version - 1](connection)
        connection.execute(
            schema_version.insert().values(
                version=version, applied_at=datetime.now(timezone.utc).replace(tzinfo=None)
            )
        )
    return found

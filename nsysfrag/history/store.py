"""The history store: record analyses of runs in a database, and read them back.

SQLite (a file in the user's data folder) by default, PostgreSQL for teams; SQLAlchemy Core.
One run is written in one transaction, so a writer that dies mid-way leaves nothing behind.
Concurrent writers queue: SQLite in WAL mode with a busy timeout and ``BEGIN IMMEDIATE`` (a
transaction that would read first and write later could otherwise fail at once with
SQLITE_BUSY instead of waiting), PostgreSQL by its transactions.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

from sqlalchemy import URL, Connection, CursorResult, Engine, Select, Table, exc, func, select
from sqlalchemy import text, type_coerce
from sqlalchemy.types import NullType

from nsysfrag import __version__
from nsysfrag.errors import InputError
from nsysfrag.history.connection import (
    WRITE,
    check_database_file,
    database_file,
    database_url,
    engine_for,
    explain,
    first_line,
    is_locked,
    location,
    read_only_engine,
    sqlite_file_missing,
    upgraded_copy,
    use_wal,
    wal_without_writer,
)
from nsysfrag.history.integrity import (
    SQLITE_VALUE_ROW_OK,
    check_database,
    extra_value,
    refuse_value_row,
    run_values,
    space_row_values,
    tag_values,
)
from nsysfrag.history.migrations import LATEST, current_version, migrate, require_known
from nsysfrag.history.run_record import RunRecord
from nsysfrag.history.schema import (
    NO_CAPACITY_OVERRIDE,
    SPACE_FIELDS,
    run_space_values,
    run_spaces,
    run_tags,
    runs,
)
from nsysfrag.inputs.nsys.export_file import error_text

@dataclass(frozen=True, slots=True)
class StoredSpace:
    """One space of a stored run: its JSON scalars by path (``peak.global_frag``), and its other
    numeric keys (recorded since schema 4)."""

    values: Mapping[str, Any]
    extra: Mapping[str, float] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return int(self.values["pid"])

    @property
    def device(self) -> int:
        return int(self.values["device"])

    @property
    def health(self) -> str:
        return str(self.values["health"])

    def get(self, path: str) -> Any:
        return self.values[path] if path in self.values else self.extra.get(path)

    def document(self) -> dict[str, Any]:
        """The scalars nested as in the analyze JSON document."""
        doc: dict[str, Any] = {}
        for path, value in self.values.items():
            *parents, leaf = path.split(".")
            node = doc
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return doc


@dataclass(frozen=True, slots=True)
class StoredRun:
    id: int
    recorded_at: datetime  # UTC, aware
    trace_path: str
    trace_sha256: str
    model: str
    granularity_bytes: int
    capacity_override_bytes: int | None
    nsys_version: str | None
    host: str | None
    label: str | None
    nsysfrag_version: str | None
    tags: Mapping[str, str] = field(default_factory=dict)
    spaces: tuple[StoredSpace, ...] = ()
    rank: int | None = None

    @property
    def trace_name(self) -> str:
        return Path(self.trace_path).name

    def document(self, *, spaces: bool = True) -> dict[str, Any]:
        """The run as ``history --json`` writes it (``spaces=False``: with no spaces)."""
        return {
            "id": self.id,
            "recorded_at": self.recorded_at.isoformat(),
            "label": self.label,
            "tags": dict(self.tags),
            "host": self.host,
            "nsysfrag_version": self.nsysfrag_version,
            "rank": self.rank,
            "trace": {
                "path": self.trace_path,
                "name": self.trace_name,
                "sha256": self.trace_sha256,
                "nsys_version": self.nsys_version,
            },
            "model": {
                "name": self.model,
                "granularity_bytes": self.granularity_bytes,
                "capacity_override_bytes": self.capacity_override_bytes,
            },
            "spaces": [s.document() for s in self.spaces] if spaces else [],
        }


@dataclass(frozen=True, slots=True)
class Recorded:
    run_id: int
    created: bool  # False: this trace was already recorded with these options
    # When it was: the label and tags this record gave it that it did not have ("label" first).
    updated: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Which runs to read: every filter must hold (tags are ANDed)."""

    tags: tuple[tuple[str, str], ...] = ()
    label: str | None = None  # a case-insensitive substring
    since: datetime | None = None  # UTC, inclusive
    until: datetime | None = None  # UTC, exclusive
    limit: int | None = None  # the newest N


# ---------------------------------------------------------------- the store


class HistoryStore:
    """A history database, migrated to the current schema when opened for writing or reading.

    Use as a context manager, or call ``close()``.
    """

    def __init__(self, url: URL, *, create: bool = True) -> None:
        self.url = url
        self.location = location(url)
        # How a read-only SQLite file had to be opened, when the user should know.
        self.note: str | None = None
        self._missing = not create and sqlite_file_missing(url)
        self._engine: Engine | None = None
        if self._missing:
            return
        file = database_file(url)
        with self._errors():
            if file is not None:
                check_database_file(file, writing=create)
            if file is not None and not create:
                # Reading never writes: no journal-mode switch, no upgrade of the file.
                self._engine = self._open_read_only(file)
                return
            self._engine = engine_for(url)
            self._upgrade()

    def __enter__(self) -> HistoryStore:  # noqa: PYI034 (typing.Self needs Python 3.11)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except exc.DBAPIError as err:
            message = first_line(err.orig) if err.orig is not None else first_line(err)
            server = self.url.get_backend_name() != "sqlite"
            raise InputError(explain(self.location, message, err, server=server)) from None
        except sqlite3.Error as err:  # from the driver's own connection (journal mode, copy)
            raise InputError(explain(self.location, first_line(err), err, server=False)) from None
        except UnicodeDecodeError as err:  # SQLite's message quoted bytes that are not UTF-8
            raise InputError(
                explain(self.location, error_text(err), err, server=False)
            ) from None
        except exc.NoSuchModuleError:
            raise InputError(
                f"{self.location}: unsupported database; use an SQLite path or"
                " postgresql+psycopg://USER@HOST:PORT/DB"
            ) from None
        except ModuleNotFoundError as err:
            raise InputError(
                f"{self.location}: the database driver {err.name!r} is not installed;"
                " pip install 'nsysfrag[postgres]' for PostgreSQL"
            ) from None
        except exc.SQLAlchemyError as err:
            raise InputError(f"history database {self.location}: {first_line(err)}") from None

    def _connect(self, *, write: bool) -> Connection:
        assert self._engine is not None
        connection = self._engine.connect()
        if write:
            connection.execution_options(**{WRITE: True})
        return connection

    def _open_read_only(self, file: Path) -> Engine:
        """The file opened read-only; as immutable when even that fails (a WAL database on
        read-only storage, which cannot get its shared-memory file), saying so; upgraded in a
        copy in memory when an older nsysfrag wrote it. A WAL database with no -wal file
        beside it (no writer has it open) is read as immutable at once: a read-only
        connection would leave a -shm and a -wal file behind."""
        idle_wal = wal_without_writer(file)
        for immutable in (idle_wal, True):
            engine = read_only_engine(file, immutable=immutable)
            try:
                with engine.connect() as connection, connection.begin():
                    check_database(connection, self.location)
                    version = current_version(connection)
            except exc.OperationalError as err:
                engine.dispose()
                # Locked is not read-only storage: read as immutable, the file would show the
                # other writer's uncommitted pages. Its wait was the busy timeout; say so.
                if immutable or is_locked(first_line(err.orig if err.orig is not None else err)):
                    raise
                continue
            if immutable and not idle_wal:
                self.note = (
                    f"{self.location} is on read-only storage; read as an immutable file (a run"
                    " recorded elsewhere at this moment may not show)"
                )
            require_known(version)
            if version < LATEST:
                engine = upgraded_copy(engine)
            return engine
        raise AssertionError("unreachable")

    def _upgrade(self) -> None:
        with self._connect(write=False) as connection:
            with connection.begin():
                check_database(connection, self.location)
                version = current_version(connection)  # refuses a database that is not ours
            if connection.dialect.name == "sqlite":
                use_wal(connection)
            if version == LATEST:
                return
        with self._connect(write=True) as connection, connection.begin():
            migrate(connection)

    def record(self, run: RunRecord) -> Recorded:
        """Store ``run`` in one transaction, unless the same trace was recorded with the same
        options (model, granularity, capacity override): then that run takes this record's
        label and tags (a tag's new value replaces its old one; other tags stay), and is
        returned with what changed."""
        assert self._engine is not None, "record() needs a store opened with create=True"
        with self._errors(), self._connect(write=True) as connection:
            try:
                with connection.begin():
                    # Looking first spares PostgreSQL a sequence number per duplicate; the
                    # unique constraint still settles two writers racing on the same trace.
                    existing = _find_run(connection, run)
                    if existing is not None:
                        return Recorded(existing, False, _relabel(connection, existing, run))
                    run_id = _insert_run(connection, run)
                    _insert_spaces(connection, run_id, run.spaces)
                    _insert_values(connection, run_id, run.spaces, run.values)
                    _insert_tags(connection, run_id, run.tags)
            except exc.IntegrityError:
                with connection.begin():
                    existing = _find_run(connection, run)
                    if existing is None:
                        raise
                    return Recorded(existing, False, _relabel(connection, existing, run))
            return Recorded(run_id, created=True)

    def runs(
        self, query: RunQuery = RunQuery(), *, values: bool | frozenset[str] = True
    ) -> list[StoredRun]:
        """The runs that match ``query``, newest first (``values``: as :meth:`iter_runs`)."""
        return list(self.iter_runs(query, values=values))

    def iter_runs(
        self,
        query: RunQuery = RunQuery(),
        chunk: int = 500,
        *,
        values: bool | frozenset[str] = True,
    ) -> Iterator[StoredRun]:
        """:meth:`runs` one at a time, read ``chunk`` runs at a time in one read transaction:
        a history of 200,000 runs (10 M values) streams in the memory of one chunk.

        With ``values=False`` the spaces come without their other numeric keys (``extra``),
        for a reader that shows none: those are checked all the same, in SQLite itself where
        it can (10 M values fetched into Python took 9 s of 20 s). With a set of paths, only
        those keys come (a trend draws one), the others checked as with ``False``."""
        if self._engine is None:
            return
        with self._errors(), self._connect(write=False) as connection, connection.begin():
            ids = [row[0] for row in connection.execute(_matching_ids(query))]
            wanted: bool | frozenset[str] | None = values
            if values is False and connection.dialect.name == "sqlite" and query == RunQuery():
                # Every run: the table read in its own order is 5 s of checks for 10 M
                # values, by run 7 s; and every value is checked before the first run is out.
                self._check_every_value(connection)
                wanted = None  # checked
            for part in _chunks(ids, chunk):
                yield from self._chunk_of_runs(connection, part, wanted)

    def count(self, query: RunQuery = RunQuery()) -> int:
        """How many runs match ``query`` (its limit included), without reading them."""
        if self._engine is None:
            return 0
        with self._errors(), self._connect(write=False) as connection, connection.begin():
            counted = select(func.count()).select_from(_matching_ids(query).subquery())
            return int(connection.execute(counted).scalar_one())

    def _check_every_value(self, connection: Connection, rows: int = 1_000_000) -> None:
        """Refuse the history if any ``run_space_values`` row holds a value nsysfrag never
        stores: in SQLite, ``rows`` rows of the table per statement (each statement's work
        is bounded)."""
        last = connection.exec_driver_sql("SELECT max(rowid) FROM run_space_values").scalar()
        columns = ", ".join(c.name for c in run_space_values.c)
        find = text(
            f"SELECT {columns} FROM run_space_values WHERE rowid > :lo AND rowid <= :hi"
            f" AND NOT ({SQLITE_VALUE_ROW_OK}) LIMIT 1"
        )
        for lo in range(0, int(last or 0), rows):
            bad = connection.execute(find, {"lo": lo, "hi": lo + rows}).mappings().first()
            if bad is not None:
                refuse_value_row(bad, self.location)

    def _chunk_of_runs(
        self, connection: Connection, ids: list[int], values: bool | frozenset[str] | None = True
    ) -> list[StoredRun]:
        """The runs ``ids``, in that order, with their tags, spaces and (``values``) their
        spaces' other numeric keys; those are checked either way (None: they were)."""
        found = {
            row["id"]: row
            for row in (
                run_values(r, self.location)
                for r in _dicts(connection.execute(select(*_raw(runs)).where(runs.c.id.in_(ids))))
            )
        }
        rows = [found[i] for i in ids if i in found]
        tags: dict[int, dict[str, str]] = {r["id"]: {} for r in rows}
        spaces: dict[int, list[StoredSpace]] = {r["id"]: [] for r in rows}
        extra: dict[tuple[int, int, int, str], dict[str, float]] = {}
        ours = select(*_raw(run_space_values)).where(run_space_values.c.run_id.in_(ids))
        # Which keys to keep: all (True), these paths, or none (False; None: checked already).
        keep: frozenset[str] | None = (
            None if values is True else frozenset() if values is None or values is False else values
        )
        if keep is not None and values is not None and connection.dialect.name == "sqlite":
            bad = connection.execute(
                ours.where(text(f"NOT ({SQLITE_VALUE_ROW_OK})")).limit(1)
            ).mappings().first()
            if bad is not None:
                refuse_value_row(bad, self.location)
            ours = ours.where(run_space_values.c.path.in_(sorted(keep)))  # the rest: checked
        if values is not None:
            for v in _dicts(connection.execute(ours)):
                owner, path, value = extra_value(v, self.location)
                if keep is None or path in keep:
                    extra.setdefault(owner, {})[path] = value
        for t in _dicts(connection.execute(
            select(*_raw(run_tags)).where(run_tags.c.run_id.in_(ids)).order_by(run_tags.c.key)
        )):
            run_id, key, value = tag_values(t, self.location)
            tags[run_id][key] = value
        for s in _dicts(connection.execute(
            select(*_raw(run_spaces))
            .where(run_spaces.c.run_id.in_(ids))
            .order_by(run_spaces.c.pid, run_spaces.c.device, run_spaces.c.model)
        )):
            owner = (s["run_id"], s["pid"], s["device"], s["model"])
            scalars = space_row_values(s, self.location)
            spaces[s["run_id"]].append(StoredSpace(scalars, extra.get(owner, {})))
        return [
            StoredRun(
                id=row["id"],
                recorded_at=row["recorded_at"].replace(tzinfo=timezone.utc),
                trace_path=row["trace_path"],
                trace_sha256=row["trace_sha256"],
                model=row["model"],
                granularity_bytes=row["granularity_bytes"],
                capacity_override_bytes=row["capacity_override_bytes"] or None,
                nsys_version=row["nsys_version"],
                host=row["host"],
                label=row["label"],
                nsysfrag_version=row["nsysfrag_version"],
                tags=tags[row["id"]],
                spaces=tuple(spaces[row["id"]]),
                rank=row["rank"],
            )
            for row in rows
        ]


def open_store(url: str | URL | None = None, *, create: bool = True) -> HistoryStore:
    """Open (and create or upgrade) the history database named by ``url`` (see database_url).

    With ``create=False`` a missing SQLite file is not created: the store reads as empty.
    """
    return HistoryStore(url if isinstance(url, URL) else database_url(url), create=create)


# ---------------------------------------------------------------- internals


def _insert_run(connection: Connection, run: RunRecord) -> int:
    recorded_at = run.recorded_at or datetime.now(timezone.utc)
    result = connection.execute(
        runs.insert().values(
            recorded_at=_naive_utc(recorded_at),
            trace_path=run.trace_path,
            trace_sha256=run.trace_sha256,
            nsys_version=run.nsys_version,
            host=run.host,
            label=run.label,
            model=run.model,
            granularity_bytes=run.granularity_bytes,
            capacity_override_bytes=run.capacity_override_bytes or NO_CAPACITY_OVERRIDE,
            nsysfrag_version=__version__,
            rank=run.rank,
        )
    )
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def _insert_spaces(
    connection: Connection, run_id: int, spaces: Sequence[Mapping[str, Any]]
) -> None:
    if spaces:
        connection.execute(
            run_spaces.insert(),
            [{"run_id": run_id, **{f.column: s.get(f.path) for f in SPACE_FIELDS}} for s in spaces],
        )


def _insert_values(
    connection: Connection,
    run_id: int,
    spaces: Sequence[Mapping[str, Any]],
    values: Sequence[Mapping[str, float]],
) -> None:
    rows = [
        {"run_id": run_id, "pid": s["pid"], "device": s["device"], "model": s["model"],
         "path": path, "value": float(value)}
        for s, keyed in zip(spaces, values, strict=False)
        for path, value in keyed.items()
    ]  # fmt: skip
    if rows:
        connection.execute(run_space_values.insert(), rows)


def _insert_tags(connection: Connection, run_id: int, tags: Sequence[tuple[str, str]]) -> None:
    if tags:
        connection.execute(
            run_tags.insert(), [{"run_id": run_id, "key": k, "value": v} for k, v in tags]
        )


def _relabel(connection: Connection, run_id: int, run: RunRecord) -> tuple[str, ...]:
    """Give stored run ``run_id`` the label and tags of ``run``; return what changed."""
    changed: list[str] = []
    if run.label is not None:
        old = connection.execute(select(runs.c.label).where(runs.c.id == run_id)).scalar()
        if old != run.label:
            connection.execute(runs.update().where(runs.c.id == run_id).values(label=run.label))
            changed.append("label")
    stored = {
        row.key: row.value
        for row in connection.execute(select(run_tags).where(run_tags.c.run_id == run_id))
    }
    for key, value in run.tags:
        if stored.get(key) == value:
            continue
        if key in stored:
            connection.execute(
                run_tags.update()
                .where(run_tags.c.run_id == run_id, run_tags.c.key == key)
                .values(value=value)
            )
        else:
            _insert_tags(connection, run_id, [(key, value)])
        changed.append(f"{key}={value}")
    return tuple(changed)


def _find_run(connection: Connection, run: RunRecord) -> int | None:
    found = connection.execute(
        select(runs.c.id).where(
            runs.c.trace_sha256 == run.trace_sha256,
            runs.c.model == run.model,
            runs.c.granularity_bytes == run.granularity_bytes,
            runs.c.capacity_override_bytes == (run.capacity_override_bytes or NO_CAPACITY_OVERRIDE),
        )
    ).scalar()
    return None if found is None else int(found)


def _matching_ids(query: RunQuery) -> Select[Any]:
    """The ids of the runs ``query`` matches, newest first."""
    stmt = select(type_coerce(runs.c.id, NullType()).label("id")).order_by(
        runs.c.recorded_at.desc(), runs.c.id.desc()
    )
    for key, value in query.tags:
        stmt = stmt.where(
            runs.c.id.in_(
                select(run_tags.c.run_id).where(run_tags.c.key == key, run_tags.c.value == value)
            )
        )
    if query.label:
        stmt = stmt.where(runs.c.label.icontains(query.label, autoescape=True))
    if query.since is not None:
        stmt = stmt.where(runs.c.recorded_at >= _naive_utc(query.since))
    if query.until is not None:
        stmt = stmt.where(runs.c.recorded_at < _naive_utc(query.until))
    if query.limit is not None:
        stmt = stmt.limit(query.limit)
    return stmt


def _dicts(result: CursorResult[Any]) -> Iterator[dict[str, Any]]:
    """The rows as plain dicts: a RowMapping's ``get`` is a Python call, 1.7 M of them for
    20,000 runs."""
    keys = list(result.keys())
    for row in result.all():  # one fetchall: a chunk's rows, not one fetchone call each
        yield dict(zip(keys, row, strict=True))


def _raw(table: Table) -> list[Any]:
    """The table's columns as the driver hands them (no type's conversion, which would fail
    on a value nsysfrag never stores before ``integrity`` can name it)."""
    return [type_coerce(c, NullType()).label(c.name) for c in table.c]


def _naive_utc(moment: datetime) -> datetime:
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc).replace(tzinfo=None)
    return moment


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]



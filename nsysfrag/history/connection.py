"""Where the history database is, and how to connect to it.

``--db``, ``$NSYSFRAG_DB`` or the default SQLite file name the database; SQLite gets WAL, a busy
timeout and ``BEGIN IMMEDIATE`` for writers, and a read-only connection for readers (which never
write: no journal-mode switch, no upgrade of the file); driver errors become one line that says
what to do.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import URL, Connection, Engine, create_engine, event, exc, make_url
from sqlalchemy.pool import NullPool, StaticPool

from nsysfrag import limits
from nsysfrag.errors import InputError
from nsysfrag.history.migrations import migrate

ENV_VAR = "NSYSFRAG_DB"
CONNECT_TIMEOUT_S = 10
WRITE = "nsysfrag_write"  # the execution option that makes a transaction a writing one


def busy_timeout_s() -> float:
    """How long a statement waits for another writer's lock (``limits.HISTORY_LOCK_SECONDS``)."""
    return limits.HISTORY_LOCK_SECONDS.value()


def is_locked(message: str) -> bool:
    lowered = message.lower()
    return "locked" in lowered or "busy" in lowered


def default_path(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_DATA_HOME/nsysfrag/history.sqlite``, else ``~/.local/share/nsysfrag/...``."""
    data_home = environ.get("XDG_DATA_HOME", "")
    # The XDG spec says to ignore a relative XDG_DATA_HOME.
    base = Path(data_home) if os.path.isabs(data_home) else Path.home() / ".local" / "share"
    return base / "nsysfrag" / "history.sqlite"


def database_url(explicit: str | None = None, environ: Mapping[str, str] = os.environ) -> URL:
    """The database to use: ``--db``, else ``$NSYSFRAG_DB``, else the default SQLite file.

    A value without ``://`` is a path to an SQLite file; ``postgresql://`` means psycopg 3.
    """
    if explicit is not None and not explicit.strip():
        raise InputError("--db '': empty; give an SQLite path or a database URL")
    if explicit == "-":
        raise InputError("--db -: the history is a database, not stdout; give an SQLite path")
    given = explicit or environ.get(ENV_VAR) or None
    if given is None:
        return URL.create("sqlite", database=str(default_path(environ)))
    if "://" not in given:
        return URL.create("sqlite", database=str(Path(given).expanduser()))
    try:
        url = make_url(given)
    except (exc.ArgumentError, ValueError):
        raise InputError(
            f"--db {given!r}: not a database URL; use a file path, sqlite:///PATH or"
            " postgresql+psycopg://USER@HOST:PORT/DB"
        ) from None
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return url


def database_file(url: URL) -> Path | None:
    """The file of an SQLite database, None for a server or an in-memory database."""
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        return Path(str(url.database))
    return None


def location(url: URL) -> str:
    """How to name the database to a user: the file of SQLite, else the URL sans password."""
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        return str(url.database)
    return url.render_as_string(hide_password=True)


def sqlite_file_missing(url: URL) -> bool:
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return False
    return not Path(str(url.database)).exists()


# The files SQLite opens beside a database (and would write through a link there).
SIDE_FILES = ("-wal", "-shm", "-journal")
DB_WRITER = "--db"  # how the history store names itself to nsysfrag.destinations


def check_database_file(path: Path, *, writing: bool) -> None:
    """Refuse, before SQLite opens it, a database file that is not a regular file (a FIFO would
    block the open forever, a device never ends) or, to write, a file this run keeps (its
    input, a baseline, an output: ``nsysfrag.destinations``), a link to nothing, or a link or
    special file where SQLite keeps its journal and WAL. A missing file is created here, never
    through a link; reading, it is simply absent."""
    from nsysfrag import destinations

    where = os.fsencode(path).decode("utf-8", "backslashreplace")
    if writing:
        why = destinations.refusal(path, DB_WRITER)
        if why is not None:
            raise InputError(f"--db {where}: {why}")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputError(
                f"--db {where}: a link to a file that does not exist; nsysfrag creates no file"
                " through a link: point --db (or NSYSFRAG_DB) at the file itself"
            ) from None
        st = None
    except OSError as err:
        raise InputError(f"--db {where}: cannot be used ({err.strerror})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
        raise InputError(
            f"--db {where}: is {kind}, not a history database file; point --db (or"
            " NSYSFRAG_DB) at an SQLite file"
        )
    if not writing:
        return
    for suffix in SIDE_FILES:
        side = Path(f"{os.fspath(path)}{suffix}")
        try:
            side_st = os.lstat(side)
        except FileNotFoundError:
            continue
        except OSError:
            continue
        if not stat.S_ISREG(side_st.st_mode):
            raise InputError(
                f"--db {where}: {side.name} beside it is a link or a special file, where SQLite"
                " writes its journal; nsysfrag never writes through it: remove it"
            )
    if st is None:
        make_parent(path)
        destinations.create_empty(path, DB_WRITER)


def wal_without_writer(path: Path) -> bool:
    """A database in WAL mode (header bytes 18-19) with no -wal file beside it: nobody is
    writing it, and nothing is waiting in a WAL to be merged."""
    try:
        with open(path, "rb") as f:
            header = f.read(20)
    except OSError:
        return False
    return len(header) == 20 and 2 in header[18:20] and not os.path.lexists(f"{path}-wal")


def make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(
            f"{path}: cannot create its folder ({err.strerror}); choose another --db path"
        ) from None


def engine_for(url: URL) -> Engine:
    backend = url.get_backend_name()
    if backend == "sqlite":
        engine = create_engine(url, poolclass=NullPool, connect_args={"timeout": busy_timeout_s()})
        return _sqlite_events(engine)
    args: dict[str, Any] = {}
    if backend == "postgresql" and "connect_timeout" not in url.query:
        args["connect_timeout"] = CONNECT_TIMEOUT_S
    return create_engine(url, poolclass=NullPool, connect_args=args)


class WorkClock:
    """How long SQLite has worked on the current statement, waits for a lock left out: the
    progress handler runs every few instructions, and a gap between two calls longer than
    ``WAIT_S`` is time spent waiting (the busy timeout), not working. Past
    ``limits.HISTORY_SECONDS`` the statement is interrupted."""

    EVERY = 100  # instructions: the history's statements are small, and one may make 1 MiB
    WAIT_S = 2.0

    def __init__(self) -> None:
        self.limit = limits.HISTORY_SECONDS.value()
        self.spent = 0.0
        self.last: float | None = None
        self.exceeded = False

    def restart(self) -> None:
        self.spent, self.last = 0.0, None

    def tick(self) -> int:
        now = time.monotonic()
        if self.last is not None and now - self.last < self.WAIT_S:
            self.spent += now - self.last
        self.last = now
        if self.spent > self.limit:
            self.exceeded = True
            return 1
        return 0


def bound_work(dbapi_connection: sqlite3.Connection, record: Any | None = None) -> None:
    """Bound an SQLite connection to the history: no value over limits.HISTORY_VALUE_BYTES,
    no statement working longer than limits.HISTORY_SECONDS (``WorkClock``), text that is not
    UTF-8 decoded with U+FFFD."""
    limits.limit_sqlite_values(dbapi_connection, int(limits.HISTORY_VALUE_BYTES.value()))
    # Text that is not UTF-8 (a hand-edited label) reads with U+FFFD, as a trace's does.
    dbapi_connection.text_factory = lambda value: value.decode("utf-8", "replace")
    clock = WorkClock()
    dbapi_connection.set_progress_handler(clock.tick, WorkClock.EVERY)
    if record is not None:
        record.info[_CLOCK] = clock


_CLOCK = "nsysfrag_work_clock"


def _restart_clock(connection: Connection, *args: Any) -> None:
    clock = connection.connection.info.get(_CLOCK)
    if clock is not None:
        clock.restart()


def _sqlite_events(engine: Engine) -> Engine:
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    event.listen(engine, "before_cursor_execute", _restart_clock)
    return engine


def _sqlite_connect(dbapi_connection: Any, record: Any) -> None:
    bound_work(dbapi_connection, record)
    # Take transactions out of the sqlite3 module's hands so that _sqlite_begin decides how
    # each one starts (the SQLAlchemy recipe for SQLite transactions).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s() * 1000)}")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def use_wal(connection: Connection) -> None:
    """WAL: readers never block the writer, and a writer that dies leaves no hot journal.

    Set once it is known the file is ours (the mode is stored in the file), outside any
    transaction (SQLite refuses to switch inside one).
    """
    # On the driver's connection: through SQLAlchemy the statement would open a transaction.
    raw = connection.connection.driver_connection
    assert raw is not None
    if raw.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        raw.execute("PRAGMA journal_mode = WAL")


def read_only_engine(file: Path, *, immutable: bool) -> Engine:
    uri = f"file:{quote(str(file.resolve()))}?mode=ro" + ("&immutable=1" if immutable else "")

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(uri, uri=True, timeout=busy_timeout_s())

    return _sqlite_events(create_engine("sqlite://", creator=connect, poolclass=NullPool))


def upgraded_copy(engine: Engine) -> Engine:
    """An in-memory copy of the database, upgraded to the current schema (the file is not)."""
    memory = _sqlite_events(create_engine("sqlite://", poolclass=StaticPool))
    with engine.connect() as source, memory.connect() as target:
        source_raw, target_raw = source.connection.driver_connection, target.connection.driver_connection
        assert source_raw is not None and target_raw is not None
        source_raw.backup(target_raw)
    engine.dispose()
    with memory.connect() as connection, connection.begin():
        migrate(connection)
    return memory


def _sqlite_begin(connection: Connection) -> None:
    # A writer takes the write lock up front, waiting up to the busy timeout; a deferred
    # transaction that upgrades from reading to writing fails at once when another committed.
    write = connection.get_execution_options().get(WRITE, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def explain(where: str, message: str, err: Exception, *, server: bool) -> str:
    lowered = message.lower()
    if lowered == "interrupted":
        return (
            f"{where}: a query worked for more than {limits.HISTORY_SECONDS.value():g} s, which"
            " no history nsysfrag writes needs: the database is damaged or not nsysfrag's; move"
            f" it away or point --db (or NSYSFRAG_DB) at another one (or raise"
            f" {limits.HISTORY_SECONDS.env})"
        )
    if "too big" in lowered:
        return (
            f"{where}: it holds a value larger than {limits.HISTORY_VALUE_BYTES.value():,.0f}"
            " bytes, which nsysfrag never stores: the database is damaged or not nsysfrag's;"
            " move it away or point --db (or NSYSFRAG_DB) at another one"
        )
    if "not a database" in lowered or "malformed" in lowered:
        return (
            f"{where}: not a readable history database ({message}); move the file away or"
            " point --db (or NSYSFRAG_DB) at another one"
        )
    if is_locked(message):
        return (
            f"{where}: locked by another writer (for more than {busy_timeout_s():g} s,"
            f" {limits.HISTORY_LOCK_SECONDS.env}); try again"
        )
    if "unable to open" in lowered or "readonly" in lowered or "read-only" in lowered:
        return f"{where}: cannot open it for writing ({message}); check the path and permissions"
    if isinstance(err, exc.OperationalError) and server:
        return (
            f"cannot use the history database {where}: {message}; check that the server is up and"
            " the URL is right (--db or NSYSFRAG_DB)"
        )
    return f"history database {where}: {message}"

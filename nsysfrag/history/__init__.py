"""Fragmentation history across runs: a database of recorded analyses, trends and a check.

``connection`` says where the database is and how to reach it; ``run_record`` is what one run
is as stored (made from an analyze JSON document); ``store`` reads and writes it
(``migrations`` keeps its schema current, ``schema`` describes it); ``trends`` computes series
and regressions from stored runs; ``render`` and ``chart`` show them.
"""

from __future__ import annotations

from nsysfrag.history.connection import database_file, database_url, default_path
from nsysfrag.history.run_record import RunRecord, parse_tags
from nsysfrag.history.store import (
    HistoryStore,
    Recorded,
    RunQuery,
    StoredRun,
    StoredSpace,
    open_store,
)

__all__ = [
    "HistoryStore",
    "Recorded",
    "RunQuery",
    "RunRecord",
    "StoredRun",
    "StoredSpace",
    "database_file",
    "database_url",
    "default_path",
    "open_store",
    "parse_tags",
]

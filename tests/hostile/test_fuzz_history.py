"""Fuzz: damaged history databases and JSON documents hold the hostile-input contract.

History databases: copies of one nsysfrag recorded, with cells set to NULL, text, blobs,
floats, extreme integers and huge strings, tables loosened (no types, no NOT NULL), views,
triggers, indexes and tables added, schema versions changed, bytes flipped; then a ``history``
command or a ``--record`` runs on the result. JSON documents: an analysis document and a job's,
with any node replaced by a hostile value (written as JSON text: 1e400, 5,000 digits, NaN),
deleted, wrapped in a list or nested deep; then ``compare`` or ``--baseline`` reads it.
Each runs in this process (``in_process.run_in_process``). CI runs a few examples
(tests/conftest.py: FUZZ_CI_EXAMPLES); ``--hypothesis-profile fuzz`` or
``NSYSFRAG_FUZZ_EXAMPLES=N`` run thousands.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import SAMPLES, fuzz_examples
from tests.hostile.contract import run_nsysfrag
from tests.hostile.in_process import run_in_process
from tests.hostile.test_fuzz_sqlite import VALUES

TRACES = [SAMPLES / "multi_gpu.sqlite", SAMPLES / "caching_allocator.sqlite"]
SETTINGS = settings(
    max_examples=fuzz_examples(),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture],
)  # fmt: skip


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("history") / "history.sqlite"
    for trace in TRACES:
        run_nsysfrag(["analyze", trace, "-q", "--record", "--db", db, "--label", trace.stem,
                      "--tag", f"trace={trace.stem}"])  # fmt: skip
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode = DELETE")  # one file to copy and damage
    con.close()
    return db


def _columns(db: Path) -> dict[str, list[str]]:
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')] for t in tables}
    finally:
        con.close()


ENDLESS = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT max(i) FROM n"


@st.composite
def history_damage(draw: st.DrawFn, schema: dict[str, list[str]]) -> list[str]:
    table = draw(st.sampled_from(sorted(schema)))
    column = draw(st.sampled_from(schema[table]))
    kind = draw(st.sampled_from(["cell", "cell", "cell", "column", "loosen", "view", "trigger",
                                 "index", "table", "version", "drop_column"]))  # fmt: skip
    if kind == "cell":
        row = f"(SELECT rowid FROM {table} LIMIT 1 OFFSET {draw(st.integers(0, 3))})"
        return [f'UPDATE {table} SET "{column}" = {draw(VALUES)} WHERE rowid = {row}']
    if kind == "column":
        return [f'UPDATE {table} SET "{column}" = {draw(VALUES)}']
    if kind == "loosen":
        return [f"CREATE TABLE loose AS SELECT * FROM {table}", f"DROP TABLE {table}",
                f"ALTER TABLE loose RENAME TO {table}"]  # fmt: skip
    if kind == "view":
        return [f"ALTER TABLE {table} RENAME TO hidden",
                f"CREATE VIEW {table} AS SELECT h.* FROM hidden h, ({ENDLESS})"]  # fmt: skip
    if kind == "trigger":
        return [f"CREATE TRIGGER t AFTER INSERT ON {table} BEGIN SELECT ({ENDLESS}); END"]
    if kind == "index":
        return [f'CREATE INDEX i ON {table} ("{column}")']
    if kind == "table":
        return ["CREATE TABLE other (x)"]
    if kind == "version":
        return [f"INSERT INTO schema_version VALUES ({draw(VALUES)}, '2025-01-01')"]
    return [f'ALTER TABLE {table} DROP COLUMN "{column}"']


COMMANDS = [["history"], ["history", "--json", "-"], ["history", "--trend", "global_frag"],
            ["history", "--check"], ["history", "--tag", "trace=multi_gpu", "--label", "m"],
            ["analyze", str(SAMPLES / "churn_anomalies.sqlite"), "-q", "--record"]]  # fmt: skip


def _damaged(recorded: Path, statements: list[list[str]], flips: list[tuple[int, int]]) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "history.sqlite"
        shutil.copy(recorded, db)
        con = sqlite3.connect(db)
        try:
            for group in statements:
                try:
                    for statement in group:
                        con.execute(statement)
                    con.commit()
                except sqlite3.Error:  # a constraint, a column an index needs
                    con.rollback()
        finally:
            con.close()
        data = bytearray(db.read_bytes())
        for at, bit in flips:
            data[at % len(data)] ^= 1 << bit
        db.write_bytes(bytes(data))
        yield db


def test_damaged_history_databases_hold_the_contract(recorded: Path) -> None:
    schema = _columns(recorded)
    size = recorded.stat().st_size

    @SETTINGS
    @given(
        st.lists(history_damage(schema), max_size=3),
        st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, 7)), max_size=2),
        st.sampled_from(COMMANDS),
    )
    def check(statements: list[list[str]], flips: list[tuple[int, int]], argv: list[str]) -> None:
        for db in _damaged(recorded, statements, flips):
            reading = argv[0] == "history"  # --record may write it, when it is nsysfrag's
            run_in_process([*argv, "--db", str(db)], inputs=[db] if reading else [],
                           allowed_codes=(0, 1, 2))  # fmt: skip

    check()


# ---------------------------------------------------------------- JSON documents

HOSTILE_LITERALS = ["1e400", "-1e400", "NaN", "Infinity", "9" * 5000, "1" + "0" * 400, "null",
                    "true", '"ok"', '"critical"', '"\u001b[2J"', "[]", "{}", "[[[[[[[[1]]]]]]]]",
                    "-0", "2.5", str(2**64), str(-(2**63) - 1), '"' + "x" * 10000 + '"']  # fmt: skip
_MARK = "@@hostile@@"


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("docs")
    single = folder / "single.json"
    run_nsysfrag(["analyze", TRACES[0], "-q", "--json", single])
    ranks = folder / "ranks"
    ranks.mkdir()
    for r, trace in enumerate(TRACES):
        shutil.copy(trace, ranks / f"rank{r}.sqlite")
    job = folder / "job.json"
    run_nsysfrag(["analyze", ranks, "-q", "--jobs", "1", "--json", job],
                 notes=("nsysfrag: analyzing 2 ranks",))  # fmt: skip
    return {"single": json.loads(single.read_text()), "job": json.loads(job.read_text())}


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a document, but inside timelines and histograms (long, and read by no
    comparison): their containers still count."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            if k not in ("timeline", "histograms", "hotspots"):
                yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:3]):
            yield from _paths(v, (*prefix, i))


def _mutated(doc: Any, path: tuple[Any, ...], how: str) -> str:
    """The document as JSON text with the node at ``path`` changed as ``how`` says (a hostile
    literal is spliced into the text, since json.dumps would not write 5,000 digits as asked)."""
    copy = json.loads(json.dumps(doc))
    if not path:
        return how if how in HOSTILE_LITERALS else json.dumps([copy])
    parent = copy
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if how == "delete":
        del parent[last]
    elif how == "wrap":
        parent[last] = [parent[last]]
    else:
        parent[last] = _MARK
    return json.dumps(copy).replace(json.dumps(_MARK), how)


@st.composite
def hostile_documents(draw: st.DrawFn, docs: dict[str, Any]) -> tuple[str, str]:
    kind = draw(st.sampled_from(sorted(docs)))
    doc = docs[kind]
    places = list(_paths(doc))
    texts = json.dumps(doc)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(places))
        how = draw(st.sampled_from(["delete", "wrap", *HOSTILE_LITERALS]))
        try:
            texts = _mutated(json.loads(texts), path, how)
        except (KeyError, IndexError, TypeError, ValueError):
            pass  # a place an earlier change removed, or text json cannot read back
    return kind, texts


def test_hostile_json_documents_hold_the_contract(documents: dict[str, Any]) -> None:
    @SETTINGS
    @given(hostile_documents(documents), st.sampled_from(["compare", "compare-reversed", "baseline"]))
    def check(case: tuple[str, str], command: str) -> None:
        kind, text = case
        with tempfile.TemporaryDirectory() as folder:
            good, bad = Path(folder) / "good.json", Path(folder) / "bad.json"
            good.write_text(json.dumps(documents[kind]))
            bad.write_text(text)
            argv = {
                "compare": ["compare", str(good), str(bad)],
                "compare-reversed": ["compare", str(bad), str(good)],
                "baseline": ["analyze", str(TRACES[0]), "-q", "--baseline", str(bad)],
            }[command]
            run_in_process(argv, inputs=[good, bad], allowed_codes=(0, 1, 2))

    check()

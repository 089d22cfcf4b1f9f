"""The history database (``--record``, ``nsysfrag history``): against SQLite always, and against
a real PostgreSQL server when NSYSFRAG_TEST_POSTGRES_URL names one (`.ci/run` starts one)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import MetaData, create_engine, func, inspect, select, text
from sqlalchemy.pool import NullPool

from nsysfrag.cli import cli
from nsysfrag.errors import InputError
from nsysfrag.history import (
    Recorded,
    RunQuery,
    RunRecord,
    database_url,
    default_path,
    open_store,
    parse_tags,
)
from nsysfrag.history.migrations import LATEST, MIGRATIONS, migrate
from nsysfrag.history.schema import SPACE_FIELDS, TABLES, metadata, run_spaces, run_tags, runs
from nsysfrag.history.run_record import flatten_space
from nsysfrag.history.trends import check, resolve_metric, series, sparkline
from tests.conftest import REPO, SAMPLES

POSTGRES_URL = os.environ.get("NSYSFRAG_TEST_POSTGRES_URL")
TRAINING = SAMPLES / "training_loop.sqlite"
INFERENCE = SAMPLES / "inference_serving.sqlite"
MULTI_GPU = SAMPLES / "multi_gpu.sqlite"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
GiB = 1 << 30

BACKENDS = [
    "sqlite",
    pytest.param(
        "postgresql",
        marks=pytest.mark.skipif(
            not POSTGRES_URL, reason="set NSYSFRAG_TEST_POSTGRES_URL to test against PostgreSQL"
        ),
    ),
]


# ---------------------------------------------------------------- fixtures and builders


@pytest.fixture(autouse=True)
def _no_user_history(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Never touch the real ~/.local/share/nsysfrag from a test."""
    monkeypatch.delenv("NSYSFRAG_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


def _reset_postgres(url: str) -> None:
    engine = create_engine(url, poolclass=NullPool)
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE IF EXISTS " + ", ".join(TABLES) + " CASCADE"))
    engine.dispose()


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty history database: an SQLite file, or the PostgreSQL test database emptied."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'history.sqlite'}"
        return
    assert POSTGRES_URL is not None
    _reset_postgres(POSTGRES_URL)
    yield POSTGRES_URL
    _reset_postgres(POSTGRES_URL)


def space_doc(
    pid: int = 100,
    device: int = 0,
    global_frag: float = 0.1,
    free_blocks: int = 10,
    local_frag: float = 0.2,
    health: str = "ok",
) -> dict[str, Any]:
    """A SPEC §6 space with every scalar (and none of the lists the history ignores)."""
    state = {
        "time_ns": 5_000,
        "global_frag": global_frag,
        "local_frag": local_frag,
        "free_blocks": free_blocks,
        "largest_free_bytes": 40 * GiB,
        "free_bytes": 60 * GiB,
        "live_bytes": 20 * GiB,
    }
    return {
        "pid": pid,
        "device": device,
        "device_name": "NVIDIA H100 80GB HBM3",
        "process_name": "python3",
        "model": "observed",
        "capacity_bytes": 80 * GiB,
        "base_address": 0x7F00_0000_0000,
        "span_mode": False,
        "counts": {
            "allocations": 7,
            "frees": 6,
            "unmatched_frees": 0,
            "overlaps": 0,
            "zero_size_allocs": 0,
            "failed_allocations": 0,
            "other_kind_events": 1,
        },
        "alloc_failure_rate": 0.0,
        "peak": state,
        "max": {
            "global_frag": global_frag,
            "local_frag": local_frag,
            "free_blocks": free_blocks,
            "live_bytes": 20 * GiB,
        },
        "final": {**state, "time_ns": 9_000},
        "internal_frag": 0.01,
        "growth_per_s": 0.002,
        "health": health,
        "out_of_order_frees": 3,
        "hole_creating_frees": 2,
        "hotspots": [],
        "size_histogram": [],
        "free_block_histogram": [],
        "timeline": {},
    }


def document(*spaces: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": "nsysfrag/1",
        "trace": {"path": "unused", "nsys_version": "2025.3.2"},
        "model": {"name": "observed", "granularity_bytes": 512},
        "spaces": list(spaces) or [space_doc()],
    }


def make_record(
    folder: Path,
    name: str,
    *spaces: dict[str, Any],
    label: str | None = None,
    tags: tuple[str, ...] = (),
    at: datetime | None = None,
) -> RunRecord:
    """A record of a fresh trace file (its name as content, so every name hashes differently)."""
    trace = folder / f"{name}.sqlite"
    trace.write_text(name)
    record = RunRecord.from_document(document(*spaces), trace, label=label, tags=parse_tags(tags))
    return dataclasses.replace(record, recorded_at=at)


def record_series(url: str, folder: Path, values: list[float], **kw: Any) -> list[int]:
    """One run per value of global_frag, a day apart; returns the run ids."""
    ids = []
    with open_store(url) as store:
        for i, value in enumerate(values):
            name = f"{kw.get('label', 'run')}-{i}-{value}"
            rec = make_record(
                folder, name, space_doc(global_frag=value), at=T0 + timedelta(days=i), **kw
            )
            ids.append(store.record(rec).run_id)
    return ids


def count(url: str, table: Any) -> int:
    engine = create_engine(url, poolclass=NullPool)
    with engine.connect() as connection:
        n = connection.execute(select(func.count()).select_from(table)).scalar_one()
    engine.dispose()
    return int(n)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "200"})


def one_error_line(result: Result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("nsysfrag: error: "), lines[0]
    return lines[0]


# ---------------------------------------------------------------- record and list


def test_analyze_record_then_history_lists_newest_first(db_url: str, tmp_path: Path) -> None:
    first = invoke(
        "analyze",
        str(TRAINING),
        "-q",
        "--record",
        "--db",
        db_url,
        "--label",
        "nightly #411",
        "--tag",
        "model=llama-8b",
        "--tag",
        "gpu=h100",
    )
    assert first.exit_code == 0, first.output
    assert "recorded as run 1" in first.output
    second = invoke(
        "analyze",
        str(INFERENCE),
        "-q",
        "--record",
        "--db",
        db_url,
        "--label",
        "nightly #412",
        "--tag",
        "model=llama-8b",
        "--json",
        str(tmp_path / "inference.json"),
    )
    assert "recorded as run 2" in second.output
    (inference,) = json.loads((tmp_path / "inference.json").read_text())["spaces"]

    listing = invoke("history", "--db", db_url)
    assert listing.exit_code == 0, listing.output
    out = listing.output
    assert "2 run(s)" in out
    assert out.index("nightly #412") < out.index("nightly #411")  # newest first
    for text_ in (
        "training_loop.sqlite",
        "inference_serving.sqlite",
        "model=llama-8b",
        "gpu=h100",
        "dev 0 pid 2817",
        "dev 0 pid 3310",
        inference["health"],
        f"{inference['max']['global_frag']:.1%}",
        f"{inference['max']['local_frag']:.1%}",
    ):
        assert text_ in out, text_
    assert inference["health"] == "critical"  # the sample's failures come with stranded pages


def test_every_spec_scalar_is_stored(db_url: str, tmp_path: Path) -> None:
    analysis = tmp_path / "a.json"
    result = invoke(
        "analyze", str(MULTI_GPU), "-q", "--json", str(analysis), "--record", "--db", db_url
    )
    assert result.exit_code == 0, result.output
    with open_store(db_url) as store:
        (run,) = store.runs()
    spaces = json.loads(analysis.read_text())["spaces"]
    assert len(run.spaces) == len(spaces) == 3
    for stored, original in zip(run.spaces, spaces, strict=True):
        assert dict(stored.values) == flatten_space(original)
    assert run.trace_name == "multi_gpu.sqlite" and len(run.trace_sha256) == 64
    assert run.model == "observed" and run.granularity_bytes == 512
    assert run.nsys_version and run.host and run.nsysfrag_version


def test_filters_tags_label_dates_limit(db_url: str, tmp_path: Path) -> None:
    with open_store(db_url) as store:
        for i, (label, tags) in enumerate(
            [
                ("nightly #1", ("model=llama-8b", "gpu=h100")),
                ("nightly #2", ("model=llama-8b", "gpu=a100")),
                ("PR 77", ("model=mistral", "gpu=h100")),
                ("nightly #3", ("model=llama-8b", "gpu=h100")),
            ]
        ):
            store.record(
                make_record(tmp_path, f"t{i}", label=label, tags=tags, at=T0 + timedelta(days=i))
            )

        def labels(**kw: Any) -> list[str | None]:
            return [r.label for r in store.runs(RunQuery(**kw))]

        assert labels() == ["nightly #3", "PR 77", "nightly #2", "nightly #1"]
        assert labels(tags=(("model", "llama-8b"),)) == ["nightly #3", "nightly #2", "nightly #1"]
        assert labels(tags=(("model", "llama-8b"), ("gpu", "h100"))) == ["nightly #3", "nightly #1"]
        assert labels(tags=(("model", "nope"),)) == []
        assert labels(label="NIGHTLY") == ["nightly #3", "nightly #2", "nightly #1"]
        assert labels(label="%") == []  # LIKE wildcards are escaped
        assert labels(since=T0 + timedelta(days=1), until=T0 + timedelta(days=3)) == [
            "PR 77",
            "nightly #2",
        ]
        assert labels(limit=2) == ["nightly #3", "PR 77"]
        assert store.runs(RunQuery(limit=1))[0].tags == {"gpu": "h100", "model": "llama-8b"}

    # The same through the CLI: a bare --until date includes that whole day.
    result = invoke(
        "history",
        "--db",
        db_url,
        "--tag",
        "model=llama-8b",
        "--tag",
        "gpu=h100",
        "--since",
        "2025-06-01",
        "--until",
        "2025-06-03",
        "--label",
        "nightly",
    )
    assert result.exit_code == 0, result.output
    assert "nightly #1" in result.output and "nightly #3" not in result.output
    assert "1 run(s)" in result.output


def test_same_trace_and_options_is_not_recorded_twice(db_url: str, tmp_path: Path) -> None:
    args = ["analyze", str(TRAINING), "-q", "--record", "--db", db_url]
    assert "recorded as run 1" in invoke(*args).output
    again = invoke(*args, "--label", "retry", "--tag", "gpu=h100")
    assert again.exit_code == 0, again.output
    assert "already recorded as run 1" in again.output
    # The new label and tag are not lost: the run takes them, and the line says so.
    assert "updated its label ('retry') and tag gpu=h100" in again.output
    with open_store(db_url) as store:
        (run,) = store.runs()
    assert run.label == "retry" and run.tags == {"gpu": "h100"}
    # Other analysis options make another run.
    assert "recorded as run 2" in invoke(*args, "--granularity", "2MiB").output
    assert "recorded as run 3" in invoke(*args, "--capacity", "40GiB").output
    assert "already recorded as run 3" in invoke(*args, "--capacity", "40GiB").output
    assert count(db_url, runs) == 3
    assert count(db_url, run_spaces) == 3


def test_a_racing_duplicate_is_caught_by_the_unique_constraint(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers of one trace can both find no run before either commits: the unique
    constraint refuses the second insert, and its IntegrityError becomes "already recorded"."""
    import nsysfrag.history.store as store_module

    record = make_record(tmp_path, "raced", space_doc(), tags=("k=v",))
    with open_store(db_url) as store:
        assert store.record(record) == Recorded(1, created=True)
        find = store_module._find_run
        calls: list[int | None] = []

        def blind_first_look(connection: Any, run: RunRecord) -> int | None:
            calls.append(None if not calls else find(connection, run))
            return calls[-1]

        monkeypatch.setattr(store_module, "_find_run", blind_first_look)
        assert store.record(record) == Recorded(1, created=False)
    assert calls == [None, 1]
    assert (count(db_url, runs), count(db_url, run_spaces), count(db_url, run_tags)) == (1, 1, 1)


def test_json_for_dashboards(db_url: str, tmp_path: Path) -> None:
    record_series(db_url, tmp_path, [0.1, 0.2], tags=("model=llama-8b",))
    out = tmp_path / "history.json"
    result = invoke("history", "--db", db_url, "--json", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["schema"] == "nsysfrag-history/1"
    assert [r["id"] for r in doc["runs"]] == [2, 1]
    newest = doc["runs"][0]
    assert newest["tags"] == {"model": "llama-8b"}
    assert newest["recorded_at"] == (T0 + timedelta(days=1)).isoformat()
    assert newest["model"] == {
        "name": "observed",
        "granularity_bytes": 512,
        "capacity_override_bytes": None,
    }
    (space,) = newest["spaces"]
    expected = {
        k: v
        for k, v in space_doc(global_frag=0.2).items()
        if k not in ("hotspots", "size_histogram", "free_block_histogram", "timeline")
    }
    assert space == expected


# ---------------------------------------------------------------- trend and check


def test_sparkline_scales_between_lowest_and_highest() -> None:
    assert sparkline([0.0, 1.0, 2.0, 3.0, 7.0]) == "▁▂▃▄█"
    assert sparkline([0.1, 0.2, 0.3, 0.4, 0.5]) == "▁▃▄▆█"
    assert sparkline([1.0, None, 1.0]) == "▁ ▁"
    assert sparkline([]) == ""


def test_trend_sparkline_and_png(db_url: str, tmp_path: Path) -> None:
    record_series(db_url, tmp_path, [0.10, 0.20, 0.30, 0.40, 0.50], tags=("model=llama-8b",))
    record_series(db_url, tmp_path, [0.90], tags=("model=other",), label="other")
    png = tmp_path / "trend.png"
    result = invoke(
        "history",
        "--db",
        db_url,
        "--trend",
        "global_frag",
        "--tag",
        "model=llama-8b",
        "--png",
        str(png),
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(
        "max.global_frag over 5 run(s), oldest first (run 1 2025-06-01 → run 5"
    )
    assert lines[1] == "device 0  ▁▃▄▆█  10.0% → 50.0%  (min 10.0%, max 50.0%, 5 run(s))"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    # A byte metric reads in binary units; a missing device leaves a gap.
    with open_store(db_url) as store:
        store.record(
            make_record(
                tmp_path,
                "two-gpus",
                space_doc(device=0),
                space_doc(device=1),
                tags=("model=llama-8b",),
                at=T0 + timedelta(days=9),
            )
        )
    result = invoke(
        "history", "--db", db_url, "--trend", "peak.largest_free_bytes", "--tag", "model=llama-8b"
    )
    assert "device 1       ▁  40.00 GiB → 40.00 GiB" in result.output


def test_spaces_are_followed_by_device_process_and_model(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    simulated = {**space_doc(pid=7, global_frag=0.3), "model": "pytorch-segments"}
    with open_store(url) as store:
        for i in range(2):
            store.record(
                make_record(
                    tmp_path,
                    f"r{i}",
                    space_doc(pid=100 + i, global_frag=0.1),
                    space_doc(pid=200 + i, global_frag=0.2),
                    simulated,
                    space_doc(pid=7, device=1),
                    at=T0 + timedelta(days=i),
                )
            )
        history = store.runs()[::-1]
    assert [(s.key, s.values) for s in series(history, "max.global_frag")] == [
        ("device 0", (0.1, 0.1)),
        ("device 0 · process 2", (0.2, 0.2)),
        ("device 0 · pytorch-segments", (0.3, 0.3)),
        ("device 1", (0.1, 0.1)),
    ]


def test_a_snapshot_run_is_named_by_its_model_and_device_not_observed_pid_0(tmp_path: Path) -> None:
    # main: the table titled every run "observed address space" and showed a snapshot's device as
    # "dev 0 pid 0"; --check said "none of its devices appear" beside runs holding device 0.
    db = tmp_path / "h.sqlite"
    for name in ("torch_fragmentation_snapshot.pickle", "torch_expandable_snapshot.pickle",
                 "training_loop.sqlite"):  # fmt: skip
        assert invoke("analyze", str(SAMPLES / name), "-q", "--record", "--db", str(db)).exit_code == 0
    table = invoke("history", "--db", str(db), "--limit", "2")
    assert table.exit_code == 0, table.output
    assert "pytorch-segments model" in table.output and "observed address space" not in table.output
    assert "dev 0 · pytorch-segments" in table.output and "pid 0" not in table.output
    assert "dev 0 pid 2817" in table.output
    check = invoke("history", "--db", str(db), "--check")
    assert check.exit_code == 0, check.output
    said = check.output
    assert "none of its devices" not in said
    assert "run 3: device 0 appears in none of the 2 run(s) before it, which hold device 0 ·" \
        " pytorch-segments (another model or process)" in " ".join(said.split())
    trend = invoke("history", "--db", str(db), "--trend", "global_frag")
    assert "observed and pytorch-segments models" in " ".join(trend.output.split())


def test_check_latest_against_trailing_median(db_url: str, tmp_path: Path) -> None:
    base = ["history", "--db", db_url, "--check", "--tag", "model=llama-8b"]
    ok = invoke(*base)
    assert ok.exit_code == 0 and "nothing to check" in ok.output
    record_series(db_url, tmp_path, [0.10], tags=("model=llama-8b",), label="first")
    assert "first matching run" in invoke(*base).output
    record_series(db_url, tmp_path, [0.12, 0.09, 0.11, 0.10, 0.30], tags=("model=llama-8b",))
    # Another model's runs do not take part.
    record_series(db_url, tmp_path, [0.95], tags=("model=other",), label="other")

    tripped = invoke(*base)
    assert tripped.exit_code == 1, tripped.output
    lines = [line for line in tripped.output.splitlines() if "regression" in line]
    assert lines == [
        (
            "nsysfrag: regression: run 6 device 0: max.global_frag = 30.0%, median of the"
            " previous 5 run(s) 10.0% (+0.2, threshold 0.05)"
        )
    ]
    assert invoke(*base, "--threshold", "0.25").exit_code == 0
    # The median is over the window: with the one run before it (0.10) still a regression.
    assert invoke(*base, "--window", "1").exit_code == 1
    # Another metric, unchanged, passes; repeated --metric checks both.
    assert invoke(*base, "--metric", "local_frag").exit_code == 0
    both = invoke(*base, "--metric", "local_frag", "--metric", "global_frag")
    assert both.exit_code == 1 and both.output.count("regression:") == 1
    # The other model alone: one run, nothing to compare with.
    assert invoke("history", "--db", db_url, "--check", "--tag", "model=other").exit_code == 0


def test_check_per_device_and_direction(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    with open_store(url) as store:
        for i, frag in enumerate([0.1, 0.1, 0.1]):
            store.record(
                make_record(
                    tmp_path,
                    f"r{i}",
                    space_doc(device=0, global_frag=0.1),
                    space_doc(device=1, global_frag=frag),
                    at=T0 + timedelta(days=i),
                )
            )
        store.record(
            make_record(
                tmp_path,
                "r3",
                space_doc(device=0, global_frag=0.1),
                space_doc(device=1, global_frag=0.2),
                at=T0 + timedelta(days=3),
            )
        )
        history = store.runs()
    result = check(history, [resolve_metric("global_frag")], window=5, threshold=0.05)
    assert [(r.key, r.metric, round(r.change, 6)) for r in result.regressions] == [
        ("device 1", "max.global_frag", 0.1)
    ]
    assert result.compared == 2 and len(result.previous) == 3
    # Larger is better for the largest free block: only a drop is a regression.
    assert not check(history, ["peak.largest_free_bytes"], 5, 0).regressions


def test_metric_names_read_like_gates() -> None:
    assert resolve_metric("global_frag") == "max.global_frag"
    assert resolve_metric("largest_free_bytes") == "peak.largest_free_bytes"
    assert resolve_metric("overlaps") == "counts.overlaps"
    assert resolve_metric("final.live_bytes") == "final.live_bytes"
    assert resolve_metric("internal_frag") == "internal_frag"
    for bad in ("health", "pid", "bogus"):
        with pytest.raises(InputError):
            resolve_metric(bad)


# ---------------------------------------------------------------- concurrency and crashes

WRITER = """
import sys, time
from pathlib import Path
from nsysfrag.history import RunRecord, open_store
from tests.test_history import document, make_record, space_doc

url, worker, n, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
shared = folder / f"shared-{worker}.sqlite"
shared.write_text("the same trace in every worker")
print("ready", flush=True)
while not (folder / "go").exists():
    time.sleep(0.01)
with open_store(url) as store:
    store.record(RunRecord.from_document(document(), shared))
for i in range(n):
    with open_store(url) as store:
        store.record(make_record(folder, f"w{worker}-{i}", space_doc(pid=worker, global_frag=i / 100)))
"""


def test_concurrent_writers_all_land(db_url: str, tmp_path: Path) -> None:
    workers, each = 4, 10
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, db_url, str(w), str(each), str(tmp_path)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    for proc in procs:  # every writer has imported everything: start them together
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    (tmp_path / "go").touch()
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    # Every run landed once, and the trace all workers recorded at the same moment only once.
    assert count(db_url, runs) == workers * each + 1
    assert count(db_url, run_spaces) == workers * each + 1
    with open_store(db_url) as store:
        assert len({r.id for r in store.runs()}) == workers * each + 1


KILLED = """
import sys, time
from pathlib import Path
import nsysfrag.history.store as store
from tests.test_history import make_record, space_doc

url, folder = sys.argv[1], Path(sys.argv[2])
insert_tags = store._insert_tags

def stall(connection, run_id, tags):
    insert_tags(connection, run_id, tags)  # the run, its spaces and tags: written, not committed
    print("inside the transaction", flush=True)
    time.sleep(600)

store._insert_tags = stall
with store.open_store(url) as s:
    s.record(make_record(folder, "doomed", space_doc(), space_doc(device=1), tags=("k=v",)))
"""


def test_killed_writer_leaves_no_partial_run(db_url: str, tmp_path: Path) -> None:
    with open_store(db_url):
        pass  # the schema exists, so the child's only write is the run
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, db_url, str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == "inside the transaction\n", proc.stderr.read() if proc.stderr else ""
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert (count(db_url, runs), count(db_url, run_spaces), count(db_url, run_tags)) == (0, 0, 0)
    # The dead writer's lock went with it: the next run lands.
    with open_store(db_url) as store:
        assert store.record(make_record(tmp_path, "next", space_doc())).created
    assert count(db_url, runs) == 1


def test_sqlite_uses_wal_and_a_busy_timeout(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    with open_store(url):
        pass
    engine = create_engine(url)
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    engine.dispose()


# ---------------------------------------------------------------- schema versions


def _reflect(url: str) -> dict[str, set[tuple[str, bool]]]:
    engine = create_engine(url, poolclass=NullPool)
    reflected = MetaData()
    reflected.reflect(bind=engine)
    with engine.connect() as connection:
        # PostgreSQL lists the index behind a unique constraint too.
        indexes = {
            t: {
                i["name"]
                for i in inspect(connection).get_indexes(t)
                if "duplicates_constraint" not in i
            }
            for t in TABLES
        }
    engine.dispose()
    return {
        name: {(c.name, bool(c.nullable)) for c in table.columns}
        | {("index " + str(i), True) for i in indexes[name]}
        for name, table in reflected.tables.items()
    }


def test_migrations_build_the_current_schema(db_url: str) -> None:
    with open_store(db_url):
        pass
    expected = {
        name: {(c.name, bool(c.nullable)) for c in table.columns}
        | {("index " + str(i.name), True) for i in table.indexes}
        for name, table in metadata.tables.items()
    }
    assert _reflect(db_url) == expected


def test_an_older_schema_is_migrated_and_keeps_its_data(db_url: str, tmp_path: Path) -> None:
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.begin() as connection:
        assert migrate(connection, MIGRATIONS[:1]) == 0
        connection.execute(
            text(
                "INSERT INTO runs (recorded_at, trace_path, trace_sha256, nsys_version, host, label,"
                " model, granularity_bytes, capacity_override_bytes) VALUES ('2024-01-02 03:04:05',"
                " '/old/run.sqlite', :sha, '2024.1', 'box', 'from v1', 'observed', 512, 0)"
            ),
            {"sha": "ab" * 32},
        )
        values = {
            f.column: v
            for f, v in zip(SPACE_FIELDS, _v1_values(), strict=True)
            if f.column != "process_name"
        }
        columns = ", ".join(values)
        connection.execute(
            text(f"INSERT INTO run_spaces (run_id, {columns}) VALUES (1, :{', :'.join(values)})"),
            values,
        )
        connection.execute(
            text("INSERT INTO run_tags (run_id, key, value) VALUES (1, 'model', 'old')")
        )
        assert connection.execute(text("SELECT max(version) FROM schema_version")).scalar() == 1
    engine.dispose()

    with open_store(db_url) as store:
        (run,) = store.runs(RunQuery(tags=(("model", "old"),)))
        assert store.record(make_record(tmp_path, "new")).run_id == 2
    assert run.label == "from v1" and run.nsysfrag_version is None and run.rank is None
    assert run.recorded_at == datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    (space,) = run.spaces
    assert space.get("process_name") is None and space.get("max.global_frag") == 0.25
    assert space.get("span_mode") is False
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.connect() as connection:
        versions = connection.execute(text("SELECT version FROM schema_version ORDER BY version"))
        assert [v for (v,) in versions] == list(range(1, LATEST + 1))
    engine.dispose()


def _v1_values() -> list[Any]:
    flat = flatten_space(space_doc(global_frag=0.25))
    return [flat[f.path] for f in SPACE_FIELDS]


def test_a_newer_schema_is_refused(db_url: str) -> None:
    with open_store(db_url):
        pass
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO schema_version (version, applied_at) VALUES (:v, '2030-01-01 00:00:00')"
            ),
            {"v": LATEST + 1},
        )
    engine.dispose()
    result = invoke("history", "--db", db_url)
    assert result.exit_code == 2
    assert f"schema version {LATEST + 1}, newer than this nsysfrag" in one_error_line(result)


# ---------------------------------------------------------------- bad databases and usage


def test_corrupt_file_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "history.sqlite"
    bad.write_bytes(b"garbage" * 200)
    result = invoke("history", "--db", str(bad))
    assert result.exit_code == 2
    assert "not a readable history database" in one_error_line(result)
    recorded = invoke("analyze", str(TRAINING), "-q", "--record", "--db", str(bad))
    assert recorded.exit_code == 2
    one_error_line(recorded)
    assert bad.read_bytes() == b"garbage" * 200


def test_an_nsys_trace_is_not_taken_for_a_history(tmp_path: Path) -> None:
    trace = tmp_path / "run.sqlite"
    shutil.copy(TRAINING, trace)
    before = trace.read_bytes()
    result = invoke("analyze", str(TRAINING), "-q", "--record", "--db", str(trace))
    assert result.exit_code == 2
    assert "not an nsysfrag history" in one_error_line(result)
    assert trace.read_bytes() == before


def test_unreachable_server_is_one_line_exit_2() -> None:
    url = "postgresql+psycopg://x:secret@127.0.0.1:1/db"
    result = invoke("history", "--db", url)
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "127.0.0.1:1" in line and "secret" not in line
    recorded = invoke("analyze", str(TRAINING), "-q", "--record", "--db", url)
    assert recorded.exit_code == 2
    one_error_line(recorded)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["analyze", str(TRAINING), "--record", "--tag", "model"], "write KEY=VALUE"),
        (["analyze", str(TRAINING), "--record", "--tag", "a=1", "--tag", "a=2"], "given twice"),
        (["analyze", str(TRAINING), "--label", "x"], "go with --record"),
        (["analyze", str(TRAINING), "--record", "--db", "nope://x:y:z"], "not a database URL"),
        (["history", "--png", "t.png"], "--png goes with --trend"),
        (["history", "--window", "3"], "go with --check"),
        (["history", "--trend", "health"], "not a numeric metric"),
        (["history", "--check", "--metric", "bogus"], "not a numeric metric"),
        (["history", "--since", "yesterday"], "not a date"),
    ],
)
def test_usage_errors_exit_2(args: list[str], why: str, tmp_path: Path) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert why in result.output


def test_history_of_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "none" / "history.sqlite"
    result = invoke("history", "--db", str(missing))
    assert result.exit_code == 0
    assert "no recorded runs" in result.output
    assert not missing.parent.exists()


def test_where_the_database_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_path({"XDG_DATA_HOME": "/data"}) == Path("/data/nsysfrag/history.sqlite")
    assert default_path({"XDG_DATA_HOME": "relative"}) == (
        Path.home() / ".local/share/nsysfrag/history.sqlite"
    )
    assert database_url(None, {"NSYSFRAG_DB": "/x/h.sqlite"}).database == "/x/h.sqlite"
    assert database_url("/y/h.sqlite", {"NSYSFRAG_DB": "/x/h.sqlite"}).database == "/y/h.sqlite"
    assert database_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    # By default a run lands in $XDG_DATA_HOME, its folder made on first use.
    result = invoke("analyze", str(TRAINING), "-q", "--record")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "xdg" / "nsysfrag" / "history.sqlite").is_file()
    monkeypatch.setenv("NSYSFRAG_DB", str(tmp_path / "env.sqlite"))
    assert "recorded as run 1" in invoke("analyze", str(INFERENCE), "-q", "--record").output
    assert (tmp_path / "env.sqlite").is_file()

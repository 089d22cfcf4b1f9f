"""JSON documents read back and settings (issue 25, item 7): checked before use, one line each.

Baselines, ``compare`` inputs, jobs' documents and Dask scheduler files are validated against
their schema (``nsysfrag.checks.documents``) before anything reads them; ``$COLUMNS`` is clamped;
a rank number no job has is refused before any rank is analyzed or recorded.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAMPLES
from tests.hostile.contract import run_nsysfrag

SAMPLE = SAMPLES / "multi_gpu.sqlite"


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("doc") / "base.json"
    run_nsysfrag(["analyze", SAMPLE, "-q", "--json", out])
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def _write(path: Path, doc: Any, *, raw: dict[str, str] | None = None) -> Path:
    """``doc`` as JSON, with each ``"KEY": <value>`` of ``raw`` spliced in as literal text."""
    text = json.dumps(doc)
    for key, literal in (raw or {}).items():
        text = text.replace(f'"{key}": ', f'"{key}": {literal}, "was_{key}": ', 1)
    path.write_text(text)
    return path


def _space_cases(doc: dict[str, Any]) -> list[tuple[str, Any, dict[str, str], str]]:
    def edited(**changes: Any) -> dict[str, Any]:
        copy = json.loads(json.dumps(doc))
        copy["spaces"][0].update(changes)
        return copy

    big = "1" + "0" * 400
    return [
        ("10^400 as a float", doc, {"internal_frag": "1e400"}, "internal_frag is inf"),
        ("10^400 as an integer", doc, {"out_of_order_frees": big}, "an integer of 401 digits"),
        ("5,000 digits", doc, {"growth_per_s": "9" * 5000}, "an integer of 5,000 digits"),
        ("a health that is no level", edited(health="fine"), {}, "health is 'fine', not a health level"),
        ("a health that is a list", edited(health=["critical"]), {}, "health is a list"),
        ("a pid that is text", edited(pid="4101"), {}, "pid is '4101', not an integer"),
        ("a pid beyond 64 bits", edited(pid=2**64), {}, "pid is 18446744073709551616"),
        ("a metric that is null", edited(internal_frag=None), {}, "internal_frag is null"),
        ("a state that is a list", edited(peak=[1, 2]), {}, "spaces[0].peak is a list"),
        ("NaN", doc, {"internal_frag": "NaN"}, "internal_frag is nan"),
        ("spaces of numbers", {**doc, "spaces": [1]}, {}, "spaces[0] is 1, not an object"),
        ("a trace that is a number", {**doc, "trace": 5}, {}, "trace is 5, not an object"),
        ("a site's bytes of 10^400", doc, {"total_bytes": "1e400"}, "total_bytes is inf"),
        ("a moment's time as text", edited(final={**doc["spaces"][0]["final"], "time_ns": "0"}), {},
         "final.time_ns is '0', not an integer"),
    ]


def test_hostile_values_in_a_compared_document_are_one_line(
    document: dict[str, Any], tmp_path: Path
) -> None:
    # main: internal errors (OverflowError, ValueError: Exceeds the limit (4300 digits), KeyError,
    # TypeError: unhashable type: 'list')
    base = _write(tmp_path / "base.json", document)
    for name, doc, raw, said in _space_cases(document):
        bad = _write(tmp_path / "bad.json", doc, raw=raw)
        for argv in (["compare", base, bad], ["compare", bad, base],
                     ["analyze", SAMPLE, "-q", "--baseline", bad]):  # fmt: skip
            out = run_nsysfrag(argv, inputs=[bad, base])
            assert out.returncode == 2 and said in out.stderr, (name, out.stderr)


def test_a_document_that_is_not_a_file_or_too_big(document: dict[str, Any], tmp_path: Path) -> None:
    base = _write(tmp_path / "base.json", document)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    out = run_nsysfrag(["compare", base, fifo], inputs=[base])
    assert out.returncode == 2 and "not a regular file" in out.stderr
    out = run_nsysfrag(["compare", base, base], inputs=[base], env={"NSYSFRAG_JSON_BYTES": "1000"})
    assert out.returncode == 2 and "larger than 1,000 bytes" in out.stderr
    (tmp_path / "latin1.json").write_bytes(b'{"schema": "nsysfrag/1", "x": "\xe9"}')
    out = run_nsysfrag(["compare", base, tmp_path / "latin1.json"], inputs=[base])
    assert out.returncode == 2 and "not UTF-8" in out.stderr


def _job_document(tmp_path: Path) -> dict[str, Any]:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for r in (0, 1):
        shutil.copy(SAMPLE, ranks / f"rank{r}.sqlite")
    out = tmp_path / "job.json"
    run_nsysfrag(["analyze", ranks, "-q", "--jobs", "1", "--json", out],
                 notes=("nsysfrag: analyzing 2 ranks",))  # fmt: skip
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def test_hostile_job_documents_are_one_line(tmp_path: Path) -> None:
    doc = _job_document(tmp_path)
    base = _write(tmp_path / "base.json", doc)
    cases = [
        ({**doc, "ranks": [{**doc["ranks"][0], "rank": 2**64}]}, "ranks[0].rank is 18446744073709551616"),
        ({**doc, "ranks": [doc["ranks"][0], doc["ranks"][0]]}, "a rank no other entry has"),
        ({**doc, "ranks": [{"rank": 3, "error": ["x"]}]}, "ranks[0].error is a list"),
        ({**doc, "ranks": [{"rank": 0, "analysis": {**doc["ranks"][0]["analysis"], "spaces": [
            {**doc["ranks"][0]["analysis"]["spaces"][0], "health": {}}]}}]},
         "ranks[0].analysis.spaces[0].health is an object"),
    ]  # fmt: skip
    for bad_doc, said in cases:
        bad = _write(tmp_path / "bad.json", bad_doc)
        out = run_nsysfrag(["compare", base, bad], inputs=[bad, base])
        assert out.returncode == 2 and said in out.stderr, out.stderr


def test_columns_of_a_hundred_million_are_clamped(tmp_path: Path) -> None:
    # main: MemoryError at 3.3 GB
    out = run_nsysfrag(["analyze", SAMPLE], inputs=[SAMPLE], env={"COLUMNS": "100000000"})
    assert out.returncode == 0
    assert max(map(len, out.stdout.splitlines())) <= 1000


def test_a_rank_beyond_any_job_is_refused_before_anything_is_recorded(tmp_path: Path) -> None:
    # main: ranks 0 and 1 were stored, then an internal error (OverflowError) on the third
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    samples = ("multi_gpu.sqlite", "caching_allocator.sqlite", "churn_anomalies.sqlite")
    for r, sample in zip((0, 1, 2**64), samples, strict=True):
        shutil.copy(SAMPLES / sample, ranks / f"rank{r}.sqlite")
    db = tmp_path / "history.sqlite"
    out = run_nsysfrag(["analyze", ranks, "-q", "--jobs", "1", "--record", "--db", db])
    assert out.returncode == 2 and "rank 18446744073709551616" in out.stderr
    assert not db.exists() or sqlite3.connect(db).execute("SELECT count(*) FROM runs").fetchone() == (0,)


# ---------------------------------------------------------------- Dask


def _two_ranks(tmp_path: Path) -> list[Path]:
    paths = [tmp_path / f"rank{r}.sqlite" for r in (0, 1)]
    for p in paths:
        shutil.copy(SAMPLE, p)
    return paths


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "the file is a list, not an object"),
        ('{"address": 5}', "address is 5, not text"),
        ('{"id": "x"}', "has no 'address'"),
        ('{"address": "tcp://a\\nb"}', "not a scheduler address"),
    ],
)
def test_a_hostile_scheduler_file_is_one_line(tmp_path: Path, content: str, said: str) -> None:
    # main: internal errors (TypeError, AssertionError) after saying the job was running
    pytest.importorskip("distributed")
    (tmp_path / "scheduler.json").write_text(content)
    ranks = _two_ranks(tmp_path)
    out = run_nsysfrag(["analyze", *ranks, "-q", "--scheduler-file", tmp_path / "scheduler.json"],
                       inputs=ranks)  # fmt: skip
    assert out.returncode == 2 and said in out.stderr, out.stderr


def test_an_unreachable_scheduler_fails_within_the_connect_limit(tmp_path: Path) -> None:
    # main: 31 s (Dask's own 30 s connect timeout)
    pytest.importorskip("distributed")
    ranks = _two_ranks(tmp_path)
    started = time.monotonic()
    out = run_nsysfrag(["analyze", *ranks, "-q", "--scheduler", "tcp://127.0.0.1:1"], inputs=ranks,
                       env={"NSYSFRAG_SCHEDULER_TIMEOUT": "2"})  # fmt: skip
    took = time.monotonic() - started
    assert out.returncode == 2 and "cannot reach the Dask scheduler" in out.stderr
    assert took < 15, took


# ------------------------------------------------ documents that cost: sites bounded, cut


def _with_sites(doc: dict[str, Any], sites: list[str]) -> dict[str, Any]:
    copy = json.loads(json.dumps(doc))
    live = copy["spaces"][0]["memory_peak_sites"]["live"]
    live["sites"] = [{"site": s, "bytes": 1000 + i} for i, s in enumerate(sites)]
    return copy


@pytest.mark.parametrize("output", ["--json", "--html"])
def test_a_lone_surrogate_in_a_site_reads_as_a_replacement_character(
    document: dict[str, Any], tmp_path: Path, output: str
) -> None:
    # main: UnicodeEncodeError, an internal error, writing --json or --html
    base = _write(tmp_path / "base.json", document)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_with_sites(document, ["\ud800", "x\udfffy"])))  # ASCII: escapes
    assert "\\ud800" in bad.read_text()
    report = tmp_path / f"report{output.replace('--', '.')}"
    for argv in (["compare", base, bad, output, report], ["analyze", SAMPLE, "-q", "--baseline", bad, output, report]):
        out = run_nsysfrag(argv, inputs=[bad, base])
        assert out.returncode == 0, out.stderr
        if argv[0] == "compare":
            assert "\ufffd" in report.read_text(encoding="utf-8")


def test_a_megabyte_site_is_cut_and_shows_at_once(document: dict[str, Any], tmp_path: Path) -> None:
    # main: a 1 MB site text took 40 s and 550 MB to lay out, 5 MB more than 120 s and 2.3 GB
    from nsysfrag import limits

    base = _write(tmp_path / "base.json", document)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_with_sites(document, ["torch/" * 200_000 + "end.py:1"])))
    out = run_nsysfrag(["compare", base, bad, "--json", "-"], inputs=[bad, base])
    doc = json.loads(out.stdout)
    sites = [c["site"] for part in doc["spaces"][0]["sites"].values() for c in part["changes"]]
    longest = max(sites, key=len)
    assert len(longest) == limits.DOCUMENT_SITE_CHARS.value() and longest.endswith("…")
    assert longest.startswith("torch/torch/")
    run_nsysfrag(["compare", base, bad], inputs=[bad, base], env={"COLUMNS": "80"})


def test_too_many_sites_or_too_much_site_text_is_one_line(document: dict[str, Any], tmp_path: Path) -> None:
    # main: two million sites in a 60 MB document took 33 s (> 60 s and 2.2 GB the other way)
    base = _write(tmp_path / "base.json", document)
    many = tmp_path / "many.json"
    many.write_text(json.dumps(_with_sites(document, [f"s{i}" for i in range(100_001)])))
    wide = tmp_path / "wide.json"
    wide.write_text(json.dumps(_with_sites(document, [f"{i}" + "x" * 5000 for i in range(4200)])))
    for bad, said in ((many, "more than 100,000 sites"), (wide, "more than 16,777,216 bytes")):
        for argv in (["compare", base, bad], ["compare", bad, base], ["analyze", SAMPLE, "-q", "--baseline", bad]):
            out = run_nsysfrag(argv, inputs=[bad, base])
            assert out.returncode == 2 and said in out.stderr, (argv, out.stderr)


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda s: s["counts"].update(allocations=True), "counts.allocations is true, not an integer"),
        (lambda s: s["counts"].update(frees=-1), "counts.frees is -1, not an integer from 0"),
        (lambda s: s["peak"].update(live_bytes=-5), "peak.live_bytes is -5, not a number of at least 0"),
        (lambda s: s["final"].update(free_blocks=-1), "final.free_blocks is -1, not a number of at least 0"),
        (lambda s: s.update(capacity_bytes=0), "capacity_bytes is 0, not an integer from 1"),
        (lambda s: s.update(capacity_bytes=True), "capacity_bytes is true, not an integer from 1"),
    ],
)  # fmt: skip
def test_values_nsysfrag_never_writes_are_named(
    document: dict[str, Any], tmp_path: Path, edit: Any, said: str
) -> None:
    # main: read as counts and sizes (true as 1, a negative size, a device of no memory)
    base = _write(tmp_path / "base.json", document)
    copy = json.loads(json.dumps(document))
    edit(copy["spaces"][0])
    bad = _write(tmp_path / "bad.json", copy)
    for argv in (["compare", base, bad], ["analyze", SAMPLE, "-q", "--baseline", bad]):
        out = run_nsysfrag(argv, inputs=[bad, base])
        assert out.returncode == 2 and said in out.stderr, (argv, out.stderr)


def test_laying_out_a_megabyte_name_is_linear() -> None:
    # main: Site.shortened joined every suffix anew and _pieces grew a string by copies: a
    # 100 kB name took more than 120 s; 1 MB now takes well under a second.
    import time

    from rich.text import Text

    from nsysfrag.reporters.layout import Site, wrap_lines

    started = time.monotonic()
    assert Site("ab/" * 333_333 + "end").shortened(40) == "…/ab/ab/ab/ab/ab/ab/ab/ab/ab/ab/ab/end"
    lines = wrap_lines(Text("x_" * 500_000), 40, name=True)
    assert len(lines) == 25_000 and all(len(line) == 40 for line in lines)
    assert time.monotonic() - started < 20

"""`nsysfrag analyze` on several inputs: the job's JSON, reports, gates, baselines and history."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from nsysfrag.checks.comparison import compare
from tests.conftest import SAMPLES
from tests.job_helpers import JOB_SAMPLES, expected_worst, job_folder, run, single


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], bytes]:
    """The samples as a job, run on the default pool; its folder, document and JSON bytes."""
    folder = job_folder(tmp_path_factory.mktemp("pool"))
    result = run("analyze", "job", "--json", "job.json", "-q", cwd=folder.parent)
    assert result.returncode == 0, result.stderr
    assert "at a time" in result.stderr  # the pool said how it was sized
    data = (folder.parent / "job.json").read_bytes()
    return folder, json.loads(data), data


def test_each_rank_is_the_document_of_its_input_alone(job: tuple[Path, dict[str, Any], bytes]) -> None:
    folder, doc, _ = job
    assert doc["schema"] == "nsysfrag-job/1"
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    for rank, entry in enumerate(doc["ranks"]):
        assert entry["path"] == f"job/rank{rank}{Path(JOB_SAMPLES[rank]).suffix}"
        assert entry["analysis"] == single(entry["path"], cwd=folder.parent)
    assert doc["failed_ranks"] == []


def test_serial_and_parallel_runs_write_the_same_bytes(job: tuple[Path, dict[str, Any], bytes]) -> None:
    folder, _, data = job
    result = run("analyze", "job", "--jobs", "1", "--json", "serial.json", "-q", cwd=folder.parent)
    assert result.returncode == 0, result.stderr
    assert "1 at a time (--jobs 1)" in result.stderr
    assert (folder.parent / "serial.json").read_bytes() == data


def test_worst_rank_and_skew(job: tuple[Path, dict[str, Any], bytes]) -> None:
    _, doc, _ = job
    rank, value = expected_worst(doc["ranks"])
    worst = doc["worst"]
    assert (worst["rank"], worst["value"], worst["metric"]) == (rank, value, "peak.global_frag")
    space = max(doc["ranks"][rank]["analysis"]["spaces"], key=lambda s: s["peak"]["global_frag"])
    assert (worst["pid"], worst["device"]) == (space["pid"], space["device"])

    frag = [max(s["peak"]["global_frag"] for s in r["analysis"]["spaces"]) for r in doc["ranks"]]
    memory = [
        max(s.get("reserved_bytes_peak", s["max"]["live_bytes"]) for s in r["analysis"]["spaces"])
        for r in doc["ranks"]
    ]
    skew = doc["skew"]
    assert skew["ranks"] == 4
    assert skew["peak_global_frag"]["max"] == max(frag)
    assert skew["peak_global_frag"]["median"] == pytest.approx(statistics.median(frag))
    assert skew["peak_global_frag"]["max_over_median"] == pytest.approx(max(frag) / statistics.median(frag))
    assert skew["peak_memory"]["metric"] == "mixed"  # nsys live bytes and snapshot reserved bytes
    assert skew["peak_memory"]["max"] == max(memory)
    assert skew["peak_memory"]["max_rank"] == memory.index(max(memory))
    assert skew["peak_memory"]["max_over_median"] == pytest.approx(max(memory) / statistics.median(memory))


def test_ties_go_to_the_lower_rank(tmp_path: Path) -> None:
    for name in ("rank5.sqlite", "rank2.sqlite"):
        shutil.copyfile(SAMPLES / "training_loop.sqlite", tmp_path / name)
    result = run("analyze", str(tmp_path / "rank5.sqlite"), str(tmp_path / "rank2.sqlite"), "--json", "-")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [2, 5]
    assert doc["worst"]["rank"] == 2
    assert doc["skew"]["peak_global_frag"]["max_over_median"] == pytest.approx(1.0)


def test_a_glob_of_mixed_kinds_is_the_same_job_as_its_folder(
    job: tuple[Path, dict[str, Any], bytes],
) -> None:
    folder, doc, _ = job
    result = run("analyze", "job/rank*", "--json", "-", cwd=folder.parent)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == doc


def test_terminal_report_fits_80_columns(job: tuple[Path, dict[str, Any], bytes]) -> None:
    folder, doc, _ = job
    result = run("analyze", "job", cwd=folder.parent, env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    out = result.stdout
    assert re.search(r"nsysfrag job · 4 ranks: 4 analyzed, 0 failed", out)
    assert re.search(rf"worst rank: {doc['worst']['rank']} — peak global fragmentation", out)
    assert "skew across 4 ranks (max / median)" in out
    assert not re.search(r"[│ ] s\s+[│ ]", out)  # no time split from its unit
    for rank in range(4):  # a row per rank, boxed or not (the layout drops borders to fit)
        assert re.search(rf"^[│ ]\s*{rank}\s+[│ ]\s*(OK|WARN|CRITICAL)", out, re.MULTILINE)
    # One input keeps the single-input report.
    alone = run("analyze", "job/rank0.sqlite", cwd=folder.parent)
    assert "observed device pages" in alone.stdout and "nsysfrag job" not in alone.stdout


def test_html_report_links_ranks_and_escapes_names(tmp_path: Path) -> None:
    folder = job_folder(tmp_path)
    odd = folder / "rank7 <i>&.sqlite"
    shutil.copyfile(SAMPLES / "churn_anomalies.sqlite", odd)
    page = tmp_path / "job.html"
    result = run("analyze", str(folder), "--html", str(page), "-q")
    assert result.returncode == 0, result.stderr
    html = page.read_text()
    assert html.startswith("<!doctype html>") and html.rstrip().endswith("</html>")
    assert "rank7 &lt;i&gt;&amp;.sqlite" in html and "<i>&" not in html
    for rank in (0, 1, 2, 3, 7):
        assert f'id="rank-{rank}"' in html  # its section
        assert html.count(f'href="#rank-{rank}"') >= 2  # from the table and the heatmap
    svg = html[html.index("<svg"): html.index("</svg>")]
    assert svg.count("<a href=") == 5
    # Self-contained: no script, no stylesheet or image fetched from anywhere.
    assert "<script" not in html and "src=" not in html
    assert not re.search(r"(?:href|src)=\"(?:https?:)?//", html)
    again = tmp_path / "again.html"
    run("analyze", str(folder), "--html", str(again), "-q")
    assert again.read_text() == html  # deterministic


def test_fail_on_applies_to_every_rank_and_names_it(job: tuple[Path, dict[str, Any], bytes]) -> None:
    folder, doc, _ = job
    result = run("analyze", "job", "-q", "--fail-on", "global_frag>0.1", cwd=folder.parent)
    tripped = {
        r["rank"]
        for r in doc["ranks"]
        for s in r["analysis"]["spaces"]
        if s["max"]["global_frag"] > 0.1
    }
    assert tripped and len(tripped) < len(doc["ranks"])  # some ranks trip, not all
    assert result.returncode == 1
    named = {int(m) for m in re.findall(r"gate tripped: rank (\d+): pid \d+ device \d+", result.stderr)}
    assert named == tripped


def test_a_bad_input_does_not_sink_the_job(tmp_path: Path) -> None:
    folder = job_folder(tmp_path)
    (folder / "rank9.sqlite").write_text("not a trace")
    out = tmp_path / "job.json"
    result = run("analyze", str(folder), "--json", str(out))
    assert result.returncode == 2
    doc = json.loads(out.read_text())
    assert doc["failed_ranks"] == [9]
    bad = doc["ranks"][-1]
    assert bad["rank"] == 9 and "analysis" not in bad and "not an SQLite database" in bad["error"]
    assert all("analysis" in r for r in doc["ranks"][:-1])
    assert re.search(r"^nsysfrag: error: rank 9: .*rank9\.sqlite: not an SQLite database", result.stderr, re.MULTILINE)
    assert "Traceback" not in result.stderr
    assert "rank 9 failed" in result.stdout and "1 failed" in result.stdout
    # the error itself is told once, on stderr, not again in the report
    assert (result.stdout + result.stderr).count("not an SQLite database") == 1


def test_baseline_and_compare_go_rank_by_rank(job: tuple[Path, dict[str, Any], bytes]) -> None:
    folder, doc, _ = job
    base = folder.parent / "job.json"
    # The same inputs in another order: each rank now holds another rank's input.
    swapped = run("analyze", "job/rank1.pickle", "job/rank0.sqlite", "--rank-pattern", r"rank(\d)",
                  "--json", "swapped.json", "-q", cwd=folder.parent)  # fmt: skip
    assert swapped.returncode == 0, swapped.stderr
    # Inputs of one kind trade ranks: rank 0 holds rank 2's export now, rank 1 rank 3's snapshot.
    partner = {0: 2, 1: 3}
    shutil.copyfile(folder / "rank2.sqlite", folder.parent / "rank0.sqlite")
    shutil.copyfile(folder / "rank3.pickle", folder.parent / "rank1.pickle")
    result = run("analyze", "rank0.sqlite", "rank1.pickle", "--baseline", "job.json",
                 "--fail-on-regression", "0.01", cwd=folder.parent)  # fmt: skip
    # A rank regresses when comparing its baseline analysis with its new one, alone, does.
    grew = [
        r for r in (0, 1)
        if compare(doc["ranks"][r]["analysis"], doc["ranks"][partner[r]]["analysis"]).regressions(0.01)
    ]  # fmt: skip
    assert grew
    assert result.returncode == 1
    out = " ".join(result.stdout.split())  # titles wrap
    assert "(job.json, rank 0) → " in out and "(this job, rank 1)" in out
    assert "only in job.json: rank 2" in out and "only in job.json: rank 3" in out
    assert {int(r) for r in re.findall(r"regression: rank (\d+): ", result.stderr)} == set(grew)

    compared = run("compare", str(base), str(folder.parent / "swapped.json"), cwd=folder.parent)
    assert compared.returncode == 0, compared.stderr
    assert "(job.json, rank 1) → " in " ".join(compared.stdout.split())
    # Ranks whose inputs are of different kinds in the two jobs are not compared, and say so.
    crossed = json.loads(json.dumps(doc))
    crossed["ranks"][0]["analysis"], crossed["ranks"][1]["analysis"] = (
        doc["ranks"][1]["analysis"], doc["ranks"][0]["analysis"],
    )  # fmt: skip
    (folder.parent / "crossed.json").write_text(json.dumps(crossed))
    compared = run("compare", str(base), "crossed.json", cwd=folder.parent)
    assert compared.returncode == 0, compared.stderr
    said = " ".join(compared.stdout.split())
    assert (
        "rank 1 is a PyTorch memory snapshot (pytorch-segments model) in job.json and an nsys"
        " export (observed model) in crossed.json: not compared"
    ) in said
    mixed = run("compare", str(base), str(SAMPLES / "training_loop.sqlite"))
    assert mixed.returncode == 2
    single_doc = folder.parent / "single.json"
    single_doc.write_text(json.dumps(doc["ranks"][0]["analysis"]))
    mixed = run("compare", str(base), str(single_doc))
    assert mixed.returncode == 2 and "compare a job with a job" in mixed.stderr
    assert len(mixed.stderr.strip().splitlines()) == 1
    wrong_baseline = run("analyze", "job", "--baseline", "single.json", cwd=folder.parent)
    assert wrong_baseline.returncode == 2 and "not a job's analysis" in wrong_baseline.stderr


def test_record_stores_each_rank_with_its_number(job: tuple[Path, dict[str, Any], bytes], tmp_path: Path) -> None:
    folder, _, _ = job
    db = tmp_path / "history.sqlite"
    result = run("analyze", "job", "-q", "--record", "--db", str(db), "--label", "job 1", cwd=folder.parent)
    assert result.returncode == 0, result.stderr
    assert len(re.findall(r"rank \d: recorded as run \d+", result.stderr)) == 4
    history = run("history", "--db", str(db), "--json", "-")
    runs = json.loads(history.stdout)["runs"]
    assert sorted((r["rank"], r["trace"]["name"]) for r in runs) == [
        (rank, f"rank{rank}{Path(name).suffix}") for rank, name in enumerate(JOB_SAMPLES)
    ]
    assert {r["label"] for r in runs} == {"job 1"}
    listing = run("history", "--db", str(db)).stdout
    assert all(f"rank{r}." in listing and f"(rank {r})" in listing for r in range(4))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--csv", "t.csv"], "--csv and --png write one input"),
        (["--png", "plots"], "--csv and --png write one input"),
        (["--jobs", "2", "--scheduler", "tcp://127.0.0.1:1"], "--jobs sets the local pool"),
        (["--scheduler", "tcp://a:1", "--scheduler-file", "s.json"], "give one"),
        (["--rank-pattern", "("], "not a regular expression"),
        (["--json", "job/rank0.sqlite"], "refusing to overwrite the input"),
    ],
)
def test_job_usage_errors_are_one_line(job: tuple[Path, dict[str, Any], bytes], args: list[str], message: str) -> None:
    folder, _, _ = job
    result = run("analyze", "job", *args, cwd=folder.parent)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nsysfrag: error: ") and message in lines[0]


def test_duplicate_ranks_are_one_line(tmp_path: Path) -> None:
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        shutil.copyfile(SAMPLES / "training_loop.sqlite", tmp_path / sub / "rank1.sqlite")
    result = run("analyze", str(tmp_path / "a"), str(tmp_path / "b"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank 1 twice" in lines[0]


def test_scheduler_without_dask_says_how_to_install_it(job: tuple[Path, dict[str, Any], bytes]) -> None:
    folder, _, _ = job
    # As if dask were not installed: importing distributed fails.
    code = "import sys; sys.modules['distributed'] = None; from nsysfrag.cli import main; main()"
    import os
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", code, "analyze", "job", "--scheduler", "tcp://127.0.0.1:8786"],
        capture_output=True, text=True, cwd=folder.parent, check=False,
        env={k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"},
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'nsysfrag[dask]'" in lines[0]


def test_a_job_of_traces_loads_only_what_traces_need(tmp_path: Path) -> None:
    # GIVEN a job of two nsys exports on the local pool (the coordinator loads the analysis
    # before it forks the workers: all of that is the job's serial part)
    # THEN it loaded neither the snapshot model nor SQLAlchemy, and the job is whole
    for rank in (0, 1):
        shutil.copyfile(SAMPLES / "training_loop.sqlite", tmp_path / f"rank{rank}.sqlite")
    out = tmp_path / "job.json"
    code = (
        "import sys\n"
        "from nsysfrag.cli import main\n"
        "try:\n"
        f"    main(['analyze', {str(tmp_path)!r}, '--jobs', '2', '-q', '--json', {str(out)!r}])\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0, done.code\n"
        "loaded = [m for m in sys.modules if m.startswith(('nsysfrag.models.segments', 'sqlalchemy'))]\n"
        "assert not loaded, loaded\n"
    )
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
    assert [r["rank"] for r in json.loads(out.read_text())["ranks"]] == [0, 1]


def test_the_worst_rank_s_peak_is_at_the_time_its_own_report_gives(tmp_path: Path) -> None:
    # inference_serving.sqlite's first memory event is seconds into its nsys session (and it is
    # the worse rank): the job must count from there, as the rank's own report does, not from
    # the session's start.
    for name in ("inference_serving.sqlite", "churn_anomalies.sqlite"):
        shutil.copy(SAMPLES / name, tmp_path / name)
    alone = run("analyze", "inference_serving.sqlite", cwd=tmp_path, env={"COLUMNS": "120"})
    doc = single("inference_serving.sqlite", cwd=tmp_path)
    assert doc["trace"]["first_event_ns"] > 10**9
    origin = doc["trace"]["first_event_ns"]
    at = f"{(doc['spaces'][0]['peak']['time_ns'] - origin) / 1e9:.3f} s"
    memory = f"{(doc['spaces'][0]['memory_peak']['time_ns'] - origin) / 1e9:.3f} s"
    # The state table's "at" row: peak memory's moment, then the worst fragmentation's.
    cell = r"\s+[│┃]?\s*"
    assert re.search(rf"\bat{cell}{re.escape(memory)}{cell}{re.escape(at)}", alone.stdout), alone.stdout
    job = run("analyze", "inference_serving.sqlite", "churn_anomalies.sqlite", cwd=tmp_path,
              env={"COLUMNS": "200"})  # fmt: skip
    assert job.returncode == 0, job.stderr
    assert re.search(rf"worst rank: 0 — .* at {re.escape(at)}\)", job.stdout), job.stdout

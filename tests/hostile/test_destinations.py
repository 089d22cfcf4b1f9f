"""Hostile destinations (issue 25, item 1): no write through a link or onto a file the run keeps.

Every file nsysfrag writes — reports, the figures in a ``--png`` folder, an nsys export or
recording, the history database — passes one check when it is opened and lands by an atomic
rename (``nsysfrag.destinations``). Each case runs the real command line under the contract of
``contract.py`` (its inputs and the files listed there untouched) and checks what it must do on
top; what the mechanism does on its own is checked in this process at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nsysfrag import destinations
from nsysfrag.errors import InputError
from tests.conftest import REPO, SAMPLES
from tests.hostile.contract import run_nsysfrag
from tests.hostile.fake_nsys_runs import MAGIC, USING, fake_env, fake_report, nsys_calls
from tests.hostile.nsys_cases import small_trace


def _history(path: Path, trace: Path) -> Path:
    """A history database holding one run of ``trace``."""
    run_nsysfrag(["analyze", trace, "-q", "--record", "--db", path])
    return path


def _no_staging_left(folder: Path) -> None:
    left = [p.name for p in folder.iterdir() if p.name.startswith(destinations.TEMP_PREFIX)]
    assert left == [], left


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return small_trace(tmp_path / "t.sqlite")


# ---------------------------------------------------------------- links and hard links


def test_links_in_a_png_folder_are_never_written_through(trace: Path, tmp_path: Path) -> None:
    # main: the input and the history database became PNGs, exit 0
    db = _history(tmp_path / "history.sqlite", trace)
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "pid1_dev0_fragmentation.png").symlink_to(trace)
    (plots / "pid1_dev0_memory.png").symlink_to(db)
    out = run_nsysfrag(["analyze", trace, "-q", "--png", plots], inputs=[trace, db],
                       env={"NSYSFRAG_DB": str(db)})  # fmt: skip
    assert out.returncode == 2
    assert "symbolic link" in out.stderr or "refusing to overwrite the input" in out.stderr
    assert sorted(p.name for p in plots.iterdir()) == [
        "pid1_dev0_fragmentation.png", "pid1_dev0_memory.png"
    ]  # no figure landed: the folder's files are written together or not at all


def test_a_hard_link_to_the_input_in_a_png_folder_is_refused(trace: Path, tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    plots.mkdir()
    os.link(trace, plots / "pid1_dev0_sizes.png")
    out = run_nsysfrag(["analyze", trace, "-q", "--png", plots], inputs=[trace])
    assert out.returncode == 2 and "refusing to overwrite the input trace" in out.stderr
    _no_staging_left(plots)


def test_an_output_that_is_a_link_is_refused_and_its_target_kept(trace: Path, tmp_path: Path) -> None:
    # main: the report went through the link into the file it names
    precious = tmp_path / "notes.txt"
    precious.write_text("mine")
    (tmp_path / "out.json").symlink_to(precious)
    out = run_nsysfrag(["analyze", trace, "-q", "--json", tmp_path / "out.json"],
                       inputs=[trace, precious])  # fmt: skip
    assert out.returncode == 2 and "symbolic link" in out.stderr


def test_an_output_replaced_by_a_rename_keeps_the_input_behind_a_hard_link(
    trace: Path, tmp_path: Path
) -> None:
    # A report that exists is replaced by renaming over its name: a file linked to it under
    # another name (here: last week's report kept as a backup) keeps its bytes.
    report = tmp_path / "r.json"
    report.write_text("last week")
    os.link(report, tmp_path / "backup.json")
    run_nsysfrag(["analyze", trace, "-q", "--json", report], inputs=[trace, tmp_path / "backup.json"])
    assert json.loads(report.read_text())["schema"] == "nsysfrag/1"
    assert (tmp_path / "backup.json").read_text() == "last week"


# ---------------------------------------------------------------- two names, one file


@pytest.mark.parametrize("how", ["dotdot", "linked_folder"])
def test_two_outputs_resolving_to_one_new_file_are_refused(
    trace: Path, tmp_path: Path, how: str
) -> None:
    # main: exit 0, and one of the two reports was lost
    (tmp_path / "real").mkdir()
    (tmp_path / "sub").mkdir()
    if how == "dotdot":
        first, second = tmp_path / "sub" / ".." / "r.out", tmp_path / "r.out"
    else:
        (tmp_path / "link").symlink_to(tmp_path / "real")
        first, second = tmp_path / "link" / "r.out", tmp_path / "real" / "r.out"
    out = run_nsysfrag(["analyze", trace, "-q", "--json", first, "--csv", second], inputs=[trace])
    assert out.returncode == 2 and "both name" in out.stderr
    assert not second.exists()


# ---------------------------------------------------------------- nsys exports and recordings


def test_a_fallback_export_never_replaces_a_foreign_file(trace: Path, tmp_path: Path) -> None:
    # main: X.nsysfrag.sqlite (here the history database) was overwritten by the export
    report = fake_report(tmp_path / "run.nsys-rep")
    foreign = shutil.copy(SAMPLES / "multi_gpu.sqlite", tmp_path / "run.sqlite")
    db = _history(tmp_path / "run.nsysfrag.sqlite", trace)
    out = run_nsysfrag(["analyze", report, "-q"], inputs=[report, Path(foreign), db],
                       env=fake_env(tmp_path))  # fmt: skip
    assert out.returncode == 2 and "neither was exported from run.nsys-rep" in out.stderr
    assert nsys_calls(tmp_path) == []  # refused before nsys ran
    _no_staging_left(tmp_path)


def test_a_failed_export_removes_only_what_it_created(tmp_path: Path) -> None:
    # main: the failed export unlinked the export already there
    report = fake_report(tmp_path / "run.nsys-rep")
    env = fake_env(tmp_path)
    run_nsysfrag(["analyze", report, "-q"], env=env, notes=USING)  # exports run.sqlite
    export = tmp_path / "run.sqlite"
    before = export.read_bytes()
    out = run_nsysfrag(["analyze", report, "-q", "--reexport"], inputs=[report],
                       env={**env, "FAKE_NSYS_FAIL": "export"}, allowed_codes=(3,), notes=USING)  # fmt: skip
    assert "nsys export failed" in out.stderr
    assert export.read_bytes() == before
    _no_staging_left(tmp_path)


def test_profile_never_records_over_the_history_database(trace: Path, tmp_path: Path) -> None:
    # main: `profile -o history --record` with NSYSFRAG_DB=history.sqlite replaced the database
    db = _history(tmp_path / "history.sqlite", trace)
    out = run_nsysfrag(
        ["profile", "-o", tmp_path / "history", "-q", "--record", "--", sys.executable, "-c", "0"],
        inputs=[db], env={**fake_env(tmp_path), "NSYSFRAG_DB": str(db)},
    )
    assert out.returncode == 2 and "refusing to overwrite the history database" in out.stderr
    assert nsys_calls(tmp_path) == []
    assert not (tmp_path / "history.nsys-rep").exists()


def test_profile_never_writes_its_recording_through_a_link(trace: Path, tmp_path: Path) -> None:
    precious = tmp_path / "precious.bin"
    precious.write_bytes(b"keep me")
    (tmp_path / "run.nsys-rep").symlink_to(precious)
    out = run_nsysfrag(
        ["profile", "-o", tmp_path / "run", "-q", "--", sys.executable, "-c", "0"],
        inputs=[precious], env=fake_env(tmp_path),
    )
    assert out.returncode == 2 and "symbolic link" in out.stderr
    _no_staging_left(tmp_path)


def test_profile_lands_its_recording_and_export_by_rename(tmp_path: Path) -> None:
    out = run_nsysfrag(
        ["profile", "-o", tmp_path / "run", "--json", tmp_path / "run.json", "-q", "--",
         sys.executable, "-c", "0"],
        env=fake_env(tmp_path), notes=USING,
    )  # fmt: skip
    assert out.returncode == 0
    assert (tmp_path / "run.nsys-rep").read_bytes().startswith(MAGIC)
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["trace"]["path"] == str(tmp_path / "run.sqlite")
    _no_staging_left(tmp_path)


def test_a_job_json_never_replaces_a_ranks_export_in_the_cache(tmp_path: Path) -> None:
    # main: --json cache/rank0.sqlite replaced rank 0's export (one input: refused)
    reports = [fake_report(tmp_path / f"rank{r}.nsys-rep") for r in (0, 1)]
    cache = tmp_path / "cache"
    cache.mkdir()
    out = run_nsysfrag(
        ["analyze", *reports, "--cache-dir", cache, "-q", "--jobs", "1", "--json",
         cache / "rank0.sqlite"],
        inputs=reports, env=fake_env(tmp_path), notes=("nsysfrag: analyzing 2 ranks", *USING),
    )  # fmt: skip
    assert out.returncode == 2 and "refusing to overwrite the export of rank 0" in out.stderr
    assert not (cache / "rank0.sqlite").exists()


def test_a_single_reports_export_in_the_cache_is_kept_too(tmp_path: Path) -> None:
    report = fake_report(tmp_path / "run.nsys-rep")
    cache = tmp_path / "cache"
    cache.mkdir()
    out = run_nsysfrag(["analyze", report, "--cache-dir", cache, "-q", "--json", cache / "run.sqlite"],
                       inputs=[report], env=fake_env(tmp_path))  # fmt: skip
    assert out.returncode == 2 and "refusing to overwrite the export" in out.stderr
    assert nsys_calls(tmp_path) == []


# ---------------------------------------------------------------- the history database


def test_recording_into_the_input_is_refused(trace: Path) -> None:
    out = run_nsysfrag(["analyze", trace, "-q", "--record", "--db", trace], inputs=[trace])
    assert out.returncode == 2 and "the input trace" in out.stderr


def test_a_new_history_database_is_never_created_through_a_dangling_link(
    trace: Path, tmp_path: Path
) -> None:
    (tmp_path / "history.sqlite").symlink_to(tmp_path / "elsewhere.sqlite")
    out = run_nsysfrag(["analyze", trace, "-q", "--record", "--db", tmp_path / "history.sqlite"],
                       inputs=[trace])  # fmt: skip
    assert out.returncode == 2 and "history.sqlite" in out.stderr
    assert not (tmp_path / "elsewhere.sqlite").exists()


def test_a_link_beside_the_history_database_is_never_followed(trace: Path, tmp_path: Path) -> None:
    # SQLite opens DB-wal and DB-journal beside the database and would write through a link.
    precious = tmp_path / "precious.bin"
    precious.write_bytes(b"keep me")
    db = tmp_path / "history.sqlite"
    (tmp_path / "history.sqlite-wal").symlink_to(precious)
    out = run_nsysfrag(["analyze", trace, "-q", "--record", "--db", db], inputs=[trace, precious])
    assert out.returncode == 2 and "history.sqlite-wal" in out.stderr


# ---------------------------------------------------------------- streams


def test_dev_null_is_written_as_a_stream_not_replaced(trace: Path) -> None:
    out = run_nsysfrag(["analyze", trace, "-q", "--json", "/dev/null"], inputs=[trace])
    assert out.returncode == 0
    assert Path("/dev/null").is_char_device()


def test_a_full_device_is_one_line(trace: Path) -> None:
    out = run_nsysfrag(["analyze", trace, "-q", "--json", "/dev/full"], inputs=[trace])
    assert out.returncode == 2 and "No space left" in out.stderr


def test_a_fifo_nobody_reads_is_refused_at_once(trace: Path, tmp_path: Path) -> None:
    # main: the open blocked until something read the FIFO (forever, in CI)
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    out = run_nsysfrag(["analyze", trace, "-q", "--json", fifo], inputs=[trace])
    assert out.returncode == 2 and "FIFO" in out.stderr


def _shell(command: str, tmp_path: Path) -> tuple[int, str]:
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path, check=False)  # fmt: skip
    return proc.returncode, proc.stderr


def test_json_to_a_full_stdout_fails_in_one_line(trace: Path, tmp_path: Path) -> None:
    # main: exit 0, nothing written
    code, err = _shell(f"{sys.executable} -m nsysfrag analyze {trace} --json - > /dev/full", tmp_path)
    assert code == 2 and err.count("\n") == 1 and "No space left" in err, err


def test_json_to_a_closed_stdout_fails_in_one_line(trace: Path, tmp_path: Path) -> None:
    # main: exit 0 having written nothing
    code, err = _shell(f"{sys.executable} -m nsysfrag analyze {trace} --json - >&-", tmp_path)
    assert code == 2 and err.count("\n") == 1 and "stdout is closed" in err, err


# ---------------------------------------------------------------- the mechanism, in process


def test_the_check_runs_again_when_the_file_is_opened(tmp_path: Path) -> None:
    # Checked before the work, and then the name became a hard link to the input meanwhile.
    destinations.begin_run()
    kept = tmp_path / "input.sqlite"
    kept.write_bytes(b"input")
    destinations.protect("the input trace", kept)
    out = tmp_path / "out.json"
    destinations.check(out, "--json")
    os.link(kept, out)
    with pytest.raises(InputError, match="refusing to overwrite the input trace"):
        destinations.write_text(out, "{}", "--json")
    assert kept.read_bytes() == b"input"
    _no_staging_left(tmp_path)


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    destinations.begin_run()
    out = tmp_path / "out.json"
    out.write_text("old")
    with pytest.raises(RuntimeError), destinations.writing("--json") as batch:
        with batch.open(out) as f:
            f.write("half")  # type: ignore[arg-type]
        raise RuntimeError("the renderer failed")
    assert out.read_text() == "old"
    _no_staging_left(tmp_path)


def test_a_folder_whose_figures_fail_is_removed_when_this_run_made_it(tmp_path: Path) -> None:
    destinations.begin_run()
    folder = tmp_path / "plots"
    with pytest.raises(RuntimeError), destinations.folder_batch(folder, "--png") as (_, batch):
        with batch.open(folder / "a.png", binary=True) as f:
            f.write(b"png")  # type: ignore[arg-type]
        raise RuntimeError("a figure failed")
    assert not folder.exists()


def test_one_output_cannot_land_on_another_written_before_it(tmp_path: Path) -> None:
    destinations.begin_run()
    first = tmp_path / "a.json"
    destinations.write_text(first, "{}", "--json")
    os.link(first, tmp_path / "b.html")
    with pytest.raises(InputError, match="--json writes this file too"):
        destinations.write_text(tmp_path / "b.html", "<html>", "--html")
    with pytest.raises(InputError, match="--json writes this file too"):
        destinations.write_text(tmp_path / "x" / ".." / "a.json", "<html>", "--html")


def test_a_replaced_report_keeps_its_mode(tmp_path: Path) -> None:
    destinations.begin_run()
    out = tmp_path / "out.json"
    out.write_text("old")
    out.chmod(0o600)
    destinations.write_text(out, "new", "--json")
    assert out.read_text() == "new" and (out.stat().st_mode & 0o777) == 0o600


def test_the_history_database_file_is_checked_before_sqlite_opens_it(tmp_path: Path) -> None:
    from nsysfrag.history import open_store

    fifo = tmp_path / "fifo.sqlite"
    os.mkfifo(fifo)
    for create in (True, False):
        with pytest.raises(InputError, match="FIFO"):
            open_store(str(fifo), create=create)

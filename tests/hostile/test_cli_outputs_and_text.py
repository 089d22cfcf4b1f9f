"""Hostile and unlucky command lines: no lost file, no terminal injection, no traceback.

Each case runs the real command line under the contract of ``contract.py`` (30 s, 4 GiB, exit
0 or 2, at most one stderr line, inputs untouched) and checks what it must do on top.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsysfrag.testing.nsys_export import (
    FREE,
    ApiRow,
    ExportOptions,
    Gpu,
    MemoryRow,
    NvtxRow,
    write_export,
)
from tests.conftest import BASE, REPO, SAMPLES, MiB
from tests.hostile.contract import run_nsysfrag

SAMPLE = SAMPLES / "training_loop.sqlite"
# Rich markup that would become a clickable link, a style, or a MarkupError; escape sequences
# that would clear the screen or make a hyperlink; a bidi override.
MARKUP = "[link=http://evil.example]click[/link] [bold red]red[/] [/]"
ESCAPES = "\x1b[2J\x1b]8;;http://evil.example\x07x\x1b]8;;\x07 \u202e"
EVIL = f"{MARKUP} {ESCAPES}"
# A file name cannot hold '/': opening tags only (they would still style and link).
NAME_MARKUP = "[bold red]red [link=https:evil.example]click"
NAME_ESCAPES = "\x1b[2J\x07 \u202e"
SHOWN = "\\x1b[2J\\x1b]8;;http://evil.example\\x07x\\x1b]8;;\\x07 \\u202e"
WIDE = {"COLUMNS": "400"}


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    copy = tmp_path / "t.sqlite"
    shutil.copy(SAMPLE, copy)
    return copy


def _no_escape_codes(text: str) -> None:
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text


# ---------------------------------------------------------------- data loss


def test_an_output_hard_linked_to_the_input_is_refused(trace: Path, tmp_path: Path) -> None:
    os.link(trace, tmp_path / "out.json")
    out = run_nsysfrag(["analyze", trace, "--json", tmp_path / "out.json"], inputs=[trace])
    assert out.returncode == 2 and "refusing to overwrite the input trace" in out.stderr


def test_an_output_symlinked_to_the_input_is_refused(trace: Path, tmp_path: Path) -> None:
    (tmp_path / "out.csv").symlink_to(trace)
    out = run_nsysfrag(["analyze", trace, "--csv", tmp_path / "out.csv"], inputs=[trace])
    assert out.returncode == 2 and "the input trace" in out.stderr


def test_json_naming_the_baseline_is_refused_before_it_is_read(
    trace: Path, tmp_path: Path
) -> None:
    base = tmp_path / "base.json"
    run_nsysfrag(["analyze", trace, "--json", base, "-q"], inputs=[trace])
    os.link(base, tmp_path / "same.json")
    for target in (base, tmp_path / "same.json"):
        argv = ["analyze", trace, "--baseline", base, "--fail-on-regression", "0", "--json", target]
        out = run_nsysfrag(argv, inputs=[trace, base])
        assert out.returncode == 2 and "the --baseline document" in out.stderr


def test_no_output_may_name_the_history_database(trace: Path, tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    run_nsysfrag(["analyze", trace, "-q", "--record", "--db", db], inputs=[trace])
    cases = [
        (["analyze", trace, "-q", "--record", "--db", db, "--json", db], {}),
        (["analyze", trace, "-q", "--csv", db], {"NSYSFRAG_DB": str(db)}),
        (["whatif", trace, "-q", "--json", db], {"NSYSFRAG_DB": str(db)}),
        (["history", "--db", db, "--json", db], {}),
    ]
    for argv, env in cases:
        out = run_nsysfrag(argv, inputs=[trace, db], env=env)
        assert out.returncode == 2 and "the history database" in out.stderr, argv


def test_an_empty_history_database_is_still_the_history_database(trace: Path, tmp_path: Path) -> None:
    # GIVEN a history database file that SQLite created but has not written yet (empty): the
    # look-up that sees no SQLite header in an output skips SQLAlchemy, but not for this one
    db = tmp_path / "history.sqlite"
    db.write_bytes(b"")
    out = run_nsysfrag(["analyze", trace, "-q", "--json", db], inputs=[trace, db],
                       env={"NSYSFRAG_DB": str(db)})  # fmt: skip
    assert out.returncode == 2 and "the history database" in out.stderr
    assert db.read_bytes() == b""


def test_two_outputs_naming_one_file_are_refused(trace: Path, tmp_path: Path) -> None:
    out = run_nsysfrag(
        ["analyze", trace, "--json", tmp_path / "r", "--csv", tmp_path / "r"], inputs=[trace]
    )
    assert out.returncode == 2 and "--json and --csv both name" in out.stderr
    assert not (tmp_path / "r").exists()


def test_png_creates_its_folder_but_never_a_missing_parent(trace: Path, tmp_path: Path) -> None:
    # The same rule as every other output: nsysfrag creates what it is asked for, not a
    # folder above it, so a mistyped path fails before any work.
    missing = tmp_path / "no-such-folder" / "plots"
    out = run_nsysfrag(["analyze", trace, "-q", "--png", missing], inputs=[trace])
    assert out.returncode == 2 and "does not exist; create it first" in out.stderr
    assert not (tmp_path / "no-such-folder").exists()
    run_nsysfrag(["analyze", trace, "-q", "--png", tmp_path / "plots"], inputs=[trace])
    assert len(list((tmp_path / "plots").glob("*.png"))) == 6


def test_csv_to_stdout_never_writes_a_file_named_dash(trace: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    out = run_nsysfrag(["analyze", trace, "--csv", "-"], inputs=[trace], cwd=work)
    assert out.stdout.startswith("pid,device,") and list(work.iterdir()) == []


# ---------------------------------------------------------------- terminal injection


def test_history_shows_labels_tags_and_names_as_text(trace: Path, tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    named = tmp_path / f"{NAME_MARKUP} {NAME_ESCAPES}.sqlite"
    shutil.copy(trace, named)
    run_nsysfrag(["analyze", named, "-q", "--record", "--db", db, "--label", EVIL,
                  "--tag", f"k={EVIL}"], inputs=[named])  # fmt: skip
    run_nsysfrag(["analyze", trace, "-q", "--record", "--db", db, "--label", "[/]"])
    for width in (WIDE, {"COLUMNS": "80"}):
        out = run_nsysfrag(["history", "--db", db], inputs=[db], env=width)
        _no_escape_codes(out.stdout)
        assert "[/]" in out.stdout  # once a MarkupError
        if width is WIDE:
            assert MARKUP in out.stdout and SHOWN in out.stdout
            assert f"k={MARKUP}" in out.stdout and NAME_MARKUP in out.stdout
    out = run_nsysfrag(["history", "--db", db, "--trend", "global_frag"], inputs=[db], env=WIDE)
    _no_escape_codes(out.stdout)


def test_a_trace_path_is_text_in_the_report_and_in_one_line_errors(tmp_path: Path) -> None:
    named = tmp_path / f"{NAME_MARKUP}\nsecond line {NAME_ESCAPES}.sqlite"
    shutil.copy(SAMPLE, named)
    out = run_nsysfrag(["analyze", named], inputs=[named], env=WIDE)
    _no_escape_codes(out.stdout)
    assert NAME_MARKUP in out.stdout and "\\nsecond line" in out.stdout
    missing = tmp_path / f"gone\n{NAME_ESCAPES}.sqlite"
    out = run_nsysfrag(["analyze", missing])  # the contract: one stderr line
    assert out.returncode == 2 and "gone\\n" in out.stderr
    _no_escape_codes(out.stderr)


def _evil_site_trace(tmp_path: Path) -> Path:
    """A|B|C allocated inside an NVTX range with an evil name, B freed first: a hotspot."""
    s = 1_000_000_000
    memory, api = [], []
    for corr, (sec, offset, size) in enumerate([(1, 0, MiB), (2, MiB, 2 * MiB), (3, 3 * MiB, MiB)], 1):
        memory.append(MemoryRow(sec * s, 1, 0, BASE + offset, size, correlation_id=corr))
        api.append(ApiRow(sec * s - 100, sec * s + 100, 1, 7, "cudaMalloc_v3020", corr))
    memory.append(MemoryRow(4 * s, 1, 0, BASE + MiB, 2 * MiB, op=FREE))
    nvtx = [NvtxRow(s - 1000, 3 * s + 1000, 1, 7, EVIL)]
    options = ExportOptions(processes=[(1, EVIL)])
    gpus = [Gpu(0, name=EVIL, total_memory=64 * MiB)]
    return write_export(tmp_path / "evil.sqlite", memory, api, nvtx, gpus, options)


def test_nvtx_process_and_device_names_are_text(tmp_path: Path) -> None:
    path = _evil_site_trace(tmp_path)
    for width in (WIDE, {"COLUMNS": "80"}):
        out = run_nsysfrag(["analyze", path], inputs=[path], env=width)
        _no_escape_codes(out.stdout)
        assert "[/]" in out.stdout
    out = run_nsysfrag(["analyze", path], inputs=[path], env=WIDE)
    assert out.stdout.count(MARKUP) >= 3  # process, device, hotspot site (and the advice)


def _evil_snapshot(tmp_path: Path) -> Path:
    """A snapshot whose allocation stacks name an evil file and function: a hotspot site."""
    s, t0 = 0x7F00_0000_0000, 1_000_000
    evil = [{"name": EVIL, "filename": f"/home/{EVIL}/model.py", "line": 1}]
    other = [{"name": "step", "filename": "/home/me/optim.py", "line": 9}]

    def ev(action: str, addr: int, size: int, t: int, frames: list[dict[str, object]]) -> dict[str, object]:
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t0 + t, "frames": frames}

    def blk(addr: int, size: int, state: str, frames: list[dict[str, object]]) -> dict[str, object]:
        return {"address": addr, "size": size, "requested_size": size if state != "inactive" else 0,
                "state": state, "frames": frames}  # fmt: skip

    trace = [ev("segment_alloc", s, 20 * MiB, 1, []), ev("alloc", s, 2 * MiB, 2, other),
             ev("alloc", s + 2 * MiB, 2 * MiB, 3, evil), ev("alloc", s + 4 * MiB, 2 * MiB, 4, other),
             ev("free_completed", s + 2 * MiB, 2 * MiB, 6, evil)]  # fmt: skip
    blocks = [blk(s, 2 * MiB, "active_allocated", other), blk(s + 2 * MiB, 2 * MiB, "inactive", []),
              blk(s + 4 * MiB, 2 * MiB, "active_allocated", other),
              blk(s + 6 * MiB, 14 * MiB, "inactive", [])]  # fmt: skip
    segment = {"device": 0, "address": s, "total_size": 20 * MiB, "allocated_size": 4 * MiB,
               "active_size": 4 * MiB, "requested_size": 4 * MiB, "stream": 0,
               "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
               "frames": [], "blocks": blocks}  # fmt: skip
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [segment], "device_traces": [trace]}, protocol=4))
    return path


def test_snapshot_frame_names_are_text(tmp_path: Path) -> None:
    path = _evil_snapshot(tmp_path)
    for width in (WIDE, {"COLUMNS": "80"}):
        out = run_nsysfrag(["analyze", path, "--capacity", "64MiB"], inputs=[path], env=width)
        _no_escape_codes(out.stdout)
        assert "[/]" in out.stdout
    out = run_nsysfrag(["analyze", path, "--capacity", "64MiB"], inputs=[path], env=WIDE)
    assert MARKUP in out.stdout


# ---------------------------------------------------------------- the history database


def _journal(db: Path, mode: str) -> None:
    with sqlite3.connect(db) as connection:
        connection.execute(f"PRAGMA journal_mode = {mode}")
    connection.close()


def test_listing_a_history_never_writes_it(trace: Path, tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    run_nsysfrag(["analyze", trace, "-q", "--record", "--db", db, "--label", "x"])
    _journal(db, "DELETE")
    for argv in (["history"], ["history", "--json", "-"], ["history", "--check"],
                 ["history", "--trend", "global_frag"]):  # fmt: skip
        run_nsysfrag([*argv, "--db", db], inputs=[db])
    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    connection.close()


def test_a_history_from_an_older_nsysfrag_is_read_without_upgrading_the_file(
    tmp_path: Path,
) -> None:
    from sqlalchemy import create_engine

    from nsysfrag.history.migrations import MIGRATIONS, migrate

    db = tmp_path / "old.sqlite"
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as connection:
        migrate(connection, MIGRATIONS[:1])
        connection.exec_driver_sql(
            "INSERT INTO runs (recorded_at, trace_path, trace_sha256, label, model,"
            " granularity_bytes, capacity_override_bytes) VALUES"
            " ('2025-01-01 00:00:00', '/x/old.sqlite', 'ab', 'from v1', 'observed', 512, 0)"
        )
    engine.dispose()
    out = run_nsysfrag(["history", "--db", db], inputs=[db], env=WIDE)
    assert "from v1" in out.stdout


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder on a tmpfs that the test can remount read-only (needs root; else skipped)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)],
                             capture_output=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)


def test_a_wal_history_on_read_only_storage_is_listed_and_recording_fails_in_a_line(
    trace: Path, read_only_folder: Path
) -> None:
    db = read_only_folder / "history.sqlite"
    run_nsysfrag(["analyze", trace, "-q", "--record", "--db", db, "--label", "on tmpfs"])
    with sqlite3.connect(db) as connection:  # WAL, as nsysfrag's writers leave it
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    connection.close()
    remount = ["mount", "-o", "remount,ro", str(read_only_folder)]
    subprocess.run(remount, check=True, capture_output=True)
    out = run_nsysfrag(["history", "--db", db], inputs=[db], env=WIDE)
    # No writer has it open (no -wal file): read as an immutable file at once, which
    # read-only storage allows, and nothing to say about it.
    assert "on tmpfs" in out.stdout and out.stderr == ""
    out = run_nsysfrag(["analyze", SAMPLES / "multi_gpu.sqlite", "-q", "--record", "--db", db],
                       inputs=[db])  # fmt: skip
    assert out.returncode == 2 and "history.sqlite" in out.stderr


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["history", "--check", "--threshold", "nan"], "--threshold"),
        (["history", "--db", ""], "--db"),
        (["history", "--db", "-"], "--db"),
        (["history", "--limit", str(2**70)], "--limit"),
        (["analyze", SAMPLE, "--record", "--db", "-"], "--db"),
    ],
)
def test_bad_history_options_are_refused(tmp_path: Path, argv: list[str], option: str) -> None:
    out = run_nsysfrag(argv, cwd=tmp_path, env={"NSYSFRAG_DB": str(tmp_path / "h.sqlite")})
    assert out.returncode == 2 and option in out.stderr
    assert list(tmp_path.iterdir()) == []  # neither a file named '-' nor the default database


def test_a_new_label_or_tag_for_a_recorded_trace_updates_it_and_says_so(
    trace: Path, tmp_path: Path
) -> None:
    db = tmp_path / "history.sqlite"
    run_nsysfrag(["analyze", trace, "-q", "--record", "--db", db, "--tag", "a=1"])
    out = run_nsysfrag(["analyze", trace, "-q", "--record", "--db", db, "--label", "retry",
                        "--tag", "a=2", "--tag", "b=3"])  # fmt: skip
    assert "already recorded as run 1" in out.stderr
    assert "updated its label ('retry') and tags a=2, b=3" in out.stderr
    listing = run_nsysfrag(["history", "--db", db, "--json", "-"]).stdout
    assert '"label": "retry"' in listing and '"a": "2"' in listing and '"b": "3"' in listing
    again = run_nsysfrag(["analyze", trace, "-q", "--record", "--db", db, "--label", "retry"])
    assert "not recorded again" in again.stderr


# ---------------------------------------------------------------- streams and documents


@pytest.mark.parametrize("closed", [">&-", "2>&-", ">&- 2>&-"])
def test_a_closed_stdout_or_stderr_ends_without_a_traceback(closed: str, tmp_path: Path) -> None:
    script = f'"$@" {closed}; echo "exit $?" >&3'
    proc = subprocess.run(
        ["bash", "-c", f"exec 3>{tmp_path / 'rc'}; {script}", "_", sys.executable, "-m",
         "nsysfrag", "analyze", str(SAMPLE)],
        env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert (tmp_path / "rc").read_text() == "exit 0\n"
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr


def test_a_deeply_nested_json_document_is_one_line(trace: Path, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    out = run_nsysfrag(["compare", deep, deep], inputs=[deep])
    assert out.returncode == 2 and "nested too deeply" in out.stderr
    out = run_nsysfrag(["analyze", trace, "--baseline", deep], inputs=[deep, trace])
    assert out.returncode == 2 and "nested too deeply" in out.stderr

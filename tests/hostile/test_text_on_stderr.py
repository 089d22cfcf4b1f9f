"""Text from an input on stderr (issue 25, item 8): one line, and no raw control character.

- Figures: every text matplotlib draws passes ``printable`` first, as plain text (never
  ``$math$``), and a glyph a font lacks is drawn without a warning
  (``reporters/figure_axes.save_figure``): a site or frame named with ESC or BEL made matplotlib
  print "Glyph 27 missing" warnings, raw character and all, 8-28 lines on runs that exit 0.
- SQLite's own messages may quote bytes that are not UTF-8 (a view naming a column that does
  not exist): they read with U+FFFD, not ``internal error: UnicodeDecodeError``.
"""

from __future__ import annotations

import pickle
import sqlite3
from pathlib import Path

import pytest

from nsysfrag.testing.nsys_export import (
    ApiRow,
    ExportOptions,
    Gpu,
    MemoryRow,
    NvtxRow,
    write_export,
)
from tests.conftest import BASE, SAMPLES, MiB
from tests.hostile import nsys_cases as cases
from tests.hostile.contract import run_nsysfrag

CONTROL = "\x1b[2J\x07 \x1b]8;;http://evil.example\x07x\x1b]8;;\x07\r\n"
MATH = r"$\notacommand{x}$ costs $5 and $6"
CJK = "训练步骤"


def _site_trace(path: Path, name: str) -> Path:
    """A|B|C allocated inside an NVTX range named ``name``, B freed first: a hotspot."""
    s = 1_000_000_000
    memory, api = [], []
    for corr, (sec, offset, size) in enumerate([(1, 0, MiB), (2, MiB, 2 * MiB), (3, 3 * MiB, MiB)], 1):
        memory.append(MemoryRow(sec * s, 1, 0, BASE + offset, size, correlation_id=corr))
        api.append(ApiRow(sec * s - 100, sec * s + 100, 1, 7, "cudaMalloc_v3020", corr))
    memory.append(MemoryRow(4 * s, 1, 0, BASE + MiB, 2 * MiB, op=1))
    return write_export(path, memory, api, [NvtxRow(s - 1000, 3 * s + 1000, 1, 7, name)],
                        [Gpu(0, name=name, total_memory=64 * MiB)],
                        ExportOptions(processes=[(1, name)]))  # fmt: skip


def _frame_snapshot(path: Path, name: str) -> Path:
    """A snapshot whose allocation stack names a function ``name`` in a file ``name``."""
    frames = [{"name": name, "filename": f"/home/{name}/model.py", "line": 1}]
    seg = BASE
    trace = [
        {"action": "segment_alloc", "addr": seg, "size": 20 * MiB, "stream": 0, "time_us": 1, "frames": []},
        *({"action": "alloc", "addr": seg + i * 2 * MiB, "size": 2 * MiB, "stream": 0,
           "time_us": 2 + i, "frames": frames} for i in range(3)),
        {"action": "free_completed", "addr": seg + 2 * MiB, "size": 2 * MiB, "stream": 0,
         "time_us": 9, "frames": frames},
    ]  # fmt: skip
    blocks = [
        {"address": seg, "size": 2 * MiB, "requested_size": 2 * MiB, "state": "active_allocated", "frames": frames},
        {"address": seg + 2 * MiB, "size": 2 * MiB, "requested_size": 0, "state": "inactive", "frames": []},
        {"address": seg + 4 * MiB, "size": 2 * MiB, "requested_size": 2 * MiB, "state": "active_allocated", "frames": frames},
        {"address": seg + 6 * MiB, "size": 14 * MiB, "requested_size": 0, "state": "inactive", "frames": []},
    ]  # fmt: skip
    segment = {"device": 0, "address": seg, "total_size": 20 * MiB, "stream": 0,
               "segment_type": "large", "blocks": blocks}  # fmt: skip
    path.write_bytes(pickle.dumps({"segments": [segment], "device_traces": [trace]}, protocol=4))
    return path


@pytest.mark.parametrize("name", [CONTROL, MATH, CJK], ids=["control", "mathtext", "cjk"])
@pytest.mark.parametrize("kind", ["nsys", "snapshot"])
def test_figures_of_hostile_names_say_nothing_on_stderr(tmp_path: Path, kind: str, name: str) -> None:
    # main, control characters: 8-28 "Glyph 27 (\x1b) missing" warnings on stderr, exit 0
    if kind == "nsys":
        path = _site_trace(tmp_path / "t.sqlite", name)
        extra: list[str] = []
    else:
        path = _frame_snapshot(tmp_path / "t.pickle", name)
        extra = ["--capacity", "64MiB"]
    out = run_nsysfrag(["analyze", path, "-q", "--html", tmp_path / "r.html", "--png",
                        tmp_path / "png", *extra], inputs=[path])  # fmt: skip
    assert out.returncode == 0 and out.stderr == "", out.stderr
    html = (tmp_path / "r.html").read_text()
    figures = [part.split("</svg>")[0] for part in html.split("<svg")[1:]]
    assert figures and not any("\x1b" in f or "\x07" in f for f in figures)  # XML forbids them
    assert len(list((tmp_path / "png").glob("*.png"))) == 6


def test_a_history_chart_of_a_hostile_model_name_says_nothing(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    for trace in ("multi_gpu.sqlite", "caching_allocator.sqlite"):
        run_nsysfrag(["analyze", SAMPLES / trace, "-q", "--record", "--db", db])
    con = sqlite3.connect(db)
    with con:
        con.execute("UPDATE run_spaces SET model = ?", (f"observed{CONTROL}",))
    con.close()
    out = run_nsysfrag(["history", "--db", db, "--trend", "global_frag", "--png",
                        tmp_path / "trend.png"], inputs=[db])  # fmt: skip
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert "\x1b" not in out.stdout


def test_a_schema_entry_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    # main: "internal error: UnicodeDecodeError" (SQLite's "no such column: x\xff")
    path = cases.view_memory_table(tmp_path / "v.sqlite")
    cases.sql(
        path,
        "PRAGMA writable_schema = ON",
        f"UPDATE sqlite_master SET sql = 'CREATE VIEW {cases.MEMORY} AS SELECT *, x' ||"
        f" CAST(X'FF' AS TEXT) || ' FROM recorded' WHERE name = '{cases.MEMORY}'",
    )
    out = run_nsysfrag(["analyze", path, "-q"], inputs=[path])
    assert out.returncode == 2 and "no such column: x\ufffd" in out.stderr


def test_history_text_that_is_not_utf8_reads_with_a_replacement(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    run_nsysfrag(["analyze", SAMPLES / "multi_gpu.sqlite", "-q", "--record", "--db", db])
    con = sqlite3.connect(db)
    with con:
        con.execute("UPDATE runs SET label = CAST(X'6E6967687479FF' AS TEXT)")
    con.close()
    out = run_nsysfrag(["history", "--db", db], inputs=[db], env={"COLUMNS": "200"})
    assert out.returncode == 0 and "nighty\ufffd" in out.stdout

"""``nsysfrag whatif`` on damaged inputs keeps the contract ``analyze`` keeps: a damaged snapshot
or SQLite export is one line on stderr that says what to do, exit 2, no traceback, the input
untouched, and no half-written report."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.hostile import nsys_cases as cases
from tests.hostile.contract import run_nsysfrag

SAMPLES = Path(__file__).resolve().parent.parent.parent / "sample_traces"
SNAPSHOT = SAMPLES / "inference_snapshot.pickle"


def truncated_snapshot(folder: Path) -> Path:
    path = folder / "truncated.pickle"
    data = SNAPSHOT.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def scribbled_snapshot(folder: Path) -> Path:
    """A 4 KiB run of garbage in the middle of the pickle's opcode stream."""
    data = bytearray(SNAPSHOT.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = b"\xa5" * 4096
    path = folder / "scribbled.pickle"
    path.write_bytes(bytes(data))
    return path


def wrong_shape_snapshot(folder: Path) -> Path:
    """A pickle of plain data that is no snapshot: segments is a string."""
    path = folder / "shape.pickle"
    path.write_bytes(pickle.dumps({"segments": "none", "device_traces": [[]]}, protocol=4))
    return path


def truncated_sqlite(folder: Path) -> Path:
    path = cases.sample_copy(folder, "training_loop.sqlite")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    return path


DAMAGED: dict[str, Callable[[Path], Path]] = {
    "truncated-snapshot": truncated_snapshot,
    "scribbled-snapshot": scribbled_snapshot,
    "wrong-shape-snapshot": wrong_shape_snapshot,
    "corrupt-sqlite-page": lambda folder: cases.corrupt_page(folder, page=2),
    "truncated-sqlite": truncated_sqlite,
    "not-nsys-sqlite": lambda folder: cases.not_nsys(folder / "other.sqlite"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED))
@pytest.mark.parametrize("validate", [False, True], ids=["whatif", "validate"])
def test_a_damaged_input_is_one_line_exit_2(tmp_path: Path, damage: str, validate: bool) -> None:
    path = DAMAGED[damage](tmp_path)
    json_out, html_out = tmp_path / "w.json", tmp_path / "w.html"
    args = ["whatif", path, "--json", json_out, "--html", html_out, "--policy", "best-fit"]
    out = run_nsysfrag([*args, *(["--validate"] if validate else [])], inputs=[path])
    # THEN exit 2 with one line that names the input, and no report was written
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"nsysfrag: error: {path}: ") and out.stdout == ""
    # AND it says what to do next: dump, export or pass another file
    assert any(word in out.stderr for word in ("again", "export", "pass", "write one")), out.stderr
    assert not json_out.exists() and not html_out.exists()

"""Option values: one parser for sizes, and every bad value is one line, exit 2, naming the
option, before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nsysfrag.checks.gates import parse_gate
from nsysfrag.errors import InputError
from nsysfrag.units import MAX_BYTES, SizeError, parse_bytes
from tests.conftest import SAMPLES
from tests.hostile.contract import run_nsysfrag

TRACE = SAMPLES / "training_loop.sqlite"
SNAPSHOT = SAMPLES / "training_snapshot.pickle"


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512", 512),
        ("80GiB", 80 << 30),
        ("80 GiB", 80 << 30),
        ("80gib", 80 << 30),
        ("80GB", 80 * 10**9),
        ("80G", 80 * 10**9),
        ("2k", 2000),
        ("2kB", 2000),
        ("2KiB", 2048),
        ("1.5KiB", 1536),
        ("1.3GiB", int(1.3 * (1 << 30))),
        ("8e9", 8 * 10**9),
        ("2PiB", 2 << 50),
        ("1000000TiB", 1000000 << 40),
        ("1EiB", MAX_BYTES),
        ("9223372036854775", 9223372036854775),
    ],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("lots", "not a size"),
        ("-5", "not a size"),
        ("2XB", "unknown unit 'XB'"),
        ("9223372036854775807", "larger than 1 EiB"),
        ("8000PiB", "larger than 1 EiB"),
        ("2EiB", "larger than 1 EiB"),
        ("1e999", "larger than 1 EiB"),
        ("0.5", "at least 1 byte"),
    ],
)
def test_sizes_refused(text: str, why: str) -> None:
    with pytest.raises(SizeError, match=why):
        parse_bytes(text, minimum=1)


def test_gates_read_sizes_with_the_same_parser() -> None:
    assert parse_gate("largest_free_bytes<2GiB").limit == 2 << 30
    assert parse_gate("largest_free_bytes<2GB").limit == 2 * 10**9
    assert parse_gate("largest_free_bytes<2k").limit == 2000
    with pytest.raises(InputError, match="larger than 1 EiB"):
        parse_gate("largest_free_bytes<9000PiB")


BAD = [
    (["analyze", TRACE, "--capacity", "9223372036854775807"], "--capacity"),
    (["analyze", TRACE, "--capacity", "8000PiB"], "--capacity"),
    (["analyze", TRACE, "--capacity", "2XB"], "--capacity"),
    (["analyze", TRACE, "--granularity", "0"], "--granularity"),
    (["analyze", TRACE, "--fail-on", "largest_free_bytes<2XB"], "--fail-on"),
    (["analyze", TRACE, "--json", "-", "--html", "-"], "--json and --html"),
    (["analyze", TRACE, "--csv", "-", "--json", "-"], "--json and --csv"),
    (["analyze", TRACE, "-o", "-"], "-o -"),
    (["analyze", TRACE, "-o", "r.json", "--json", "s.json"], "-o r.json and --json"),
    (["analyze", TRACE, "--png", "-"], "--png -"),
    (["analyze", TRACE, "--baseline", TRACE, "--fail-on-regression", "nan"], "--fail-on-regression"),
    (["analyze", TRACE, "--no-such-option"], "--no-such-option"),
    (["analyze", TRACE, "--record", "--db", ""], "--db"),
    (["compare", TRACE, TRACE, "--fail-on-regression", "inf"], "--fail-on-regression"),
    (["history", "--check", "--threshold", "nan"], "--threshold"),
    (["history", "--check", "--threshold", "-1"], "--threshold"),
    (["history", "--limit", str(2**70)], "--limit"),
    (["history", "--db", ""], "--db"),
    (["history", "--db", "-"], "--db"),
    (["history", "--json", "-", "--trend", "global_frag", "--png", "-"], "--png -"),
    (["whatif", SNAPSHOT, "--capacity", "9223372036854775807"], "--capacity"),
    (["whatif", SNAPSHOT, "--json", "-", "--html", "-"], "--json and --html"),
]


@pytest.mark.parametrize(("argv", "option"), BAD, ids=[f"{i}:{o}" for i, (_, o) in enumerate(BAD)])
def test_a_bad_option_is_one_line_that_names_it(
    tmp_path: Path, argv: list[str | Path], option: str
) -> None:
    env = {"NSYSFRAG_DB": str(tmp_path / "history.sqlite")}
    out = run_nsysfrag(argv, inputs=[TRACE, SNAPSHOT], cwd=tmp_path, env=env, allowed_codes=(2,))
    assert out.stderr.startswith("nsysfrag: error: ") and option in out.stderr, out.stderr
    assert out.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing written: no file named '-', no database


def test_a_size_up_to_the_bound_is_accepted(tmp_path: Path) -> None:
    out = run_nsysfrag(["analyze", TRACE, "--capacity", "1000000TiB", "--json", "-"], cwd=tmp_path)
    assert json.loads(out.stdout)["spaces"][0]["capacity_bytes"] == 1000000 << 40


def test_csv_to_stdout_is_the_csv_and_no_file_named_dash(tmp_path: Path) -> None:
    out = run_nsysfrag(["analyze", TRACE, "--csv", "-"], inputs=[TRACE], cwd=tmp_path)
    assert out.stdout.startswith("pid,device,event_index,time_ns,event,")
    assert "observed device pages" not in out.stdout  # the CSV replaces the terminal report
    assert list(tmp_path.iterdir()) == []


def test_html_by_suffix_and_help_says_so(tmp_path: Path) -> None:
    run_nsysfrag(["analyze", TRACE, "-o", "r.html", "-q"], inputs=[TRACE], cwd=tmp_path)
    assert (tmp_path / "r.html").read_text().lower().startswith("<!doctype html>")
    help_text = " ".join(run_nsysfrag(["analyze", "--help"]).stdout.split())
    assert "suffix names: .json or .html" in help_text


def test_the_old_width_variable_is_gone_and_columns_decides(tmp_path: Path) -> None:
    for env in ({"NSYSFRAG_WIDTH": "wide"}, {"COLUMNS": "wide"}, {"COLUMNS": "100"}):
        out = run_nsysfrag(["analyze", TRACE], cwd=tmp_path, env=env)
        widest = max(len(line) for line in out.stdout.splitlines())
        assert widest == (100 if env.get("COLUMNS") == "100" else 80)

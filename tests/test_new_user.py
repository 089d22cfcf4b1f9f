"""What a new user meets first: bare ``nsysfrag``, a wrong file, a failed rank, the first-run
notice, a report at 80 columns, and a snapshot with no trace (each item of issue 22's 6 with
a test: terminal text or exit code; the HTML layout is tests/test_html_fit.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from nsysfrag.cli import cli
from nsysfrag.reporters.figures import TIME_FIGURES, figure_builders
from nsysfrag.reporters.layout import name_parts
from tests.conftest import REAL_SNAPSHOTS, REPO, SAMPLES

# Both inputs, as a message names them.
BOTH = ("nsys export --type sqlite", "torch.cuda.memory._dump_snapshot()")


def nsysfrag(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "nsysfrag", *args], capture_output=True,
                          text=True, env=env, check=False)  # fmt: skip


def test_bare_nsysfrag_prints_the_help_and_exits_0() -> None:
    done = nsysfrag()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: nsysfrag") and "Commands:" in done.stdout
    assert "analyze" in done.stdout and "whatif" in done.stdout
    assert "error" not in done.stderr and "\\n" not in done.stdout + done.stderr


@pytest.mark.parametrize("command", ["analyze", "whatif"])
def test_a_wrong_file_names_both_inputs(tmp_path: Path, command: str) -> None:
    model = tmp_path / "model.pt"
    model.write_bytes(b"PK\x03\x04" + bytes(200))  # torch.save writes a zip archive
    own = tmp_path / "run.json"
    assert CliRunner().invoke(cli, ["analyze", str(SAMPLES / "training_loop.sqlite"), "--json", str(own), "-q"]).exit_code == 0
    for wrong in (model, own):
        done = nsysfrag(command, str(wrong))
        assert done.returncode == 2
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"nsysfrag: error: {wrong}") and all(s in line for s in BOTH), line
    assert "a JSON report nsysfrag wrote" in nsysfrag(command, str(own)).stderr


def test_the_first_run_notice_promises_no_time() -> None:
    from nsysfrag.pipeline.feedback import Feedback

    doc = Feedback.compiling.__doc__ or ""
    assert "bench_startup" in doc  # what was measured is said where it was measured
    source = Path(sys.modules["nsysfrag.pipeline.feedback"].__file__ or "").read_text()
    label = re.search(r'label = f"(compiling [^"]*)"', source)
    assert label is not None and not re.search(r"\d+ ?s\b|~", label.group(1)), label.group(1)


def _tokens(text: str) -> list[str]:
    for ch in "│┃╭╮╰╯─━┏┓┗┛┡┩╇┳┻╋┼├┤┬┴┌┐└┘═║":
        text = text.replace(ch, " ")
    return text.split()


def _pieces(word: str) -> set[str]:
    """Every run of whole parts of a name (what a line may carry of it)."""
    parts = name_parts(word)
    runs = {"".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)}
    return runs | {r.removeprefix("…/") for r in runs}


WIDE_INPUTS = [
    ("analyze", SAMPLES / "training_snapshot.pickle"),  # autograd NativeLayerNormBackward0 sites
    ("analyze", SAMPLES / "training_loop.sqlite"),
    ("whatif", SAMPLES / "inference_expandable_snapshot.pickle"),  # two-option policy names
    ("analyze", REAL_SNAPSHOTS / "Constructor-Sun+code_location__memory_snapshot.pickle"),
    ("whatif", REAL_SNAPSHOTS / "Constructor-Sun+code_location__memory_snapshot.pickle"),
]


@pytest.mark.parametrize(("command", "path"), WIDE_INPUTS, ids=lambda x: getattr(x, "name", x))
def test_at_80_columns_no_word_is_split_mid_word(command: str, path: Path) -> None:
    """Every word of the 80-column report is a word of the same report 2,000 columns wide, or
    whole parts of one (a name breaks after '/', '_', '-', ',', ':' or between CamelCase parts,
    never inside its letters); a site shortened from the left ('…/') aside."""
    if not path.exists():
        pytest.skip(f"{path.name} absent")
    allowed: set[str] = set()
    for word in set(_tokens(nsysfrag(command, str(path), columns=2000).stdout)):
        allowed |= _pieces(word)
    narrow = _tokens(nsysfrag(command, str(path), columns=80).stdout)
    split = [w for w in narrow if w not in allowed and not w.startswith("…")
             and not re.fullmatch(r"[\W\d]*", w)]  # fmt: skip
    assert split == [], split[:10]


def test_a_snapshot_without_a_trace_gets_no_empty_time_plot(tmp_path: Path) -> None:
    path = SAMPLES / "inference_snapshot.pickle"
    state_only = tmp_path / "state_only.pickle"
    import pickle

    data = pickle.loads(path.read_bytes())
    data["device_traces"] = [[]]
    state_only.write_bytes(pickle.dumps(data, protocol=4))
    runner = CliRunner()
    pngs, page = tmp_path / "png", tmp_path / "r.html"
    result = runner.invoke(cli, ["analyze", str(state_only), "--png", str(pngs), "--html", str(page), "-q"])
    assert result.exit_code == 0, result.output
    drawn = {p.stem.split("_", 2)[2] for p in pngs.glob("*.png")}
    assert drawn == set(figure_builders) - TIME_FIGURES
    text = page.read_text()
    assert "No figures over time" in text
    assert not any(f'data-figure="{name}"' in text for name in TIME_FIGURES)
    # a traced snapshot keeps every figure
    traced = tmp_path / "traced"
    assert runner.invoke(cli, ["analyze", str(path), "--png", str(traced), "-q"]).exit_code == 0
    assert {p.stem.split("_", 2)[2] for p in traced.glob("*.png")} == set(figure_builders)
    assert json.loads(runner.invoke(cli, ["analyze", str(state_only), "--json", "-"]).stdout)

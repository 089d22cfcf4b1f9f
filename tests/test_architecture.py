"""What docs/ARCHITECTURE.md claims of the layout: a new input is one module (the toy RMM-log
reader is built from the very code the document shows, registered, and run through every
report), and `analyze` loads only what it uses."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from nsysfrag import inputs, reporters
from nsysfrag.analysis import Analysis, analyze
from nsysfrag.cli import cli
from nsysfrag.commands import report_options
from nsysfrag.inputs import open_input
from nsysfrag.pipeline import request as report_request
from nsysfrag.pipeline import single
from nsysfrag.reporters import Reporter
from tests.conftest import REPO

DOC = REPO / "docs" / "ARCHITECTURE.md"
BASE = 0x7F00_0000_0000


def _toy_source() -> str:
    """The code block of the document's section on adding an input."""
    section = DOC.read_text(encoding="utf-8").split("## Adding an input", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert block is not None, "docs/ARCHITECTURE.md shows no reader"
    return block.group(1)


@pytest.fixture
def rmm_log(tmp_path: Path) -> Iterator[types.ModuleType]:
    """The document's module, written to a file, imported and registered as an input."""
    source = tmp_path / "rmm_log.py"
    source.write_text(_toy_source(), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("rmm_log_from_the_docs", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    try:
        spec.loader.exec_module(module)
        inputs.register(module.RMM_LOG)
        yield module
    finally:
        inputs.unregister("rmm-log")
        del sys.modules[spec.name]


def _log(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def _holes_log(tmp_path: Path) -> Path:
    # A|B|C packed, then B freed between them: one hole of 2 MiB, out of order.
    mib = 1 << 20
    return _log(
        tmp_path / "run.csv",
        [
            f"alloc,{BASE:#x},{mib},1000",
            f"alloc,{BASE + mib:#x},{2 * mib},2000",
            f"alloc,{BASE + 3 * mib:#x},{mib},3000",
            f"free,{BASE + mib:#x},{2 * mib},4000",
        ],
    )


def test_the_documented_reader_is_one_module_of_the_input_registry(
    rmm_log: types.ModuleType,
) -> None:
    assert inputs.format_of(Path("x.csv")) is rmm_log.RMM_LOG
    assert inputs.format_of(Path("x.sqlite")).name == "nsys-export"
    assert len(_toy_source().splitlines()) < 100


def test_every_report_of_a_log(rmm_log: types.ModuleType, tmp_path: Path) -> None:
    log = _holes_log(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(
        cli,
        ["analyze", str(log), "--capacity", "64MiB", "--json", str(out / "a.json"),
         "--csv", str(out / "a.csv"), "--html", str(out / "a.html"), "--png", str(out / "png"),
         "--fail-on", "hole_creating_frees>0"],
    )  # fmt: skip
    assert result.exit_code == 1  # the gate read the document and tripped
    doc = json.loads((out / "a.json").read_text())
    assert doc["trace"]["path"] == str(log) and doc["model"]["name"] == "observed"
    (space,) = doc["spaces"]
    assert space["device_name"] == "RMM device" and space["capacity_bytes"] == 64 << 20
    assert space["counts"]["allocations"] == 3 and space["counts"]["frees"] == 1
    assert space["out_of_order_frees"] == 1 and space["hole_creating_frees"] == 1
    assert space["final"]["free_blocks"] == 2 and space["final"]["live_bytes"] == 2 << 20
    assert space["hotspots"][0]["hole_bytes"] == 2 << 20
    assert len((out / "a.csv").read_text().splitlines()) == 1 + 4
    assert "RMM allocation log" in (out / "a.html").read_text()
    assert len(list((out / "png").glob("*.png"))) == 6
    # The terminal report speaks the input's words.
    assert "RMM allocation log" in result.output and "model: observed" in result.output


def test_the_log_input_says_what_it_needs(rmm_log: types.ModuleType, tmp_path: Path) -> None:
    log = _holes_log(tmp_path)
    result = CliRunner().invoke(cli, ["analyze", str(log)])
    assert result.exit_code == 2
    assert "pass --capacity BYTES" in result.output
    bad = _log(tmp_path / "bad.csv", ["alloc,0x10,100,1", "realloc,0x10,200,2"])
    result = CliRunner().invoke(cli, ["analyze", str(bad), "--capacity", "1MiB"])
    assert result.exit_code == 2 and f"{bad}:2: not alloc|free" in result.output


@pytest.mark.parametrize("sample", ["inference_serving.sqlite", "training_snapshot.pickle"])
def test_analyze_loads_only_what_it_uses(sample: str, tmp_path: Path) -> None:
    # GIVEN `nsysfrag analyze` of an export or a snapshot, with JSON and CSV reports that
    # replace older ones
    # THEN neither the what-if models, the history store, SQLAlchemy (it reads no export and
    # costs a start a tenth of a second) nor the nsys runner were imported
    (tmp_path / "a.json").write_text('{"schema": "nsysfrag/1", "spaces": []}\n')
    (tmp_path / "a.csv").write_text("device,pid,time_s,live_bytes\n")
    code = (
        "import sys\n"
        "from nsysfrag.cli import main\n"
        f"args = ['analyze', {str(REPO / 'sample_traces' / sample)!r}, '-q',"
        f" '--json', {str(tmp_path / 'a.json')!r}, '--csv', {str(tmp_path / 'a.csv')!r}]\n"
        "try:\n"
        "    main(args)\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0, done.code\n"
        "loaded = [m for m in sys.modules if m.startswith(('nsysfrag.whatif', 'nsysfrag.allocators',"
        " 'nsysfrag.history', 'sqlalchemy', 'nsysfrag.inputs.nsys.runner'))]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    assert json.loads((tmp_path / "a.json").read_text())["spaces"]


def one_line(analysis: Analysis) -> str:
    """A toy report format: one line per space."""
    return "".join(f"{s.device}: {s.health.label}\n" for s in analysis.spaces)


def test_a_report_format_is_one_registry_entry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # GIVEN one more Reporter in the registry WHEN a command takes the report options THEN it
    # has --txt, -o picks the format by its suffix, and the report is written
    toy = Reporter("txt", "Write one line per space.", suffixes=(".txt",),
                   render="tests.test_architecture:one_line")  # fmt: skip
    monkeypatch.setattr(reporters, "REPORTERS", (*reporters.REPORTERS, toy))
    monkeypatch.setattr(report_options, "REPORTERS", reporters.REPORTERS)
    monkeypatch.setattr(report_request, "REPORTERS", reporters.REPORTERS)

    @click.command()
    @click.argument("source", type=click.Path(path_type=Path))
    @report_options.report_options
    def command(source: Path, **options: object) -> None:
        request = report_request.ReportRequest.from_options(options)
        single.emit_reports(single.analyze_input(source, request), request, source)

    sample = REPO / "sample_traces" / "multi_gpu.sqlite"
    result = CliRunner().invoke(command, ["--help"])
    assert "--txt" in result.output and ".txt" in result.output
    for option in (["--txt", str(tmp_path / "a.txt")], ["-o", str(tmp_path / "b.txt")]):
        result = CliRunner().invoke(command, [str(sample), "-q", *option])
        assert result.exit_code == 0, result.output
    expected = one_line(analyze(open_input(sample)))
    assert expected.count("\n") == 3  # three spaces
    assert (tmp_path / "a.txt").read_text() == (tmp_path / "b.txt").read_text() == expected


def test_the_project_points_to_nothing_outside_it() -> None:
    # GIVEN the code, README and docs a user reads (reports quote the code's words)
    texts = [*sorted((REPO / "nsysfrag").rglob("*.py")), REPO / "README.md",
             *sorted((REPO / "docs").rglob("*.md")), REPO / "mkdocs.yml"]  # fmt: skip
    # THEN none names a document outside the repository or its sections
    outside = re.compile(r"\.\./shared|SPEC\b|SPEC\.md|ALLOCATORS\.md|§")
    found = [f"{p.relative_to(REPO)}:{n}" for p in texts
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if outside.search(line)]  # fmt: skip
    assert not found, found

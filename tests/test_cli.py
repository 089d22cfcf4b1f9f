"""The command line: report, JSON contract, CSV, exit codes and every bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from nsysfrag.cli import cli
from nsysfrag.testing.nsys_export import FREE, Gpu, MemoryRow
from tests.conftest import BASE, REAL_TRACES, SAMPLES, MakeTrace, MiB

SAMPLE = SAMPLES / "training_loop.sqlite"
SPACE_KEYS = {
    "pid", "device", "capacity_bytes", "base_address", "span_mode", "counts", "alloc_failure_rate",
    "peak", "max", "final", "internal_frag", "growth_per_s", "health", "out_of_order_frees",
    "hole_creating_frees", "hotspots", "size_histogram", "free_block_histogram", "timeline",
}
STATE_KEYS = {"time_ns", "global_frag", "local_frag", "free_blocks", "largest_free_bytes", "free_bytes", "live_bytes",
              "reserved_bytes", "allocated_bytes", "active_bytes", "stranded_bytes", "releasable_bytes", "device_free_bytes",
              "largest_block_bytes"}
COUNT_KEYS = {"allocations", "frees", "unmatched_frees", "overlaps", "zero_size_allocs", "failed_allocations", "other_kind_events"}


def run(*args: str) -> tuple[int, str, str]:
    """Run the real entry point in-process, as the console script does."""
    proc = subprocess.run(
        [sys.executable, "-m", "nsysfrag", *args],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "120"},
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_terminal_report_on_a_sample() -> None:
    result = CliRunner().invoke(cli, ["analyze", str(SAMPLE)], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "observed device pages" in out
    for word in ("health", "peak", "final", "global frag", "largest free", "hotspots", "Allocation sizes"):
        assert word in out


def test_json_contract(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    result = CliRunner().invoke(cli, ["analyze", str(SAMPLE), "--json", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert result.output == ""
    doc = json.loads(out.read_text())
    assert doc["schema"] == "nsysfrag/1"
    assert doc["trace"]["path"] == str(SAMPLE) and doc["trace"]["nsys_version"]
    assert doc["model"]["granularity_bytes"] == 512 and doc["model"]["page_bytes"] == 2 << 20
    assert doc["spaces"]
    keys = [(s["pid"], s["device"]) for s in doc["spaces"]]
    assert keys == sorted(keys)
    for s in doc["spaces"]:
        assert SPACE_KEYS <= set(s)
        assert set(s["counts"]) == COUNT_KEYS
        assert set(s["peak"]) == STATE_KEYS == set(s["final"]) == set(s["memory_peak"])
        assert set(s["max"]) == {"global_frag", "local_frag", "free_blocks", "live_bytes"}
        assert s["health"] in {"ok", "warn", "critical"}
        for h in s["hotspots"]:
            assert set(h) == {"site", "size_class", "size_lo_bytes", "out_of_order_frees", "hole_creating_frees", "hole_bytes", "pinned_by"}
        for hist in (s["size_histogram"], s["free_block_histogram"]):
            los = [b["lo_bytes"] for b in hist]
            assert los == sorted(los) and all(b["count"] > 0 for b in hist)
            assert all(b["hi_bytes"] == 2 * b["lo_bytes"] for b in hist)
        tl = s["timeline"]
        assert 0 < len(tl["time_ns"]) <= 2000
        assert s["peak"]["time_ns"] in tl["time_ns"]
        assert tl["time_ns"][-1] == s["final"]["time_ns"]
        assert len({len(v) for v in tl.values()}) == 1
        for ratio in ("global_frag", "local_frag"):
            assert 0 <= s["peak"][ratio] <= 1


def test_json_to_stdout_replaces_the_report() -> None:
    result = CliRunner().invoke(cli, ["analyze", str(SAMPLE), "--json", "-"])
    assert result.exit_code == 0
    assert json.loads(result.output)["schema"] == "nsysfrag/1"


def test_output_suffix_picks_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert CliRunner().invoke(cli, ["analyze", str(SAMPLE), "-o", str(out), "-q"]).exit_code == 0
    assert json.loads(out.read_text())["schema"] == "nsysfrag/1"


def test_csv_has_one_row_per_event(tmp_path: Path, make_trace: MakeTrace) -> None:
    rows = [MemoryRow(i, 1, 0, BASE + i * MiB, MiB) for i in range(5)] + [MemoryRow(9, 1, 0, BASE, 0, op=FREE)]
    out = tmp_path / "t.csv"
    assert CliRunner().invoke(cli, ["analyze", str(make_trace(rows)), "--csv", str(out), "-q"]).exit_code == 0
    lines = out.read_text().splitlines()
    assert lines[0].startswith("pid,device,event_index,time_ns,event,address,bytes,global_frag")
    assert len(lines) == 1 + 6
    assert lines[-1].split(",")[4] == "free"


def test_capacity_option_accepts_units(make_trace: MakeTrace) -> None:
    path = make_trace([MemoryRow(1, 1, 0, BASE, MiB)], gpus=[])
    result = CliRunner().invoke(cli, ["analyze", str(path), "--capacity", "8MiB", "--json", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["spaces"][0]["capacity_bytes"] == 8 * MiB


def _bad(path: Path, *extra: str) -> str:
    code, out, err = run("analyze", str(path), *extra)
    assert code == 2, (out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_missing_path(tmp_path: Path) -> None:
    assert "no such file" in _bad(tmp_path / "nope.sqlite")


def test_directory(tmp_path: Path) -> None:
    assert "directory" in _bad(tmp_path)


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.sqlite"
    p.write_bytes(b"")
    assert "empty" in _bad(p)


def test_not_sqlite(tmp_path: Path) -> None:
    p = tmp_path / "x.sqlite"
    p.write_text("hello, world\n")
    assert "not an SQLite database" in _bad(p)


def test_nsys_rep_without_nsys_says_how_to_export(tmp_path: Path) -> None:
    p = tmp_path / "run.nsys-rep"
    p.write_bytes(b"\x00binary report")
    code, out, err = run("analyze", str(p), "--nsys", str(tmp_path / "no-nsys-here"))
    assert code == 3 and out == "" and len(err.strip().splitlines()) == 1
    assert "nsys export --type sqlite" in err


def test_truncated_database(tmp_path: Path) -> None:
    p = tmp_path / "cut.sqlite"
    data = SAMPLE.read_bytes()
    p.write_bytes(data[: len(data) // 3])
    assert "corrupt or truncated" in _bad(p)


def test_corrupt_pages(tmp_path: Path) -> None:
    p = tmp_path / "bad.sqlite"
    data = bytearray(SAMPLE.read_bytes())
    data[4096:8192] = b"\xff" * 4096
    p.write_bytes(bytes(data))
    assert "corrupt or truncated" in _bad(p)


@pytest.mark.skipif(not REAL_TRACES.is_dir(), reason="../shared/real_traces is absent")
def test_real_trace_without_memory_events() -> None:
    line = _bad(REAL_TRACES / "v2025.1.3_aws.sqlite")
    assert "--cuda-memory-usage=true" in line and "3 allocation API call(s)" in line


def test_device_without_gpu_row_asks_for_capacity(make_trace: MakeTrace) -> None:
    path = make_trace([MemoryRow(1, 1, 5, BASE, MiB)], gpus=[Gpu(0)])
    assert "--capacity" in _bad(path)


def test_bad_option_values(make_trace: MakeTrace) -> None:
    path = make_trace([MemoryRow(1, 1, 0, BASE, MiB)])
    code, _, err = run("analyze", str(path), "--capacity", "lots")
    assert code == 2 and "not a size" in err and "Traceback" not in err
    code, _, err = run("analyze", str(path), "-o", "x.txt")
    assert code == 2 and "format" in err


def test_refuses_to_overwrite_the_input(tmp_path: Path) -> None:
    p = tmp_path / "t.sqlite"
    shutil.copy(SAMPLE, p)
    assert "overwrite the input" in _bad(p, "--json", str(p))


def test_input_is_never_modified(tmp_path: Path) -> None:
    p = tmp_path / "t.sqlite"
    shutil.copy(SAMPLE, p)
    before = (p.stat().st_mtime_ns, p.read_bytes())
    code, _, err = run("analyze", str(p), "--json", str(tmp_path / "o.json"), "--csv", str(tmp_path / "o.csv"))
    assert code == 0, err
    assert (p.stat().st_mtime_ns, p.read_bytes()) == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["o.csv", "o.json", "t.sqlite"]


def test_read_only_input_works(tmp_path: Path) -> None:
    p = tmp_path / "t.sqlite"
    shutil.copy(SAMPLE, p)
    p.chmod(0o444)
    code, _, err = run("analyze", str(p), "-q")
    assert code == 0, err


def test_every_command_has_help_with_an_example() -> None:
    for name in cli.list_commands(click.Context(cli)):
        result = CliRunner().invoke(cli, [name, "--help"])
        assert result.exit_code == 0
        assert "Examples:" in result.output, name


def test_the_command_list_in_help_is_each_commands_own_summary_and_imports_none() -> None:
    """`nsysfrag --help` lists the commands from cli.SUMMARIES, not from the commands
    themselves (importing all six is 600 modules): the listing must be what click makes of
    each command's own help, at every width, and the process must import no command."""
    import importlib

    from nsysfrag import cli as cli_module

    assert sorted(cli_module.SUMMARIES) == sorted(cli_module.COMMANDS)
    for name, target in cli_module.COMMANDS.items():
        module, attribute = target.split(":")
        command = getattr(importlib.import_module(module), attribute)
        for limit in (30, 45, 70, 200):
            assert command.get_short_help_str(limit) == click.utils.make_default_short_help(
                cli_module.SUMMARIES[name], limit
            ), name

    class Imported(click.Group):  # the listing as click's Group makes it, each command imported
        def list_commands(self, ctx: click.Context) -> list[str]:
            return cli.list_commands(ctx)

        def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
            return cli.get_command(ctx, name)

    for width in (60, 80, 120):
        ours, theirs = click.HelpFormatter(width=width), click.HelpFormatter(width=width)
        ctx = click.Context(cli)
        cli.format_commands(ctx, ours)
        Imported(name="nsysfrag").format_commands(ctx, theirs)
        assert ours.getvalue() == theirs.getvalue()
    probe = (
        "import sys\nfrom nsysfrag.cli import main\ntry:\n    main(['--help'])\n"
        "except SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('nsysfrag.commands.')))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    assert "Commands:" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"

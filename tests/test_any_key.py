"""Gates and trends on any number: ``--fail-on`` and ``history --trend``/``--check`` take every
numeric key of a space of the analyze JSON (a dotted path, a list's ``.count``), and an unknown
key is one line naming the nearest keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from nsysfrag.checks.gates import evaluate, parse_gate
from nsysfrag.checks.keys import KNOWN, numeric_keys, resolve
from nsysfrag.cli import cli
from nsysfrag.errors import InputError
from nsysfrag.history import RunRecord, open_store
from nsysfrag.history.trends import resolve_metric, series
from tests.conftest import REAL_SNAPSHOTS, SAMPLES

# An nsys export, a snapshot with an OOM, one with OOM retries and pending frees, and a genuine
# snapshot (three devices, expandable segments, an OOM) where it is beside us.
INPUTS = [SAMPLES / "training_loop.sqlite", SAMPLES / "pressure_gc_snapshot.pickle",
          SAMPLES / "training_snapshot.pickle",
          REAL_SNAPSHOTS / "Constructor-Sun+code_location__memory_snapshot.pickle"]  # fmt: skip


def analysis_json(path: Path, *extra: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["analyze", str(path), "--json", "-", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module", params=INPUTS, ids=lambda p: p.name[:40])
def document(request: pytest.FixtureRequest) -> tuple[Path, dict[str, Any]]:
    path: Path = request.param
    if not path.exists():
        pytest.skip(f"{path.name} absent")
    return path, analysis_json(path)


def test_every_numeric_key_of_a_space_gates(document: tuple[Path, dict[str, Any]]) -> None:
    _, doc = document
    for space in doc["spaces"]:
        keys = numeric_keys(space)
        assert len(keys) > 40 and "ooms.count" in keys and "peak.global_frag" in keys
        for key, value in keys.items():
            assert key in KNOWN, key  # a gate on it parses before any analysis
            at = parse_gate(f"{key}>={value!r}")
            above = parse_gate(f"{key}>{value!r}")
            where = (space["pid"], space["device"])
            tripped = {(t.pid, t.device) for t in evaluate([at], doc)}
            assert where in tripped, key
            assert where not in {(t.pid, t.device) for t in evaluate([above], doc)}, key


def test_every_numeric_key_of_a_space_trends(
    document: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    path, doc = document
    with open_store(str(tmp_path / "h.sqlite")) as store:
        store.record(RunRecord.from_document(doc, path))
        runs = store.runs()
    for space in doc["spaces"]:
        for key, value in numeric_keys(space).items():
            if key in ("pid", "device"):
                continue
            metric = resolve_metric(key)
            values = [v for s in series(runs, metric) for v in s.values if v is not None]
            assert float(value) in values, key


def test_the_issues_keys_work_on_the_command_line(tmp_path: Path) -> None:
    path = SAMPLES / "pressure_gc_snapshot.pickle"
    doc = analysis_json(path)
    (space,) = doc["spaces"]
    runner = CliRunner()
    gates = ["peak.reserved_bytes>1MiB", "reserved_bytes_peak>1MiB", "peak.stranded_bytes>=0",
             "final.stranded_bytes>=0", "ooms.count>0", "counts.overlaps>=0"]  # fmt: skip
    result = runner.invoke(cli, ["analyze", str(path), "-q", *(f"--fail-on={g}" for g in gates)])
    assert result.exit_code == 1, result.output
    tripped = [line for line in result.stderr.splitlines() if "gate tripped" in line]
    assert len(tripped) == len(gates), result.stderr
    assert f"ooms.count = {len(space['ooms'])}" in result.stderr
    db = tmp_path / "h.sqlite"
    for _ in range(2):
        assert runner.invoke(cli, ["analyze", str(path), "-q", "--record", "--db", str(db)]).exit_code == 0
    trend = runner.invoke(cli, ["history", "--db", str(db), "--trend", "peak.reserved_bytes"])
    assert trend.exit_code == 0, trend.output
    assert "peak.reserved_bytes over 1 run(s)" in " ".join(trend.stdout.split())
    check = runner.invoke(cli, ["history", "--db", str(db), "--check", "--metric", "ooms.count"])
    assert check.exit_code == 0, check.output


@pytest.mark.parametrize(
    ("typed", "nearest"),
    [("peak.reserved_byte", "peak.reserved_bytes"), ("reserved_peak", "reserved_bytes_peak"),
     ("final.stranded", "final.stranded_bytes"), ("oom.count", "ooms.count")],
)  # fmt: skip
def test_an_unknown_key_is_one_line_naming_the_nearest(typed: str, nearest: str) -> None:
    with pytest.raises(InputError, match=nearest.replace(".", r"\.")):
        resolve(typed)
    runner = CliRunner()
    gate = runner.invoke(cli, ["analyze", str(SAMPLES / "training_loop.sqlite"), f"--fail-on={typed}>1"])
    assert gate.exit_code == 2 and len(gate.output.strip().splitlines()) == 1
    assert nearest in gate.output
    trend = runner.invoke(cli, ["history", "--trend", typed])
    assert trend.exit_code == 2 and len(trend.output.strip().splitlines()) == 1
    assert nearest in trend.output


def test_help_lists_the_keys() -> None:
    text = CliRunner().invoke(cli, ["analyze", "--help"], env={"COLUMNS": "200"}).output
    flat = " ".join(text.split())
    for key in ("reserved_bytes_peak", "ooms.count", "counts.overlaps", "memory_peak"):
        assert key in flat, key

"""--fail-on gates, --baseline / compare and their exit codes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from nsysfrag.checks.gates import Trip, evaluate, parse_gate
from nsysfrag.cli import cli
from nsysfrag.errors import InputError
from tests.conftest import SAMPLES

INFERENCE = SAMPLES / "inference_serving.sqlite"
TRAINING = SAMPLES / "training_loop.sqlite"

SPACE = {
    "pid": 7,
    "device": 0,
    "health": "warn",
    "alloc_failure_rate": 0.0,
    "internal_frag": 0.1,
    "counts": {"overlaps": 2, "failed_allocations": 0},
    "max": {"global_frag": 0.3, "local_frag": 0.6, "free_blocks": 500, "live_bytes": 10},
    "peak": {"global_frag": 0.25, "largest_free_bytes": 1 << 30, "free_blocks": 400},
    "final": {"global_frag": 0.1},
}
DOC = {"schema": "nsysfrag/1", "spaces": [SPACE]}


@pytest.mark.parametrize(
    ("expr", "trips"),
    [
        ("global_frag>0.3", False),  # bare names mean the maximum over the trace
        ("global_frag>=0.3", True),
        ("global_frag<0.31", True),
        ("global_frag<=0.29", False),
        ("global_frag==0.3", True),
        ("global_frag=0.3", True),
        ("global_frag!=0.3", False),
        ("peak.global_frag>0.2", True),
        ("final.global_frag > 10%", False),
        ("local_frag>=60%", True),
        ("free_blocks>500", False),
        ("free_blocks>=500", True),
        ("alloc_failure_rate>0", False),
        ("overlaps>0", True),
        ("counts.overlaps>1", True),
        ("peak.largest_free_bytes<2GiB", True),
        ("peak.largest_free_bytes<1GiB", False),
        ("health=critical", False),
        ("health>=warn", True),
        ("health=warn", True),
        ("health!=ok", True),
    ],
)
def test_each_operator(expr: str, trips: bool) -> None:
    assert bool(evaluate([parse_gate(expr)], DOC)) is trips


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("global_frag", "not a gate"),
        ("global_frag>>0.3", "not a number"),
        ("bogus>1", "not a numeric metric"),
        ("health=terrible", "ok, warn, critical"),
        ("free_blocks>5 blocks", "unknown unit"),
        ("free_blocks>five", "not a number"),
        ("live_bytes>5parsecs", "unknown unit"),
    ],
)
def test_malformed_gates_say_why(expr: str, why: str) -> None:
    with pytest.raises(InputError, match=why):
        parse_gate(expr)


@pytest.mark.parametrize(
    ("expr", "value", "said"),
    [
        # main: "local_frag = 0.671417 >= 0.6" for a gate written as 60 %
        ("local_frag>=60%", 0.671417, "local_frag = 67.1 % ≥ 60 %"),
        ("local_frag>=60.5%", 0.671417, "local_frag = 67.14 % ≥ 60.5 %"),
        ("local_frag>0.6", 0.671417, "local_frag = 0.671 > 0.6"),
        ("global_frag>30%", 0.3000001, "global_frag = 30.00001 % > 30 %"),  # never "30.0 % > 30 %"
        # main: "health = critical = critical"
        ("health=critical", "critical", "health = critical (--fail-on 'health=critical')"),
        ("health>=warn", "critical", "health = critical ≥ warn"),
        # main: "reserved_bytes_peak = 84202749952 > 7.51619e+10"
        ("reserved_bytes_peak>70GiB", 84202749952, "reserved_bytes_peak = 78.42 GiB > 70 GiB"),
        ("reserved_bytes_peak>75161927680", 84202749952, "reserved_bytes_peak = 84202749952 > 75161927680"),
        ("peak.largest_free_bytes<2GB", 1_500_000_000, "peak.largest_free_bytes = 1.50 GB < 2 GB"),
        ("free_blocks>=500", 612, "free_blocks = 612 ≥ 500"),
    ],
)
def test_a_tripped_gate_is_said_as_written(expr: str, value: object, said: str) -> None:
    gate = parse_gate(expr)
    message = Trip(gate, 7, 0, value).message()
    assert f"pid 7 device 0: {said}" in message
    assert message.endswith(f"(--fail-on {expr!r})")


def test_several_gates_all_reported(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        ["analyze", str(INFERENCE), "-q", "--fail-on", "health=critical", "--fail-on", "global_frag>0.99",
         "--fail-on", "local_frag>0.5"],
    )
    assert result.exit_code == 1
    tripped = [line for line in result.output.splitlines() if "gate tripped" in line]
    assert len(tripped) == 2
    assert "pid 3310 device 0: health = critical" in tripped[0]
    assert "local_frag" in tripped[1] and "> 0.5" in tripped[1]


def test_gate_that_holds_exits_zero() -> None:
    result = CliRunner().invoke(cli, ["analyze", str(TRAINING), "-q", "--fail-on", "health=critical"])
    assert result.exit_code == 0 and result.output == ""


def test_malformed_gate_exits_2_before_analysis(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    result = CliRunner().invoke(cli, ["analyze", str(TRAINING), "--json", str(out), "--fail-on", "oops"])
    assert result.exit_code == 2
    assert not out.exists()


def _json(tmp_path: Path, trace: Path, name: str) -> Path:
    out = tmp_path / name
    assert CliRunner().invoke(cli, ["analyze", str(trace), "-q", "--json", str(out)]).exit_code == 0
    return out


def test_compare_side_by_side_and_regression_gate(tmp_path: Path) -> None:
    base, current = _json(tmp_path, TRAINING, "base.json"), _json(tmp_path, INFERENCE, "cur.json")
    runner = CliRunner()
    result = runner.invoke(cli, ["compare", str(base), str(current)], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "max local frag" in result.output and "ok → critical" in result.output
    # Local fragmentation grew from ~14 % to ~93 %: a regression beyond 5 points.
    result = runner.invoke(cli, ["compare", str(base), str(current), "--fail-on-regression", "0.05"])
    assert result.exit_code == 1
    assert "regression: pid 3310 device 0: max local frag grew by" in result.output
    # The other way round local fragmentation fell and global grew by 7.5 points: a 10-point
    # threshold lets it pass.
    result = runner.invoke(cli, ["compare", str(current), str(base), "--fail-on-regression", "0.1"])
    assert result.exit_code == 0, result.output


def test_a_local_frag_maximum_the_health_does_not_count_is_no_regression(tmp_path: Path) -> None:
    # main: "max local frag grew by 0.9756" from a maximum that came while nothing was free
    base = _json(tmp_path, TRAINING, "base.json")
    doc = json.loads(base.read_text())
    space = doc["spaces"][0]
    counted = space["max"]["local_frag"]
    space["max"]["local_frag"] = 0.99
    space["unrated_maxima"] = [{"metric": "local_frag", "value": 0.99, "time_ns": 1,
                                "free_share": 0.01, "rated_value": counted}]  # fmt: skip
    unrated = tmp_path / "unrated.json"
    unrated.write_text(json.dumps(doc))
    runner = CliRunner()
    result = runner.invoke(cli, ["compare", str(base), str(unrated), "--fail-on-regression", "0.05"])
    assert result.exit_code == 0, result.output
    assert "regression:" not in result.output
    # The maximum it does count grew: that is a regression, said as such.
    space["unrated_maxima"][0]["rated_value"] = counted + 0.2
    unrated.write_text(json.dumps(doc))
    result = runner.invoke(cli, ["compare", str(base), str(unrated), "--fail-on-regression", "0.05"])
    assert result.exit_code == 1, result.output
    line = next(x for x in result.output.splitlines() if "regression:" in x)
    assert "max local frag (the maxima the health rates) grew by 0.2000" in line
    assert f"to {counted + 0.2:.4f}" in line


def test_compare_pairs_spaces_by_device_when_pids_differ(tmp_path: Path) -> None:
    base = _json(tmp_path, SAMPLES / "multi_gpu.sqlite", "a.json")
    doc = json.loads(base.read_text())
    for space in doc["spaces"]:
        space["pid"] += 1000
        space["max"]["global_frag"] += 0.5
    current = tmp_path / "b.json"
    current.write_text(json.dumps(doc))
    result = CliRunner().invoke(cli, ["compare", str(base), str(current), "--fail-on-regression", "0.1"])
    assert result.exit_code == 1
    assert result.output.count("regression:") == 3
    assert "only in" not in result.output


def test_analyze_with_baseline(tmp_path: Path) -> None:
    base = _json(tmp_path, TRAINING, "base.json")
    runner = CliRunner()
    result = runner.invoke(cli, ["analyze", str(INFERENCE), "--baseline", str(base), "--fail-on-regression", "0.05"],
                           env={"COLUMNS": "120"})
    assert result.exit_code == 1
    assert "this run" in result.output and "regression:" in result.output
    same = runner.invoke(cli, ["analyze", str(TRAINING), "--baseline", str(base), "--fail-on-regression", "0"])
    assert same.exit_code == 0


@pytest.mark.parametrize("content", ["", "not json", '{"schema": "other"}', "[1, 2]"])
def test_compare_rejects_non_analysis_files(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    good = _json(tmp_path, TRAINING, "good.json")
    result = CliRunner().invoke(cli, ["compare", str(good), str(bad)])
    assert result.exit_code == 2


def test_regression_without_baseline_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["analyze", str(TRAINING), "--fail-on-regression", "0.1"])
    assert result.exit_code == 2


def test_compare_leads_with_the_oom_gone_and_marks_figures_of_another_capacity(tmp_path: Path) -> None:
    # main: the verdict never said the OOM was gone, and "device free −161 MiB" compared
    # capacities from different evidence (1.16 GiB from the OOM, 1.02 GiB from the retries).
    base = _json(tmp_path, SAMPLES / "torch_fragmentation_snapshot.pickle", "frag.json")
    current = _json(tmp_path, SAMPLES / "torch_expandable_snapshot.pickle", "exp.json")
    for width in ("80", "200"):
        out = CliRunner().invoke(cli, ["compare", str(base), str(current)], env={"COLUMNS": width}).stdout
        said = " ".join(out.split())
        assert said.split(" (exp.json) ", 1)[1].startswith(
            "The out-of-memory errors are gone (1 failed allocation → none);"
        ), said[:300]
        assert ("the device memory differs (1.16 GiB from the recorded OOM → 1.02 GiB from the"
                " allocator's OOM retries), so the figures marked ‡ compare different capacities") in said
        assert re.search(r"device free ‡\s+│?\s*161\.12 MiB", out), out
        assert "‡ the device memory enters this figure" in said
        assert not re.search(r"reserved ‡|allocated ‡", out)  # the figures C does not enter
    # the other way round the OOM appears
    back = CliRunner().invoke(cli, ["compare", str(current), str(base)], env={"COLUMNS": "200"}).stdout
    assert "Out-of-memory errors appear (none → 1 failed allocation)" in back
    # the same run twice: nothing marked, nothing said of capacity
    same = CliRunner().invoke(cli, ["compare", str(base), str(base)], env={"COLUMNS": "200"}).stdout
    assert "‡" not in same and "out-of-memory" not in same.lower()

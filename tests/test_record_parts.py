"""The parts of ``nsysfrag record`` that run in nsysfrag's process, each on its own: the device
facts beside a snapshot (input like any other), the record folder's layout, the rating of a
state and the alerts, the recorder's options."""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from pathlib import Path

import pytest

from nsysfrag.analysis.metrics import Health
from nsysfrag.errors import InputError
from nsysfrag.inputs import InputOptions
from nsysfrag.inputs.torch_snapshot import open_snapshot
from nsysfrag.record.alerts import Alert, Levels, send
from nsysfrag.record.bootstrap.nsysfrag_recorder.names import ENV_OPTIONS, FACTS_SCHEMA
from nsysfrag.record.bootstrap.nsysfrag_recorder.options import Options
from nsysfrag.record.layout import job_inputs, prepare, rank_folders
from nsysfrag.record.rating import Rating, rate_state
from tests.conftest import SAMPLES

GiB = 1 << 30
SAMPLE = SAMPLES / "training_snapshot.pickle"  # 80 GB device, no OOM entry


def snapshot_with_facts(tmp_path: Path, facts: object, raw: bytes | None = None) -> Path:
    path = tmp_path / "final.pickle"
    path.write_bytes(SAMPLE.read_bytes())
    (tmp_path / "final.device.json").write_bytes(raw if raw is not None else json.dumps(facts).encode())
    return path


def facts(total: object = 96 * GiB, **extra: object) -> dict[str, object]:
    return {"schema": FACTS_SCHEMA, "reason": "exit", "rank": 3, "devices": [{"index": 0, "total_memory_bytes": total}], **extra}


def test_recorded_device_size_is_the_capacity_right_after_capacity_option(tmp_path: Path) -> None:
    path = snapshot_with_facts(tmp_path, facts())
    recording = open_snapshot(path, InputOptions())
    run = recording.spaces[0].model.run(recording.spaces[0])
    assert (run.capacity_bytes, run.capacity_source) == (96 * GiB, "device")
    assert not any("capacity" in w for w in recording.warnings + run.warnings)
    override = open_snapshot(path, InputOptions(capacity_bytes=40 * GiB))
    run = override.spaces[0].model.run(override.spaces[0])
    assert (run.capacity_bytes, run.capacity_source) == (40 * GiB, "--capacity")


def test_without_facts_the_snapshot_is_rated_as_before(tmp_path: Path) -> None:
    recording = open_snapshot(SAMPLE, InputOptions())
    run = recording.spaces[0].model.run(recording.spaces[0])
    assert run.capacity_source == "reserved_peak"


@pytest.mark.parametrize(
    ("case", "content"),
    [
        ("not json", b"{\"schema\": "),
        ("another schema", json.dumps({**facts(), "schema": "other/1"}).encode()),
        ("a bool for bytes", json.dumps(facts(total=True)).encode()),
        ("a negative size", json.dumps(facts(total=-1)).encode()),
        ("an exabyte device", json.dumps(facts(total=1 << 62)).encode()),
        ("devices not a list", json.dumps({**facts(), "devices": {"0": 1}}).encode()),
        ("deep nesting", b"[" * 100_000 + b"]" * 100_000),
    ],
)
def test_facts_that_do_not_check_out_are_one_warning_and_ignored(
    tmp_path: Path, case: str, content: bytes
) -> None:
    path = snapshot_with_facts(tmp_path, None, raw=content)
    recording = open_snapshot(path, InputOptions())
    run = recording.spaces[0].model.run(recording.spaces[0])
    assert run.capacity_source == "reserved_peak", case
    (warning,) = [w for w in recording.warnings if "final.device.json" in w]
    assert "the device's size is estimated as for any snapshot" in warning


def test_facts_that_are_not_a_regular_file_are_not_opened(tmp_path: Path) -> None:
    path = tmp_path / "final.pickle"
    path.write_bytes(SAMPLE.read_bytes())
    os.mkfifo(tmp_path / "final.device.json")  # opening it for reading would block
    recording = open_snapshot(path, InputOptions())
    assert any("not a regular file" in w for w in recording.warnings)


def test_a_rank_is_analyzed_from_its_final_else_newest_oom_else_state(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    prepare(out, ("python", "x.py"), {}, overwrite=False)
    for name, files in {
        "rank0": ["final.pickle", "oom-1.pickle", "state-3.pickle"],
        "rank1": ["oom-2.pickle", "oom-10.pickle", "state-4.pickle"],
        "rank2": ["state-2.pickle", "state-11.pickle"],
        "rank3": ["timeline.jsonl"],
        "rank1-pid77": ["final.pickle"],
        "notes": ["final.pickle"],
    }.items():
        (out / name).mkdir()
        for f in files:
            (out / name / f).write_bytes(b"")
    inputs, notes = job_inputs(out)
    assert [(p.relative_to(out).as_posix(), r) for p, r in inputs] == [
        ("rank0/final.pickle", 0), ("rank1/oom-10.pickle", 1), ("rank2/state-11.pickle", 2),
    ]  # fmt: skip
    assert any(n.startswith("rank 1 ran a second CUDA process (rank1-pid77)") for n in notes)
    assert any(n.startswith("rank 3 left no snapshot") for n in notes)
    assert any(n.startswith("rank 2 has no final snapshot") for n in notes)
    assert [r.path.name for r in rank_folders(out)] == ["rank0", "rank1", "rank1-pid77", "rank2", "rank3"]


def test_prepare_refuses_a_file_and_a_record(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError, match="is a file, not a folder"):
        prepare(tmp_path / "f", ("x",), {}, overwrite=False)
    prepare(tmp_path / "rec", ("x",), {}, overwrite=False)
    (tmp_path / "rec" / "rank0").mkdir()
    (tmp_path / "rec" / "mine.txt").write_text("kept")
    prepare(tmp_path / "rec", ("x",), {}, overwrite=False)  # nothing recorded: nothing to keep
    (tmp_path / "rec" / "rank0").mkdir()
    (tmp_path / "rec" / "rank0" / "final.pickle").write_bytes(b"")
    with pytest.raises(InputError, match="already holds a record"):
        prepare(tmp_path / "rec", ("x",), {}, overwrite=False)
    prepare(tmp_path / "rec", ("x",), {}, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "rec").iterdir()) == ["mine.txt", "record.json"]


def state_segments() -> list[object]:
    with open(SAMPLE, "rb") as f:
        return pickle.load(f)["segments"]


def test_a_rating_is_analyze_on_the_same_state(tmp_path: Path) -> None:
    segments = state_segments()
    (rating,) = rate_state(segments, "s", {0: 12 * GiB}, 5)
    path = tmp_path / "state-1.pickle"
    path.write_bytes(pickle.dumps(segments))
    (tmp_path / "state-1.device.json").write_text(json.dumps(facts(total=12 * GiB)))
    from nsysfrag.analysis import analyze

    final = analyze(open_snapshot(path, InputOptions())).spaces[0].final
    assert (rating.global_frag, rating.local_frag, rating.free_blocks) == (
        final.global_frag, final.local_frag, final.free_blocks,
    )  # fmt: skip
    assert rating.capacity_source == "device" and rating.time_unix_ns == 5
    assert rating.pinning_site == "gpt/train.py:71 train_step"


def rating(**figures: object) -> Rating:
    base: dict[str, object] = {
        "device": 0, "time_unix_ns": 0, "global_frag": 0.0, "local_frag": 0.0, "free_blocks": 1,
        "material": True, "reserved_bytes": 0, "allocated_bytes": 0, "stranded_bytes": 0,
        "releasable_bytes": 0, "device_free_bytes": 0, "largest_usable_bytes": 0,
        "capacity_bytes": GiB, "capacity_source": "device", "pinning_site": "train.py:1 f",
        "pinning_bytes": GiB // 2,
    }  # fmt: skip
    return Rating(**{**base, **figures})  # type: ignore[arg-type]


def test_a_level_alerts_when_it_rises_and_again_after_it_fell() -> None:
    levels = Levels()
    seen = [
        levels.crossings("rank0", rating(global_frag=g))
        for g in (0.1, 0.25, 0.3, 0.45, 0.45, 0.1, 0.5)
    ]
    assert seen == [[], [("global_frag", Health.WARN)], [], [("global_frag", Health.CRITICAL)],
                    [], [], [("global_frag", Health.CRITICAL)]]  # fmt: skip


def test_local_frag_and_free_blocks_alert_only_where_material() -> None:
    levels = Levels()
    assert levels.crossings("r", rating(local_frag=0.9, free_blocks=900, material=False)) == []
    assert levels.crossings("r", rating(local_frag=0.9, free_blocks=900)) == [
        ("local_frag", Health.CRITICAL), ("free_blocks", Health.CRITICAL),
    ]  # fmt: skip


def test_the_alert_command_gets_the_alert_as_json_on_stdin(tmp_path: Path) -> None:
    alert = Alert(2, "node7", 4242, 12.5, "global_frag", Health.WARN, rating(global_frag=0.25))
    said: list[str] = []
    got = tmp_path / "got.json"
    send(alert, f"cat > {got}", said.append)
    doc = json.loads(got.read_text())
    assert said == []
    assert (doc["rank"], doc["host"], doc["metric"], doc["level"]) == (2, "node7", "global_frag", "warn")
    assert doc["value"] == 0.25 and doc["pinning_site"] == "train.py:1 f"
    assert doc["message"] == alert.line()
    clock = time.strftime("%H:%M:%S", time.localtime(0))
    assert alert.line() == (
        f"ALERT rank 2 cuda:0 at {clock} (+12.5 s): global_frag 25.0% (warn, ≥ 20%); top"
        " pinning site train.py:1 f (512.00 MiB stranded)"
    )
    send(alert, "echo nope >&2; exit 4", said.append)
    assert said == ["--alert-command exited with code 4: nope"]


def test_the_recorder_takes_any_options_it_is_handed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_OPTIONS, json.dumps({"interval_s": 0.01, "stacks": "bogus", "entries": "x", "state_every": 3}))
    options = Options.from_environment()
    assert options.interval_s == 1.0 and options.stacks == "python"
    assert options.entries == 100_000 and options.state_every == 3
    monkeypatch.setenv(ENV_OPTIONS, "[not json")
    assert Options.from_environment().as_dict() == Options().as_dict()
    assert sys.modules.get("torch") is None or "fake" not in str(sys.modules["torch"])

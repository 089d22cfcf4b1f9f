"""Hostile PyTorch snapshots (issue 16): memo bombs, deep nesting, integers beyond 64 bits.

Each case is built here, from raw pickle opcodes or plain data, and run through the real
command line under the hostile-input contract (30 s, 4 GiB of address space, exit 0 or 2, at
most one line on stderr, no traceback, the input untouched).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from nsysfrag.inputs.torch_snapshot.limits import ENV_MAX_ITEMS
from nsysfrag.inputs.torch_snapshot.reader import FRAME_CHARS
from tests.hostile.contract import run_nsysfrag
from tests.hostile.pickles import blocks_bomb, entries_bomb, shared_stack_bomb, with_deep_value

S = 0x7F00_0000_0000
MiB = 1 << 20


def _write(tmp_path: Path, data: bytes, name: str = "hostile.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _snapshot(**extra: Any) -> dict[str, Any]:
    """A valid small snapshot: one segment with one live block, its alloc in the trace."""
    block = {
        "address": S,
        "size": MiB,
        "requested_size": MiB,
        "state": "active_allocated",
        "frames": [],
    }
    rest = {
        "address": S + MiB,
        "size": 19 * MiB,
        "requested_size": 0,
        "state": "inactive",
        "frames": [],
    }
    seg = {"device": 0, "address": S, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
           "blocks": [block, rest]}  # fmt: skip
    entry = {
        "action": "alloc",
        "addr": S,
        "size": MiB,
        "stream": 0,
        "time_us": 1_700_000_000_000_000,
        "frames": [],
    }
    return {"segments": [seg], "device_traces": [[entry]], **extra}


def _analyze(path: Path, *more: str, env: dict[str, str] | None = None) -> Any:
    return run_nsysfrag(["analyze", path, "--json", "-", *more], inputs=[path], env=env)


# ---------------------------------------------------------------- memo bombs


@pytest.mark.parametrize("command", ["analyze", "whatif"])
def test_a_2_mb_pickle_of_a_billion_trace_entries_is_refused(tmp_path: Path, command: str) -> None:
    path = _write(tmp_path, entries_bomb())
    assert 1_900_000 < path.stat().st_size < 2_100_000
    out = run_nsysfrag([command, path], inputs=[path])
    assert out.returncode == 2
    assert "1,000,000,000 trace entries" in out.stderr and ENV_MAX_ITEMS in out.stderr


@pytest.mark.parametrize("command", ["analyze", "whatif"])
def test_a_40_kb_pickle_of_a_hundred_million_blocks_is_refused(
    tmp_path: Path, command: str
) -> None:
    path = _write(tmp_path, blocks_bomb())
    assert path.stat().st_size < 50_000
    out = run_nsysfrag([command, path], inputs=[path])
    assert out.returncode == 2
    assert "segments and blocks" in out.stderr and ENV_MAX_ITEMS in out.stderr


def test_the_limit_can_be_raised(tmp_path: Path) -> None:
    # 300,000 entries in ~200 kB: more than one per 4 bytes, allowed once the limit is raised
    path = _write(tmp_path, entries_bomb(per_list=100_000, lists=3))
    refused = _analyze(path)
    assert refused.returncode == 2 and "300,000 trace entries" in refused.stderr
    raised = _analyze(path, env={ENV_MAX_ITEMS: "300000"})
    assert raised.returncode == 0, raised.stderr
    doc = json.loads(raised.stdout)  # the same trace list for devices 0, 1 and 2
    assert [s["window"]["trace_entries"] for s in doc["spaces"]] == [100_000] * 3
    bad = _analyze(path, env={ENV_MAX_ITEMS: "lots"})
    assert bad.returncode == 2 and ENV_MAX_ITEMS in bad.stderr


@pytest.mark.parametrize("python", [False, True], ids=["cpp-frames", "python-frame-last"])
def test_a_huge_stack_shared_by_every_entry_is_walked_once(tmp_path: Path, python: bool) -> None:
    path = _write(tmp_path, shared_stack_bomb(python=python))
    assert path.stat().st_size < 450_000
    out = _analyze(path)
    assert out.returncode == 0, out.stderr
    (space,) = json.loads(out.stdout)["spaces"]
    assert space["window"]["trace_entries"] == 100_000


# ---------------------------------------------------------------- deep nesting, huge integers


def test_a_deep_list_as_a_block_state_is_one_line(tmp_path: Path) -> None:
    data = _snapshot()
    path = _write(
        tmp_path, with_deep_value(data["segments"][0]["blocks"][0], "state", 100_000, data)
    )
    out = _analyze(path)
    assert out.returncode == 2
    assert "segments[0].blocks[0].state is a list, not a block state" in out.stderr


@pytest.mark.parametrize("key", ["frames", "name"])
def test_a_deep_list_where_a_stack_or_frame_is_expected_is_ignored(
    tmp_path: Path, key: str
) -> None:
    data = _snapshot()
    entry = data["device_traces"][0][0]
    if key == "frames":
        target = entry
    else:
        target = {"filename": "/home/me/model.py", "line": 3}
        entry["frames"] = [target]
    path = _write(tmp_path, with_deep_value(target, key, 100_000, data))
    out = _analyze(path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["spaces"][0]["counts"]["allocations"] == 1


@pytest.mark.parametrize(
    ("where", "field"),
    [
        (lambda d: d["device_traces"][0][0], "time_us"),
        (lambda d: d["segments"][0]["blocks"][0], "requested_size"),
        (lambda d: d["device_traces"][0][0], "stream"),
        (lambda d: d["segments"][0], "stream"),
    ],
    ids=["time_us", "requested_size", "entry-stream", "segment-stream"],
)
def test_integers_beyond_64_bits_name_the_field(tmp_path: Path, where: Any, field: str) -> None:
    data = _snapshot()
    where(data)[field] = 1 << 70
    path = _write(tmp_path, pickle.dumps(data, protocol=4))
    out = _analyze(path)
    assert out.returncode == 2
    assert f".{field} is an integer of 71 bits" in out.stderr


def test_an_oom_with_a_device_free_beyond_64_bits_names_the_field(tmp_path: Path) -> None:
    data = _snapshot()
    data["device_traces"][0].append(
        {"action": "oom", "device_free": 1 << 80, "size": MiB, "stream": 0}
    )
    path = _write(tmp_path, pickle.dumps(data, protocol=4))
    out = _analyze(path)
    assert out.returncode == 2 and "device_traces[0][1].device_free" in out.stderr


def test_a_5000_digit_block_state_is_one_line(tmp_path: Path) -> None:
    data = _snapshot()
    data["segments"][0]["blocks"][0]["state"] = 10**4999
    path = _write(tmp_path, pickle.dumps(data, protocol=4))
    out = _analyze(path)
    assert out.returncode == 2
    assert "state is an integer of 16607 bits, not a block state" in out.stderr


@pytest.mark.parametrize("command", ["analyze", "whatif"])
def test_roundup_power2_divisions_keys_of_inf_or_2_100_are_ignored_with_a_warning(
    tmp_path: Path, command: str
) -> None:
    settings = {"roundup_power2_divisions": {float("inf"): 4, 2**100: 2, "inf": 8, "1": 4}}
    path = _write(tmp_path, pickle.dumps(_snapshot(allocator_settings=settings), protocol=4))
    out = run_nsysfrag([command, path, "--json", "-"], inputs=[path])
    assert out.returncode == 0, out.stderr
    if command == "analyze":
        (warning,) = [w for w in json.loads(out.stdout)["trace"]["warnings"] if "roundup" in w]
        assert "ignored 3 entries" in warning and "inf" in warning


def test_a_5000_digit_frame_line_and_a_deep_frame_name_are_rendered_safely(tmp_path: Path) -> None:
    data = _snapshot()
    frame = {"filename": "/home/me/model.py", "line": 10**4999, "name": "forward"}
    data["device_traces"][0][0]["frames"] = [frame]
    data["device_traces"][0].append(
        {"action": "oom", "device_free": MiB, "size": MiB, "stream": 0, "frames": [frame]}
    )
    path = _write(tmp_path, pickle.dumps(data, protocol=4))
    out = _analyze(path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["spaces"][0]["oom_events"][0]["site"] == "me/model.py:? forward"


def test_an_oom_stack_naming_a_megabyte_file_from_every_frame_stays_small(
    tmp_path: Path,
) -> None:
    # GIVEN one 2 MB file name and function name, shared through the pickle memo by the 64
    # frames of an OOM's stack: a 4 MB file whose stack would render as 256 MB of text
    huge = "x" * (2 * MiB)
    frames = [{"filename": f"/{huge}.py", "line": i, "name": huge} for i in range(64)]
    data = _snapshot()
    data["device_traces"][0].append(
        {"action": "oom", "device_free": MiB, "size": 32 * MiB, "stream": 0, "frames": frames}
    )
    path = _write(tmp_path, pickle.dumps(data, protocol=4))
    out = _analyze(path)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout) < 200_000  # the JSON: 64 frames of at most FRAME_CHARS each
    (oom,) = json.loads(out.stdout)["spaces"][0]["ooms"]
    assert len(oom["stack"]) == 64 and all(len(f) <= FRAME_CHARS for f in oom["stack"])
    assert oom["stack"][0].startswith("…") and oom["site"] == oom["stack"][0]

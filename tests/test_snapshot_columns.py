"""The columnar snapshot reader: the same entries, sites and refusals as the record reader,
stacks interned once, the object graph gone once the columns exist."""

from __future__ import annotations

import pickle
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nsysfrag.inputs.torch_snapshot import columns as sc
from nsysfrag.inputs.torch_snapshot.columns import (
    NO_TIME,
    SnapshotColumns,
    read_snapshot_columns,
    snapshot_columns,
)
from nsysfrag.inputs.torch_snapshot.reader import (
    ACTION_KINDS,
    NO_STACK,
    Snapshot,
    load_plain_pickle,
    parse_snapshot,
)
from nsysfrag.inputs.torch_snapshot.stacks import StackTable
from tests.conftest import SAMPLES, SNAPSHOT_INPUTS

INPUTS = SNAPSHOT_INPUTS
S = 0x7F00_0000_0000


def assert_same_entries(records: Snapshot, columns: SnapshotColumns) -> None:
    assert columns.devices() == records.devices()
    for attr in ("layout", "segments", "allocator_conf", "max_split_size", "roundup_power2_divisions",
                 "expandable_segments", "unknown_actions", "skipped_entries", "time_origin_us",
                 "warnings"):  # fmt: skip
        assert getattr(columns, attr) == getattr(records, attr), attr
    for device, trace in records.histories.items():
        col = columns.histories[device]
        assert col.action.tolist() == [ACTION_KINDS[e.action] for e in trace]
        assert col.address.tolist() == [e.address for e in trace]
        assert col.size.tolist() == [e.size for e in trace]
        assert col.stream.tolist() == [e.stream for e in trace]
        assert col.time_us.tolist() == [NO_TIME if e.time_us is None else e.time_us for e in trace]
        assert [columns.site(s) for s in col.stack.tolist()] == [e.site for e in trace]
        ooms = [e for e in trace if e.action == "oom"]
        assert col.oom_rows.tolist() == [i for i, e in enumerate(trace) if e.action == "oom"]
        assert col.oom_device_free.tolist() == [
            -1 if e.device_free is None else e.device_free for e in ooms
        ]


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name[:50])
def test_columns_hold_what_the_records_hold(path: Path) -> None:
    data = load_plain_pickle(path)
    assert_same_entries(parse_snapshot(data, path.name), snapshot_columns(data, path.name))


@pytest.mark.parametrize("path", INPUTS[:3], ids=lambda p: p.name[:50])
def test_the_careful_path_gives_the_fast_paths_columns(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = load_plain_pickle(path)
    fast = snapshot_columns(data, path.name)
    monkeypatch.setattr(sc, "_fast_chunk", lambda part, start: None)
    careful = snapshot_columns(data, path.name)
    for device, col in fast.histories.items():
        other = careful.histories[device]
        for name in (
            "action",
            "address",
            "size",
            "stream",
            "time_us",
            "oom_rows",
            "oom_device_free",
        ):
            assert np.array_equal(getattr(col, name), getattr(other, name)), name
        assert [fast.site(s) for s in col.stack.tolist()] == [
            careful.site(s) for s in other.stack.tolist()
        ]
        assert col.oom_frames == other.oom_frames


def _entry(action: str = "alloc", **extra: Any) -> dict[str, Any]:
    return {
        "action": action,
        "addr": S,
        "size": 512,
        "stream": 0,
        "time_us": 5,
        "frames": [],
        **extra,
    }


@pytest.mark.parametrize(
    "odd",
    [
        {"addr": True},  # a bool is not an address
        {"addr": None},
        {"addr": -1},
        {"size": 1 << 62},
        {"action": ["alloc"]},
        {"action": "teleport"},
        {"stream": "3"},
        {"time_us": 1.5},
    ],
    ids=lambda d: next(iter(d)) + "=" + repr(next(iter(d.values())))[:12],
)
def test_an_odd_entry_is_read_as_the_record_reader_reads_it(odd: dict[str, Any]) -> None:
    trace = [_entry(), {**_entry("free_completed"), **odd}, _entry("oom", device_free=7)]
    del trace[2]["addr"]
    data = {"segments": [], "device_traces": [trace]}
    assert_same_entries(parse_snapshot(data, "s"), snapshot_columns(data, "s"))


def test_stacks_are_interned_by_identity_and_by_content() -> None:
    cpp = {"name": "c10::malloc", "filename": "??", "line": 0}
    user = [{"name": f"f{i}", "filename": f"/p/m{i}.py", "line": i} for i in range(4)]
    shared = [cpp, user[0], cpp]
    # Same length and the same middle frame as `shared`, but another site: a hash collision.
    collides = [cpp, user[0], user[1]][::-1]
    collides[1] = user[0]
    frames = [
        shared,
        shared,
        list(shared),
        collides,
        [],
        None,
        "not a list",
        [user[2]],
        [user[3], cpp],
    ]
    table = StackTable(None)
    ids = table.intern(frames).tolist()
    assert ids[0] == ids[1] == ids[2]  # one list twice, and an equal list
    assert len({ids[0], ids[3], ids[7], ids[8]}) == 4
    assert ids[4] == ids[5] == ids[6] == 0
    names = [table.site_names[int(table.stack_site[i])] for i in ids]
    assert names[0] == "p/m0.py:0 f0" and names[3] == "p/m1.py:1 f1" and names[4] == NO_STACK


def test_a_failed_oom_keeps_its_whole_stack() -> None:
    frames = [
        {"name": "malloc", "filename": "??", "line": 0},
        {"name": "fwd", "filename": "/p/m.py", "line": 10**30},
    ]
    data = {"segments": [], "device_traces": [[_entry("oom", device_free=1 << 30, frames=frames)]]}
    (stack,) = snapshot_columns(data, "s").histories[0].oom_frames
    assert stack == (("??", "0", "malloc"), ("/p/m.py", "an integer of 100 bits", "fwd"))


def test_the_object_graph_is_gone_once_the_columns_exist(tmp_path: Path) -> None:
    path = SAMPLES / "training_snapshot.pickle"
    tracemalloc.start()
    try:
        columns = read_snapshot_columns(path)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(columns.histories[0]) == 8000
    assert current < peak / 4, (current, peak)


def test_progress_is_reported_while_reading_and_parsing() -> None:
    seen: list[tuple[str, int, int]] = []
    read_snapshot_columns(SAMPLES / "training_snapshot.pickle", progress=lambda *a: seen.append(a))
    phases = {phase for phase, _, _ in seen}
    assert phases == {"reading the snapshot", "parsing trace entries"}
    assert seen[-1] == ("parsing trace entries", 8000, 8000)
    size = (SAMPLES / "training_snapshot.pickle").stat().st_size
    assert max(done for phase, done, _ in seen if phase == "reading the snapshot") == size


def test_a_pickle_of_plain_data_round_trips(tmp_path: Path) -> None:
    data = {"segments": [], "device_traces": [[_entry()]]}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    assert read_snapshot_columns(path).histories[0].address.tolist() == [S]


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name[:50])
def test_a_file_read_chunk_by_chunk_as_its_entries_are_freed_keeps_every_figure(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """read_snapshot_columns empties the trace lists as it goes; small chunks make it cross many
    chunk boundaries, and stacks met again after their first lists were freed keep their ids
    (compared on one object graph: ids are numbered by chunk and by the frames' addresses)."""
    monkeypatch.setattr(sc, "CHUNK", 97)
    data = load_plain_pickle(path)
    records, whole = parse_snapshot(data, path.name), snapshot_columns(data, path.name)
    consumed = snapshot_columns(data, path.name, consume=True)
    traces = data.get("device_traces", []) if isinstance(data, dict) else []
    assert all(not trace for trace in traces)  # every entry went
    assert_same_entries(records, consumed)
    assert consumed.stack_site.tolist() == whole.stack_site.tolist()
    assert consumed.site_names == whole.site_names
    for device, col in whole.histories.items():
        assert consumed.histories[device].stack.tolist() == col.stack.tolist()
    assert_same_entries(records, read_snapshot_columns(path))


def test_entries_are_freed_while_later_ones_become_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The graph shrinks as the columns grow: by the last chunk, most entries are gone."""
    traced: list[int] = []
    fast_chunk = sc._fast_chunk

    def measured(part: list[Any], start: int) -> Any:
        traced.append(tracemalloc.get_traced_memory()[0])
        return fast_chunk(part, start)

    monkeypatch.setattr(sc, "CHUNK", 500)
    monkeypatch.setattr(sc, "_fast_chunk", measured)
    tracemalloc.start()
    try:
        columns = read_snapshot_columns(SAMPLES / "training_snapshot.pickle")
    finally:
        tracemalloc.stop()
    assert len(columns.histories[0]) == 8000 and len(traced) == 16
    assert traced[-1] < traced[0] / 2, traced


def test_a_trace_list_named_twice_is_read_whole_for_each_device(tmp_path: Path) -> None:
    trace = [_entry(), _entry("free_requested"), _entry("free_completed")]
    data = {"segments": [], "device_traces": [trace, trace]}  # one list, through the memo
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    histories = read_snapshot_columns(path).histories
    assert [len(histories[d]) for d in (0, 1)] == [3, 3]
    assert histories[0].action.tolist() == histories[1].action.tolist()


def test_columns_of_the_callers_data_leave_it_as_it_was() -> None:
    trace = [_entry(), _entry("free_requested")]
    data = {"segments": [], "device_traces": [trace]}
    snapshot_columns(data, "s")
    assert data["device_traces"][0] is trace and len(trace) == 2

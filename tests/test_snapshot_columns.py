"""The columnar snapshot reader: the same entries, sites and refusals as the record reader,
stacks interned once, the object graph gone once the columns exist."""

from __future__ import annotations

import gc
import io
import pickle
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nsysfrag.errors import InputError
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
    monkeypatch.setattr(sc.TraceSlices, "items", 1 << 62)  # no slices: the graph first, whole
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


# ---------------------------------------------------------------- a trace unpickled in slices


def _sliced_reads(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What TraceSlices.placed answered, each time a read was sliced."""
    answers: list[bool] = []
    placed = sc.TraceSlices.placed

    def noted(self: sc.TraceSlices, data: Any) -> bool:
        answers.append(placed(self, data))
        return answers[-1]

    monkeypatch.setattr(sc.TraceSlices, "placed", noted)
    return answers


def _long_trace(n: int) -> list[dict[str, Any]]:
    frames = [{"filename": f"/p/m{k}.py", "line": k, "name": "fwd"} for k in range(7)]
    trace = []
    for i in range(n):
        action = ("alloc", "free_requested", "free_completed")[i % 3]
        stack = [frames[i % 7], frames[(i // 7) % 7]]
        trace.append(_entry(action, addr=S + 512 * (i // 3), time_us=i, frames=stack))
    return trace


def _written(tmp_path: Path, data: Any, name: str = "s.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(data, protocol=4))
    return path


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name[:50])
def test_a_trace_unpickled_in_slices_gives_the_whole_reads_columns(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small slices: every genuine snapshot with a trace is sliced, and its columns are the
    record reader's (stack ids are numbered by the frames' addresses: compared by site)."""
    monkeypatch.setattr(sc, "CHUNK", 97)
    answers = _sliced_reads(monkeypatch)
    data = load_plain_pickle(path)
    records = parse_snapshot(data, path.name)
    sliced = read_snapshot_columns(path)
    assert_same_entries(records, sliced)
    traces = data.get("device_traces", []) if isinstance(data, dict) else []
    longest = max(map(len, traces), default=0)
    assert all(answers) and (answers == [True] or longest < 97), (answers, longest)


def _entries_alive_at_each_chunk(monkeypatch: pytest.MonkeyPatch, slices: bool) -> list[int]:
    """How many trace entry dicts exist as each chunk of the sample is parsed."""
    alive: list[int] = []
    fast_chunk = sc._fast_chunk

    def entries() -> int:
        return sum(1 for o in gc.get_objects() if type(o) is dict and "action" in o)

    # Entries other tests left alive (a whole suite's caches) are not this read's: count from them.
    gc.collect()
    before = entries()

    def counted(part: list[Any], start: int) -> Any:
        alive.append(entries() - before)
        return fast_chunk(part, start)

    with monkeypatch.context() as patched:
        patched.setattr(sc, "CHUNK", 500)
        patched.setattr(sc, "_fast_chunk", counted)
        if not slices:
            patched.setattr(sc.TraceSlices, "items", 1 << 62)
        columns = read_snapshot_columns(SAMPLES / "training_snapshot.pickle")
    assert len(columns.histories[0]) == 8000 and len(alive) == 16
    return alive


def test_slices_free_the_entries_taken_while_the_rest_is_unpickled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The memo would hold every entry dict: its slots are emptied after their last use, so
    that no chunk sees more than a few chunks' entries alive; the whole read, all 8,000."""
    answers = _sliced_reads(monkeypatch)
    sliced = _entries_alive_at_each_chunk(monkeypatch, slices=True)
    assert answers == [True]
    whole = _entries_alive_at_each_chunk(monkeypatch, slices=False)
    assert whole[0] >= 8000 and max(sliced) <= 4 * 500, (sliced, whole)


def test_a_small_trace_before_a_sliced_one_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole read parses device 0 first: slices of device 1 cannot stand in for it."""
    monkeypatch.setattr(sc, "CHUNK", 50)
    answers = _sliced_reads(monkeypatch)
    data = {"segments": [], "device_traces": [_long_trace(10), [], _long_trace(400)]}
    path = _written(tmp_path, data)
    assert_same_entries(parse_snapshot(data, str(path)), read_snapshot_columns(path))
    assert answers == [False]
    data = {"segments": [], "device_traces": [_long_trace(400), [], _long_trace(10)]}
    path = _written(tmp_path, data)
    assert_same_entries(parse_snapshot(data, str(path)), read_snapshot_columns(path))
    assert answers == [False, True]


def test_a_sliced_trace_named_twice_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sc, "CHUNK", 50)
    answers = _sliced_reads(monkeypatch)
    trace = _long_trace(300)
    data = {"segments": [], "device_traces": [trace, trace], "allocator_settings": {"t": trace}}
    path = _written(tmp_path, data)
    assert_same_entries(parse_snapshot(data, str(path)), read_snapshot_columns(path))
    assert answers == [False]


def test_a_long_list_that_is_no_trace_is_left_whole_or_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stack of 400 frames grows as long as a slice, but holds no trace entry: it is left
    as it is. A long list of entries that is no device trace is taken, then read again."""
    monkeypatch.setattr(sc, "CHUNK", 50)
    answers = _sliced_reads(monkeypatch)
    frames = [{"filename": f"/p/m{k}.py", "line": k, "name": "f"} for k in range(400)]
    data: dict[str, Any] = {
        "segments": [], "device_traces": [[_entry(frames=frames), _entry("oom", frames=frames)]]
    }
    path = _written(tmp_path, data)
    columns = read_snapshot_columns(path)
    assert_same_entries(parse_snapshot(data, str(path)), columns)
    assert len(columns.histories[0].oom_frames[0]) == 400
    assert answers == [True]
    data["allocator_settings"] = {"roundup_power2_divisions": _long_trace(200)}
    path = _written(tmp_path, data)
    assert_same_entries(parse_snapshot(data, str(path)), read_snapshot_columns(path))
    assert answers == [True, False]


def _pickled_with_memo(data: Any) -> tuple[bytes, dict[int, int]]:
    """``data`` as protocol 4, and the memo slot of each object pickled (by its id)."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=4)
    pickler.dump(data)
    return out.getvalue(), {key: slot for key, (slot, _) in pickler.memo.copy().items()}


def test_an_entry_changed_after_it_could_be_taken_is_read_as_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crafted pickle sets an entry's size after the trace (through the memo): the pass
    slices nowhere, and the columns hold the changed size, as pickle.load's object does."""
    monkeypatch.setattr(sc, "CHUNK", 50)
    answers = _sliced_reads(monkeypatch)
    trace = _long_trace(300)
    raw, slots = _pickled_with_memo({"segments": [], "device_traces": [trace]})
    slot = slots[id(trace[3])]
    assert raw.endswith(b"u.")
    size = pickle.dumps(4096, protocol=4)[2:-1]  # BININT2, as the opcode stream holds it
    changed = raw[:-1] + b"j" + slot.to_bytes(4, "little") + b"\x8c\x04size" + size + b"s0."
    path = tmp_path / "changed.pickle"
    path.write_bytes(changed)
    data = pickle.loads(changed)
    assert data["device_traces"][0][3]["size"] == 4096
    columns = read_snapshot_columns(path)
    assert_same_entries(parse_snapshot(data, str(path)), columns)
    assert columns.histories[0].size[3] == 4096 and answers == []


def test_a_bad_field_in_a_slice_is_named_as_the_whole_read_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sc, "CHUNK", 50)
    answers = _sliced_reads(monkeypatch)
    trace = _long_trace(300)
    trace[70]["time_us"] = 1 << 60
    path = _written(tmp_path, {"segments": [], "device_traces": [trace]})
    with pytest.raises(InputError, match=r"device_traces\[0\]\[70\]\.time_us is 1152921504606846976"):
        read_snapshot_columns(path)
    assert answers == []  # the slice failed: the whole read named it

"""nsysfrag held to PyTorch's own numbers on snapshots PyTorch wrote on a real GPU.

``sample_traces/make_torch_snapshots.py`` ran PyTorch's caching allocator on a CUDA device in
scenarios whose outcome is known (a capacity OOM, a fragmentation OOM, the same workload under
expandable segments, an OOM path that recovers, a trace window that opens mid-run) and wrote,
beside each snapshot, what PyTorch itself said at the moment: the OOM message, the whole
``torch.cuda.memory_stats()`` and ``torch.cuda.mem_get_info()`` (``torch_<name>_truth.json``).
Nothing ran between the failure (or the last allocation) and those calls, and the snapshot was
dumped right after them, so the snapshot's last state is the state PyTorch described.

Where the figures must agree exactly, and why:

* ``requested_bytes`` is the request as the allocator rounded it (512 B steps): PyTorch's ``oom``
  entry records the rounded size, not the bytes the program asked for; the message's "Tried to
  allocate" is the segment the allocator then asked the driver for.
* ``device_free_bytes`` is the ``device_free`` that PyTorch's ``oom`` entry records (its own
  cudaMemGetInfo), and the capacity is read off that entry: reserved + device free.
* ``stranded_bytes`` is PyTorch's ``inactive_split_bytes`` with the native allocator (free
  blocks of split segments: it merges a segment whose blocks are all free back into one block).
  PyTorch leaves expandable segments out of that statistic, so there only reserved, allocated
  and device free are compared.

The message writes sizes with two decimals (PyTorch's ``format_size``); those are compared as
PyTorch would write nsysfrag's exact figures. The files are recorded on a GPU and committed; a
test skips only when its scenario's files are absent.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

from nsysfrag.cli import cli
from tests.conftest import SAMPLES

ROUNDING = 512  # PyTorch's kMinBlockSize: every request is rounded up to a multiple of it


def _maker() -> ModuleType:
    """make_torch_snapshots.py itself (stdlib only at import): its scenarios and PyTorch's
    ``format_size``."""
    path = SAMPLES / "make_torch_snapshots.py"
    spec = importlib.util.spec_from_file_location("make_torch_snapshots", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


MAKER = _maker()
format_size = MAKER.format_size
OOM_SCENARIOS = ("capacity", "capacity_expandable", "fragmentation", "window")
INTENDED_VERDICT = {"capacity": "capacity", "capacity_expandable": "capacity",
                    "fragmentation": "fragmentation", "window": "fragmentation"}  # fmt: skip
FULL_TRACE = ("capacity", "capacity_expandable", "fragmentation", "expandable", "recovered")


def recorded(name: str) -> tuple[dict[str, Any], Path]:
    """The truth JSON of a scenario and its snapshot (committed: recorded once on a GPU with
    make_torch_snapshots.py, so a missing one is a lost file, not a reason to skip)."""
    truth_path = SAMPLES / f"torch_{name}_truth.json"
    assert truth_path.exists(), f"{truth_path.name} is missing: restore it from git"
    truth = json.loads(truth_path.read_text())
    return truth, SAMPLES / truth["snapshot"]


def _cli_json(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, [*args, "--json", "-"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def analyzed(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(truth, the one device space of ``nsysfrag analyze``)."""
    truth, snapshot = recorded(name)
    spaces = _cli_json("analyze", str(snapshot))["spaces"]
    assert [s["device"] for s in spaces] == [0]
    return truth, spaces[0]


def segment_for(size: int) -> int:
    """The segment PyTorch's native allocator asks the driver for to hold a rounded request:
    2 MiB up to 1 MiB, 20 MiB below 10 MiB, else the request rounded up to 2 MiB."""
    if size <= 1 << 20:
        return 2 << 20
    if size < 10 << 20:
        return 20 << 20
    return -(-size // (2 << 20)) * (2 << 20)


def stat(truth: dict[str, Any], key: str) -> int:
    value: int = truth["memory_stats"][key]
    return value


# ---------------------------------------------------------------- reading PyTorch's words


def test_the_oom_message_figures_are_read_as_pytorch_writes_them() -> None:
    """GIVEN an OOM message as PyTorch 2.x writes it (with the process line some drivers add)
    WHEN its figures are read THEN each is the text PyTorch wrote, and format_size writes
    sizes the way PyTorch's does (bytes up to 1 KiB, KiB up to 1 MiB, MiB up to 1 GiB)."""
    message = (
        "CUDA out of memory. Tried to allocate 1.22 GiB. GPU 0 has a total capacity of 15.77 GiB"
        " of which 959.44 MiB is free. Process 12447 has 14.83 GiB memory in use. Of the"
        " allocated memory 14.01 GiB is allocated by PyTorch, and 472.05 MiB is reserved by"
        " PyTorch but unallocated. If reserved but unallocated memory is large try setting"
        " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )
    assert MAKER.oom_message_figures(message) == {
        "tried_to_allocate": "1.22 GiB", "total_capacity": "15.77 GiB",
        "device_free": "959.44 MiB", "allocated_by_pytorch": "14.01 GiB",
        "reserved_unallocated": "472.05 MiB",
    }  # fmt: skip
    assert MAKER.oom_message_figures("CUDA error: unspecified launch failure") == dict.fromkeys(
        MAKER.oom_message_figures(message)
    )
    assert [format_size(n) for n in (1024, 1025, 1 << 20, (1 << 20) + 1, 1 << 30, 3 << 29)] == [
        "1024 bytes", "1.00 KiB", "1024.00 KiB", "1.00 MiB", "1024.00 MiB", "1.50 GiB",
    ]  # fmt: skip


def test_each_scenario_runs_in_its_own_process_with_only_its_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN allocator settings in the calling environment WHEN a scenario's process is set up
    THEN it carries only the scenario's own PYTORCH_CUDA_ALLOC_CONF."""
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:128")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.5")
    native = MAKER.child_env(MAKER.SCENARIOS["fragmentation"])
    expandable = MAKER.child_env(MAKER.SCENARIOS["expandable"])
    assert "PYTORCH_ALLOC_CONF" not in native and "PYTORCH_CUDA_ALLOC_CONF" not in native
    assert expandable["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_ALLOC_CONF" not in expandable


# ---------------------------------------------------------------- the files themselves


@pytest.mark.parametrize("name", sorted(MAKER.SCENARIOS))
def test_each_recording_is_small_genuine_and_did_what_its_scenario_says(name: str) -> None:
    """GIVEN a scenario's files WHEN they are read THEN the pickle is under 1 MB, was written by
    a CUDA build of torch, and PyTorch raised OOM exactly where the scenario meant it to
    (the expandable-segments outcome is whatever PyTorch did: it is recorded, not intended)."""
    truth, snapshot = recorded(name)
    assert snapshot.stat().st_size < 1_000_000
    assert truth["cuda_version"] and "fake" not in truth["torch_version"]
    assert stat(truth, "num_ooms") == (1 if truth["outcome"] == "oom" else 0)
    if name in OOM_SCENARIOS:
        assert truth["outcome"] == "oom"
    elif name == "recovered":
        assert truth["outcome"] == "allocated"
        assert stat(truth, "num_alloc_retries") == 1  # it took the OOM path, and got through


# ---------------------------------------------------------------- analyze: each OOM as PyTorch saw it


@pytest.mark.parametrize("name", sorted(MAKER.SCENARIOS))
def test_every_pytorch_oom_is_one_entry_of_ooms(name: str) -> None:
    """GIVEN a real snapshot WHEN analyzed THEN ``ooms`` holds one entry per OOM PyTorch raised
    (``num_ooms``), and none where the allocator recovered (the OOM path that ends well)."""
    truth, space = analyzed(name)
    assert len(space["ooms"]) == stat(truth, "num_ooms")


@pytest.mark.parametrize("name", OOM_SCENARIOS)
def test_the_oom_request_is_the_one_pytorch_recorded(name: str) -> None:
    """GIVEN a real OOM WHEN analyzed THEN the entry's request is the program's request rounded
    up to PyTorch's 512 B, and PyTorch's message names the segment that request needs."""
    truth, space = analyzed(name)
    (oom,) = space["ooms"]
    asked = truth["parameters"]["request_bytes"]
    assert oom["requested_bytes"] % ROUNDING == 0
    assert 0 <= oom["requested_bytes"] - asked < ROUNDING
    assert (
        format_size(segment_for(oom["requested_bytes"]))
        == truth["oom"]["figures"]["tried_to_allocate"]
    )


@pytest.mark.parametrize("name", OOM_SCENARIOS)
def test_the_state_at_the_oom_is_pytorchs(name: str) -> None:
    """GIVEN a real OOM WHEN analyzed THEN reserved, allocated and device free at the entry are
    PyTorch's to the byte (memory_stats, mem_get_info); with the native allocator stranded is its
    inactive_split_bytes and releasable the rest of the free bytes; the capacity is reserved +
    device free, and the message's figures are what PyTorch would write for them."""
    truth, space = analyzed(name)
    (oom,) = space["ooms"]
    reserved = stat(truth, "reserved_bytes.all.current")
    allocated = stat(truth, "allocated_bytes.all.current")
    split = stat(truth, "inactive_split_bytes.all.current")
    device_free = truth["mem_get_info"]["free_bytes"]
    assert oom["reserved_bytes"] == reserved
    assert oom["allocated_bytes"] == allocated
    assert oom["device_free_bytes"] == device_free
    if "expandable_segments:True" not in truth["alloc_conf"]:
        assert oom["stranded_bytes"] == split
        assert oom["releasable_bytes"] == reserved - allocated - split
    assert space["capacity_bytes"] == reserved + device_free
    figures = truth["oom"]["figures"]
    assert format_size(oom["device_free_bytes"]) == figures["device_free"]
    assert format_size(oom["allocated_bytes"]) == figures["allocated_by_pytorch"]
    unallocated = oom["reserved_bytes"] - oom["allocated_bytes"]
    assert format_size(unallocated) == figures["reserved_unallocated"]


@pytest.mark.parametrize("name", OOM_SCENARIOS)
def test_the_verdict_follows_pytorchs_own_figures(name: str) -> None:
    """GIVEN a real OOM WHEN analyzed THEN the verdict is ``capacity`` exactly when the rounded
    request exceeds what PyTorch itself reported free (device free + reserved but unallocated),
    and that is the verdict the scenario was built to produce."""
    truth, space = analyzed(name)
    (oom,) = space["ooms"]
    free_anywhere = truth["mem_get_info"]["free_bytes"] + (
        stat(truth, "reserved_bytes.all.current") - stat(truth, "allocated_bytes.all.current")
    )
    expected = "capacity" if oom["requested_bytes"] > free_anywhere else "fragmentation"
    assert expected == INTENDED_VERDICT[name]
    assert oom["verdict"] == expected


@pytest.mark.parametrize("name", FULL_TRACE)
def test_peaks_and_final_state_are_pytorchs(name: str) -> None:
    """GIVEN a snapshot whose trace covers the whole run WHEN analyzed THEN peak reserved and
    peak allocated are memory_stats' peaks, and the final reserved and allocated its current
    figures (the snapshot was dumped right after they were read)."""
    truth, space = analyzed(name)
    assert space["window"]["initial_blocks"] == 0 and space["window"]["conflicts"] == 0
    assert space["reserved_bytes_peak"] == stat(truth, "reserved_bytes.all.peak")
    assert space["allocated_bytes_peak"] == stat(truth, "allocated_bytes.all.peak")
    assert space["reserved_bytes_final"] == stat(truth, "reserved_bytes.all.current")
    assert space["allocated_bytes_final"] == stat(truth, "allocated_bytes.all.current")


@pytest.mark.parametrize("name", sorted(MAKER.SCENARIOS))
def test_every_figure_named_for_a_memory_stats_key_is_that_key(name: str) -> None:
    """GIVEN a snapshot PyTorch dumped right after reading memory_stats() WHEN analyzed THEN
    what the JSON calls allocated and active at the end (and at the OOM) is PyTorch's
    ``allocated_bytes`` and ``active_bytes`` then, and over a whole-run trace their peaks are
    memory_stats' peaks: allocated counts active_allocated blocks only, active adds the blocks
    whose free waits on other streams (none in these single-stream runs, so the two agree here,
    as they do in PyTorch's own figures)."""
    truth, space = analyzed(name)
    final = space["final"]
    assert final["reserved_bytes"] == stat(truth, "reserved_bytes.all.current")
    assert final["allocated_bytes"] == stat(truth, "allocated_bytes.all.current")
    assert final["active_bytes"] == stat(truth, "active_bytes.all.current")
    assert space["active_bytes_final"] == stat(truth, "active_bytes.all.current")
    for oom in space["ooms"]:
        assert oom["allocated_bytes"] == stat(truth, "allocated_bytes.all.current")
        assert oom["active_bytes"] == stat(truth, "active_bytes.all.current")
    if name in FULL_TRACE:
        assert space["active_bytes_peak"] == stat(truth, "active_bytes.all.peak")
        assert space["allocated_bytes_peak"] == stat(truth, "allocated_bytes.all.peak")


@pytest.mark.parametrize("name", FULL_TRACE)
def test_the_csv_timeline_carries_pytorchs_reserved_and_allocated(name: str) -> None:
    """GIVEN a whole-run snapshot WHEN its timeline is written as CSV THEN each row has the
    allocator's figures after that event: their maxima and last values are memory_stats' peaks
    and current figures, and stranded is reserved - active - releasable."""
    truth, snapshot = recorded(name)
    result = CliRunner().invoke(cli, ["analyze", str(snapshot), "--csv", "-"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))

    def column(key: str) -> list[int]:
        return [int(r[key]) for r in rows]

    reserved, allocated = column("reserved_bytes"), column("allocated_bytes")
    assert max(reserved) == stat(truth, "reserved_bytes.all.peak")
    assert max(allocated) == stat(truth, "allocated_bytes.all.peak")
    assert (reserved[-1], allocated[-1]) == (
        stat(truth, "reserved_bytes.all.current"), stat(truth, "allocated_bytes.all.current"))
    assert max(column("active_bytes")) == stat(truth, "active_bytes.all.peak")
    assert all(int(r["stranded_bytes"]) == int(r["reserved_bytes"]) - int(r["active_bytes"])
               - int(r["releasable_bytes"]) >= 0 for r in rows)  # fmt: skip


def test_a_window_that_opens_mid_run_is_rebuilt_without_conflict() -> None:
    """GIVEN a 20-entry trace whose ring buffer dropped the first allocations WHEN analyzed THEN
    the window opens with blocks live, replays without a conflict onto the snapshot's segments,
    and ends on PyTorch's reserved and allocated."""
    truth, space = analyzed("window")
    window = space["window"]
    assert window["trace_entries"] == truth["parameters"]["max_entries"]
    assert window["initial_blocks"] > 0
    assert window["conflicts"] == 0 and window["final_mismatches"] == 0
    assert space["reserved_bytes_final"] == stat(truth, "reserved_bytes.all.current")
    assert space["allocated_bytes_final"] == stat(truth, "allocated_bytes.all.current")


# ---------------------------------------------------------------- whatif against what PyTorch did


def test_whatif_predicts_what_expandable_segments_really_did() -> None:
    """GIVEN the fragmentation OOM and the same workload really run under expandable segments
    WHEN ``whatif`` replays the first under ``torch:expandable_segments=True`` on the capacity
    its OOM implies THEN the baseline has the OOMs PyTorch raised, and the expandable policy
    has as many simulated OOMs as PyTorch raised with expandable segments."""
    native, snapshot = recorded("fragmentation")
    expandable, _ = recorded("expandable")
    doc = _cli_json("whatif", str(snapshot), "--policy", "torch:expandable_segments=True")
    (space,) = doc["spaces"]
    ooms = {p["policy"]: p["simulated_ooms"] for p in space["policies"]}
    assert ooms["torch"] == stat(native, "num_ooms")
    assert ooms["torch:expandable_segments=True"] == stat(expandable, "num_ooms")


def test_whatif_recommends_the_policy_that_removes_the_oom_for_that_reason() -> None:
    """GIVEN the fragmentation OOM, which PyTorch avoided under expandable segments at a slightly
    higher peak reserved WHEN ``whatif`` ranks the policies THEN expandable segments are the
    recommendation, for the reason that they avoid the run's failure (``fewer_ooms``), with their
    cost in peak reserved: a run that died is never told to keep its settings."""
    native, snapshot = recorded("fragmentation")
    expandable, _ = recorded("expandable")
    assert stat(native, "num_ooms") > stat(expandable, "num_ooms")
    doc = _cli_json("whatif", str(snapshot))
    (space,) = doc["spaces"]
    rec = space["recommendation"]
    assert rec["policy"] == "torch:expandable_segments=True" and rec["reason"] == "fewer_ooms"
    assert (rec["simulated_ooms"], rec["baseline_ooms"], rec["recorded_failures"]) == (0, 1, 1)
    peaks = {p["policy"]: p["peak_reserved_bytes"] for p in space["policies"]}
    assert rec["cost_bytes"] == rec["peak_reserved_bytes"] - peaks["torch"] > 0
    assert space["fewer_ooms"] is None  # the recommendation itself says it
    assert space["advice"]["alloc_conf"] == "expandable_segments:True"
    result = CliRunner().invoke(cli, ["whatif", str(snapshot)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "Keep" not in text and "to avoid the run's failure for memory" in text
    assert "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text


@pytest.mark.parametrize("name", FULL_TRACE)
def test_validation_replays_pytorchs_segments_and_oom_paths(name: str) -> None:
    """GIVEN a real snapshot WHEN ``whatif --validate`` replays its requests through the torch
    model with the recorded settings THEN every recorded segment allocation (map, with
    expandable segments) is reproduced in order, peak reserved is PyTorch's, and the model takes
    the OOM path (release cached memory, retry) as often as the record shows it did."""
    truth, snapshot = recorded(name)
    doc = _cli_json("whatif", str(snapshot), "--validate")
    (device,) = doc["validation"]["devices"]
    assert device["segment_alloc_match"] == 1.0
    assert device["peak_reserved_recorded_bytes"] == stat(truth, "reserved_bytes.all.peak")
    assert device["peak_reserved_simulated_bytes"] == device["peak_reserved_recorded_bytes"]
    assert device["simulated_oom_paths"] == device["recorded_oom_paths"]


def test_an_oom_is_told_with_the_program_s_path_to_it(tmp_path: Path) -> None:
    """GIVEN PyTorch's own OOM WHEN it is reported THEN its JSON ``stack`` is the request's path
    through the program, innermost first, starting at its ``site`` and leaving through the
    recording script's entry point; the terminal names the first callers, the HTML every one."""
    _, snapshot = recorded("capacity")
    (space,) = _cli_json("analyze", str(snapshot))["spaces"]
    (oom,) = space["ooms"]
    stack = oom["stack"]
    assert stack[0] == oom["site"] and len(stack) >= 3
    assert all("make_torch_snapshots.py:" in frame for frame in stack)  # no torch/ frame
    assert stack[-1].endswith("<module>")
    page = tmp_path / "r.html"
    result = CliRunner().invoke(cli, ["analyze", str(snapshot), "--html", str(page)],
                                env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"called from {stack[1]} ← {stack[2]}" in result.stdout
    html = page.read_text(encoding="utf-8")
    # each frame is an item of the ordered list (its markup: line breaks, a whole location)
    frames = re.findall(r"<ol class=\"mono\">(.*?)</ol>", html, re.DOTALL)
    items = [re.sub(r"<[^>]+>", "", li) for ol in frames for li in re.findall(r"<li>(.*?)</li>", ol)]
    assert all(frame.replace("<", "&lt;").replace(">", "&gt;") in items
               for frame in stack[1:])  # fmt: skip

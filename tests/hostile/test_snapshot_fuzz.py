"""Fuzzing the snapshot reader through the real command line (issue 16).

The sample snapshots are mutated at the byte level (flipped, deleted, inserted, repeated bytes,
truncation) and at the structure level (keys dropped or added, values replaced by the wrong
type, integers beyond 64 bits, 5,000-digit integers, 100,000-deep lists), and every mutant must
keep the hostile-input contract (``tests/hostile/contract.py``). CI runs a few examples;
``NSYSFRAG_FUZZ_EXAMPLES=2000`` runs a long local campaign.
"""

from __future__ import annotations

import copy
import os
import pickle
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsysfrag.inputs.torch_snapshot.reader import load_plain_pickle
from tests.conftest import SAMPLES
from tests.hostile.contract import run_nsysfrag
from tests.hostile.pickles import with_deep_value

EXAMPLES = int(os.environ.get("NSYSFRAG_FUZZ_EXAMPLES", "6"))
NAMES = (
    "training_snapshot.pickle",
    "inference_snapshot.pickle",
    "inference_expandable_snapshot.pickle",
)
DEEP = object()  # stands for a 100,000-deep list, spliced into the pickle afterwards
HOSTILE_VALUES = [
    None, True, False, -1, 0, 1, 2**31, 2**63, 2**70, -(2**70), 10**4999, 1.5, float("nan"),
    float("inf"), "", "x" * 5000, "alloc", "segment_map", "oom", "active_pending_free", [], {},
    [[]], {"action": "alloc"}, (0, 0), b"bytes", DEEP,
]  # fmt: skip
settings_ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@cache
def _sample_bytes(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


@cache
def _sample_data(name: str) -> Any:
    return load_plain_pickle(SAMPLES / name)


def _check(path: Path) -> None:
    run_nsysfrag(["analyze", path, "--json", "-"], inputs=[path])


@settings_
@given(
    name=st.sampled_from(NAMES),
    edits=st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 2**31), st.binary(min_size=1, max_size=24)),
        min_size=1,
        max_size=6,
    ),
)
def test_byte_mutants_keep_the_contract(
    tmp_path: Path, name: str, edits: list[tuple[int, int, bytes]]
) -> None:
    data = bytearray(_sample_bytes(name))
    for kind, where, payload in edits:
        if not data:
            break
        i = where % len(data)
        if kind == 0:  # flip bits
            data[i] ^= payload[0] or 1
        elif kind == 1:  # delete a run
            del data[i : i + len(payload)]
        elif kind == 2:  # insert bytes
            data[i:i] = payload
        elif kind == 3:  # repeat a run
            data[i:i] = data[i : i + 8 * len(payload)]
        else:  # truncate
            del data[i:]
    path = tmp_path / "mutant.pickle"
    path.write_bytes(bytes(data))
    _check(path)


@st.composite
def _structure_edits(draw: st.DrawFn) -> tuple[str, list[tuple[list[int], int, Any]]]:
    name = draw(st.sampled_from(NAMES))
    edits = [
        (
            draw(st.lists(st.integers(0, 2**20), min_size=1, max_size=5)),
            draw(st.integers(0, 2)),
            draw(st.sampled_from(HOSTILE_VALUES)),
        )
        for _ in range(draw(st.integers(1, 4)))
    ]
    return name, edits


def _mutate(data: Any, path: list[int], action: int, value: Any) -> tuple[Any, Any]:
    """Walk ``path`` (indices into the keys or items met), copying each container on the way,
    then drop (0), replace (1) or add (2) one item of the last one. Returns the new root and,
    when ``value`` is DEEP, the container to hold the deep list (under key "\\x00deep")."""
    root = copy.copy(data)
    node = root
    for step in path[:-1]:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = keys[step % len(keys)]
        child = node[key]
        if not isinstance(child, (dict, list)):
            break
        node[key] = child = copy.copy(child)
        node = child
    keys = list(node) if isinstance(node, dict) else list(range(len(node)))
    deep_holder = None
    if value is DEEP:
        deep_holder = {}
        value = deep_holder
    if action == 0 and keys:
        del node[keys[path[-1] % len(keys)]]
    elif action == 1 and keys:
        node[keys[path[-1] % len(keys)]] = value
    elif isinstance(node, dict):
        node[
            ["action", "addr", "size", "frames", "state", "blocks", "time_us", "stream"][
                path[-1] % 8
            ]
        ] = value
    else:
        node.insert(path[-1] % (len(node) + 1), value)
    return root, deep_holder


@settings_
@given(case=_structure_edits())
def test_structure_mutants_keep_the_contract(
    tmp_path: Path, case: tuple[str, list[tuple[list[int], int, Any]]]
) -> None:
    name, edits = case
    data = _sample_data(name)
    holder = None
    for path, action, value in edits:
        data, deep = _mutate(data, path, action, value)
        holder = deep or holder
    path = tmp_path / "mutant.pickle"
    if holder is not None:
        path.write_bytes(with_deep_value(holder, "\x00deep", 100_000, data))
    else:
        path.write_bytes(pickle.dumps(data, protocol=4))
    _check(path)


SCAN_FUZZ_CASES = int(os.environ.get("NSYSFRAG_SCAN_FUZZ_CASES", "300"))


def test_the_opcode_pass_agrees_with_itself_and_with_pickle_on_mutants() -> None:
    """tests/hostile/pickle_scan_fuzz.py in a child: compiled and interpreted find the same,
    and where the pass calls a pickle whole, pickle's own reader ends it at the same byte;
    NSYSFRAG_SCAN_FUZZ_CASES=100000 for a local campaign."""
    from tests.hostile.child_fuzz import fuzz_in_child

    small = sorted(SAMPLES.glob("torch_*_snapshot.pickle"))
    counts = fuzz_in_child(
        "tests.hostile.pickle_scan_fuzz", [*small, SAMPLES / "training_snapshot.pickle"], SCAN_FUZZ_CASES, seed=3
    )
    assert counts.get("ok", 0) > 0 and counts.get("left", 0) > 0, counts

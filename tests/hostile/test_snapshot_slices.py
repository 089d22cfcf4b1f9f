"""A trace unpickled in slices (``columns.TraceSlices``) against the whole read, on mutated
pickles: the same columns, or the same one-line error, whatever the bytes. Slices of 300
entries make the sample's trace cross many slice ends. CI runs a few examples;
``NSYSFRAG_FUZZ_EXAMPLES=2000`` runs a long local campaign."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsysfrag.errors import InputError
from nsysfrag.inputs.torch_snapshot import columns as sc
from tests.conftest import SAMPLES
from tests.hostile.pickle_scan_fuzz import mutate

EXAMPLES = int(os.environ.get("NSYSFRAG_FUZZ_EXAMPLES", "6"))
SAMPLE = SAMPLES / "training_snapshot.pickle"


def _digest(columns: sc.SnapshotColumns) -> str:
    """Everything the model reads from the columns (stacks by their sites: ids are numbered
    by the frames' addresses)."""
    h = hashlib.sha256()
    names = np.asarray(columns.site_names, dtype=object)
    for device, history in sorted(columns.histories.items()):
        h.update(str(device).encode())
        for name in ("action", "address", "size", "stream", "time_us", "oom_rows", "oom_device_free"):
            h.update(getattr(history, name).tobytes())
        h.update("\0".join(names[columns.stack_site[history.stack]].tolist()).encode())
        h.update(repr(history.oom_frames).encode())
    h.update(repr((columns.layout, columns.segments, columns.allocator_conf, columns.max_split_size,
                   columns.roundup_power2_divisions, columns.expandable_segments,
                   sorted(columns.unknown_actions.items()), columns.skipped_entries,
                   columns.time_origin_us, columns.warnings)).encode())  # fmt: skip
    return h.hexdigest()


def _read(path: Path, monkeypatch: pytest.MonkeyPatch, sliced: bool) -> tuple[str, str]:
    with monkeypatch.context() as patched:
        patched.setattr(sc, "CHUNK", 300)
        if not sliced:
            patched.setattr(sc.TraceSlices, "items", 1 << 62)
        try:
            return "columns", _digest(sc.read_snapshot_columns(path))
        except InputError as err:
            return "error", str(err)


def test_the_unmutated_sample_is_sliced_and_read_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[bool] = []
    placed = sc.TraceSlices.placed

    def noted(self: sc.TraceSlices, data: Any) -> bool:
        answers.append(placed(self, data))
        return answers[-1]

    monkeypatch.setattr(sc.TraceSlices, "placed", noted)
    whole = _read(SAMPLE, monkeypatch, sliced=False)
    assert answers == [] and whole[0] == "columns"
    assert _read(SAMPLE, monkeypatch, sliced=True) == whole and answers == [True]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1))
def test_byte_mutants_read_in_slices_as_whole(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / f"mutant_{seed}.pickle"
    path.write_bytes(mutate(random.Random(seed), SAMPLE.read_bytes()))
    assert _read(path, monkeypatch, sliced=True) == _read(path, monkeypatch, sliced=False)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1))
def test_trace_bytes_overwritten_read_in_slices_as_whole(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few bytes of the trace overwritten: most such pickles still unpickle (a value, a
    key, a memo index changed), so that the slices meet what they must refuse to stand for."""
    rng = random.Random(seed)
    data = bytearray(SAMPLE.read_bytes())
    for _ in range(rng.randint(1, 3)):
        data[rng.randrange(len(data) // 10, len(data) - 100)] = rng.randrange(256)
    path = tmp_path / f"overwritten_{seed}.pickle"
    path.write_bytes(bytes(data))
    assert _read(path, monkeypatch, sliced=True) == _read(path, monkeypatch, sliced=False)

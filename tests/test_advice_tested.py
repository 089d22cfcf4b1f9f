"""Advice that was tested: ``analyze`` names a PYTORCH_CUDA_ALLOC_CONF setting only when
``whatif`` evaluates it by default on that input, never one the run already uses, never one
that conflicts with its settings (max_split_size_mb under expandable segments)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nsysfrag.allocators import TorchConfig
from nsysfrag.analysis import analyze
from nsysfrag.analysis.advice import SITES_NAMED, advise, named_settings, out_of_capacity
from nsysfrag.analysis.metrics import format_bytes
from nsysfrag.analysis.results import CAPACITY
from nsysfrag.inputs import open_input
from nsysfrag.models.tried_settings import RunSettings, max_split_sizes, tried_settings
from nsysfrag.whatif import whatif
from tests.conftest import SNAPSHOT_INPUTS

MiB = 1 << 20
KNOBS = ("expandable_segments", "max_split_size_mb", "garbage_collection_threshold",
         "roundup_power2_divisions", "backend")  # fmt: skip
# A setting as advice writes it: `expandable_segments:True`, `max_split_size_mb:32 or 64`.
NAMED = re.compile(r"\b(" + "|".join(KNOBS) + r"):([\w.]+(?: or [\w.]+)*)")


def _named_in(lines: list[str]) -> set[tuple[str, str]]:
    found = set()
    for line in lines:
        for key, values in NAMED.findall(line):
            found |= {(key, v) for v in values.split(" or ")}
    return found


@pytest.mark.parametrize("path", SNAPSHOT_INPUTS, ids=lambda p: p.name[:50])
def test_advice_names_only_settings_whatif_evaluates_on_that_input(path: Path) -> None:
    analysis = analyze(open_input(path))
    report = whatif(path)
    by_device = {s.device: s for s in report.spaces}
    for space in analysis.spaces:
        named = _named_in(advise(space))
        assert named == {(x.key, x.value) for x in named_settings(space)}, path.name
        if not named:
            continue
        compared = by_device[space.device]
        base = compared.baseline
        assert base is not None
        config = base.policy.options if isinstance(base.policy.options, TorchConfig) else TorchConfig()
        evaluated = {o.policy.options for o in compared.outcomes if o.policy.family == "torch"}
        for key, value in named:
            # never a setting the run already uses, never max_split_size_mb under expandable segments
            assert f"{key}:{value}" not in config.conf_string(), (path.name, key)
            if key == "max_split_size_mb":
                assert not config.expandable_segments, path.name
            # whatif replayed exactly the run's settings with this one added
            wanted = TorchConfig.parse(",".join(filter(None, (config.conf_string(), f"{key}:{value}"))))
            assert wanted in evaluated, (path.name, key, value)


def test_the_default_whatif_set_covers_every_knob_advice_can_name() -> None:
    sizes = [8 * MiB, 40 * MiB, 40 * MiB, 300 * MiB, 300 * MiB, 300 * MiB, 2 * MiB]
    keys = {x.key for x in tried_settings(RunSettings(), sizes)}  # type: ignore[arg-type]
    assert keys == {"expandable_segments", "max_split_size_mb", "garbage_collection_threshold",
                    "roundup_power2_divisions"}  # fmt: skip
    # cudaMallocAsync is its own policy, in every default run
    from nsysfrag.allocators import DEFAULT_POLICIES

    assert "cuda-async" in DEFAULT_POLICIES


def test_what_the_run_set_or_conflicts_with_is_not_tried() -> None:
    sizes = [300 * MiB]
    expandable = tried_settings(RunSettings(expandable_segments=True), sizes)  # type: ignore[arg-type]
    assert {x.key for x in expandable} == {"garbage_collection_threshold", "roundup_power2_divisions"}
    split = tried_settings(RunSettings(max_split_size_set=True), sizes)  # type: ignore[arg-type]
    assert "max_split_size_mb" not in {x.key for x in split}
    everything = RunSettings(True, True, True, True)
    assert tried_settings(everything, sizes) == ()  # type: ignore[arg-type]


def test_max_split_sizes_come_from_the_inputs_own_large_blocks() -> None:
    # most bytes in 256-512 MiB, then 32-64 MiB; nothing above 20 MiB: nothing to try
    sizes = [300 * MiB] * 3 + [40 * MiB] * 4 + [100 * MiB] + [MiB] * 100
    assert max_split_sizes(sizes) == [32, 256]  # type: ignore[arg-type]
    assert max_split_sizes([MiB, 20 * MiB]) == []  # type: ignore[arg-type]
    assert max_split_sizes([25 * MiB]) == [21]  # type: ignore[arg-type]  # PyTorch's minimum


@pytest.mark.parametrize("path", SNAPSHOT_INPUTS, ids=lambda p: p.name[:50])
def test_advice_on_an_out_of_capacity_failure_is_about_capacity(path: Path) -> None:
    # main: inference_snapshot's capacity OOM drew "try expandable_segments:True, or
    # max_split_size_mb:256 or 1024", and a genuine capacity OOM "free in order" advice.
    for space in analyze(open_input(path)).spaces:
        if not out_of_capacity(space):
            continue
        failed = next(f for f in space.ooms if f.verdict == CAPACITY)
        for lines in (advise(space), advise(space, failures=False)):
            text = " ".join(lines)
            assert not _named_in(lines) and "PYTORCH_CUDA_ALLOC_CONF" not in text, text
            assert "outlive" not in text and "free in order" not in text, text
            (said,) = [line for line in lines if "neither reordering frees" in line]
            assert failed.site is None or f"'{failed.site}'" in said
            assert failed.requested_bytes is None or format_bytes(failed.requested_bytes) in said
            assert space.memory_peak_sites is None or all(
                f"'{x.site}'" in said for x in space.memory_peak_sites.live[:SITES_NAMED]
            )


def test_capacity_advice_is_tested_on_a_sample() -> None:
    # The test above skips inputs with no capacity failure: the samples must give it one.
    assert any(
        out_of_capacity(s) for p in SNAPSHOT_INPUTS if "capacity" in p.name for s in analyze(open_input(p)).spaces
    )

"""whatif tells analyze's story: the baseline row, on every sample and genuine input, has
analyze's counts, capacity, clock and most-requested bytes, and — where the replay starts where
analyze's model starts — analyze's very figures; every policy's figures are in analyze's state
model (ratios in [0, 1], the largest usable request never above what is free, releasable memory
what the policy's own release gives back)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from click.testing import CliRunner

from nsysfrag.allocators import DEFAULT_POLICIES, parse_policy
from nsysfrag.allocators.base import ALLOC, EMPTY_CACHE, FREE, MiB, RequestStream
from nsysfrag.analysis import SpaceAnalysis, analyze
from nsysfrag.cli import cli
from nsysfrag.inputs import InputOptions, open_input
from nsysfrag.whatif import SpaceComparison, whatif
from nsysfrag.whatif.states import device_states
from tests.conftest import SAMPLES, SNAPSHOT_INPUTS, fuzz_examples

NSYS_SAMPLES = sorted(SAMPLES.glob("*.sqlite"))
# Policies a what-if of each input replays here: the baseline is added to them, so the one
# cheap reference keeps the test to the baseline's replay.
ONLY = ("best-fit",)
EXACT = 1e-9  # the same figures from the same code: equal but for float rounding


def _pairs(path: Path) -> list[tuple[SpaceComparison, SpaceAnalysis]]:
    """Each what-if space of ``path`` with analyze's space of the same device (and process)."""
    report = whatif(path, ONLY)
    analysis = analyze(open_input(path, InputOptions()))
    pairs = []
    for s in report.spaces:
        (a,) = [a for a in analysis.spaces
                if a.device == s.device and (s.pid is None or a.pid == s.pid)]  # fmt: skip
        assert s.first_time_ns == analysis.source.first_event_ns, s.label
        pairs.append((s, a))
    return pairs


def _same_story(s: SpaceComparison, a: SpaceAnalysis) -> None:
    """What the baseline row and analyze say alike on any input."""
    where = f"{s.label}"
    assert s.capacity_bytes == a.capacity_bytes, where
    counts = (s.counts.allocations, s.counts.frees, s.counts.failed_allocations)
    assert counts == (a.counts.allocations, a.counts.frees, a.counts.failed_allocations), where
    assert s.peak_requested_bytes == a.max_live_bytes, where
    for o in s.outcomes:
        for state in (o.peak, o.final):
            assert 0 <= state.global_frag <= 1 and 0 <= state.local_frag <= 1, (where, o.name)
            assert state.largest_free_bytes <= state.free_bytes, (where, o.name)
        assert 0 <= o.max_global_frag <= 1 and 0 <= o.max_local_frag <= 1, (where, o.name)


def _starts_where_analyze_starts(s: SpaceComparison) -> bool:
    """The replay's requests are the recorded ones only (nothing live when the window opens):
    the baseline then starts from analyze's own starting state."""
    c = s.counts
    return s.requests == c.allocations + c.failed_allocations and s.frees == c.frees + (
        c.failed_allocations
    )


@pytest.mark.parametrize("path", SNAPSHOT_INPUTS, ids=lambda p: p.name[:48])
def test_the_baseline_row_is_analyzes_figures(path: Path) -> None:
    for s, a in _pairs(path):
        _same_story(s, a)
        base = s.baseline
        assert base is not None
        where = f"{path.name} {s.label}"
        # peak reserved: the simulated baseline against analyze's, within the model's error
        assert a.memory_peak is not None and a.memory_peak.pool is not None
        recorded = a.memory_peak.pool.reserved_bytes
        e = s.recommendation.model_error
        assert e is not None, where
        assert abs(base.peak_reserved_bytes - recorded) <= e * recorded + 1, where
        if not _starts_where_analyze_starts(s):
            continue  # its window opens on live blocks, which every policy places afresh
        # the same replay from the same start: analyze's figures, exactly
        assert base.max_global_frag == pytest.approx(a.max_global_frag, abs=EXACT), where
        assert base.max_local_frag == pytest.approx(a.max_local_frag, abs=EXACT), where
        # With expandable segments analyze counts one free block more at the most (a free range
        # split where a mapping ended: the allocator's own table has merged it); known, small.
        slack = 1 if a.snapshot is not None and a.snapshot.facts.expandable_segments else 0
        assert abs(base.max_free_blocks - a.max_free_blocks) <= slack, where
        assert base.final.pool == a.final.pool, where
        if a.max_global_frag > 0:  # else every moment is a peak: analyze's first is before any
            assert base.peak.time_ns == a.peak.time_ns, where
            assert base.peak.pool == a.peak.pool, where
        if a.ooms and base.simulated_ooms:  # on analyze's clock, in the JSON too
            assert base.first_oom_time_ns == a.ooms[0].state.time_ns, where


@pytest.mark.parametrize("path", NSYS_SAMPLES, ids=lambda p: p.name)
def test_an_nsys_whatif_counts_and_times_as_analyze(path: Path) -> None:
    # The baseline of an nsys trace is replayed in another model than analyze's observed page
    # model, so only what does not depend on the model is held here.
    for s, a in _pairs(path):
        _same_story(s, a)


def test_most_requested_at_once_does_not_move_with_the_capacity() -> None:
    path = SAMPLES / "torch_fragmentation_snapshot.pickle"
    roomy = whatif(path, ONLY).spaces[0]
    tight = whatif(path, ONLY, capacity=600 * MiB).spaces[0]
    assert tight.baseline is not None and tight.baseline.simulated_ooms > 0
    assert roomy.peak_requested_bytes == tight.peak_requested_bytes == 1024 * MiB


def test_buddy_reports_no_impossible_figure_on_the_oom_snapshot() -> None:
    # buddy said -0.1 % global fragmentation with 0 free and a 1 MiB largest free block here
    (s,) = whatif(SAMPLES / "torch_fragmentation_snapshot.pickle", ("buddy",)).spaces
    buddy = next(o for o in s.outcomes if o.name == "buddy")
    for state in (buddy.peak, buddy.final):
        assert state.pool is not None
        assert state.pool.largest_block_bytes <= state.free_bytes - state.pool.device_free_bytes
        assert 0 <= state.global_frag <= 1 and state.largest_free_bytes <= state.free_bytes
    assert 0 <= buddy.max_global_frag <= 1


@pytest.mark.parametrize("columns", [80, 200])
def test_the_footnote_defines_the_columns_shown_and_no_other(columns: int) -> None:
    path = SAMPLES / "torch_fragmentation_snapshot.pickle"
    result = CliRunner().invoke(cli, ["whatif", str(path)], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#  policy"))
    table = "\n".join(lines[head - 1 : head + 1])  # the two heading lines
    end = next(i for i, line in enumerate(lines) if line.startswith("buddy:"))
    note = " ".join(" ".join(lines[head + 14 : end]).split())
    # each column the table shows is defined, and each definition is of a shown column
    for heading, term in (("R/U", "R/U at peak:"), ("1st OOM", "1st OOM:"),
                          ("local", "local frag"), ("health", "health:"),
                          ("blocks", "free blocks"), ("OOMs", "sim. OOMs:")):  # fmt: skip
        assert (heading in table) == (term in note), (columns, heading, note)
    assert ("R/U" in table) == (columns == 200) and "sim. OOMs:" in note


# ----------------------------------------------------------------- every policy, any stream


@st.composite
def streams(draw: st.DrawFn) -> RequestStream:
    """Allocations with random sizes and lifetimes, two streams, and empty_cache() calls."""
    n = draw(st.integers(1, 60))
    sizes = draw(st.lists(st.one_of(st.integers(1, 2 * MiB), st.integers(2 * MiB, 40 * MiB)),
                          min_size=n, max_size=n))  # fmt: skip
    lives = draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
    empties = draw(st.lists(st.integers(0, 2 * n + 14), max_size=4))
    events = [(2 * i, 1, ALLOC, i) for i in range(n)]
    events += [(2 * i + 2 * life + 1, 1, FREE, i) for i, life in enumerate(lives)]
    events += [(t, 0, EMPTY_CACHE, 0) for t in empties]  # before what happens at its time
    events.sort()
    time, _, kind, request = (np.array(c) for c in zip(*events, strict=True))
    stream = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    return RequestStream.build(kind, request, time, sizes, stream)


POLICIES = (*DEFAULT_POLICIES, "torch:expandable_segments=True")


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=fuzz_examples(), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(stream=streams(), capacity_mib=st.integers(8, 400))
def test_every_policy_reports_analyzes_state(
    policy: str, stream: RequestStream, capacity_mib: int
) -> None:
    capacity = capacity_mib * MiB
    r = parse_policy(policy).simulate(stream, capacity)
    states, pool = device_states(r, capacity)
    free, largest = states.free_bytes, states.largest_free_bytes
    # what the policy holds: free inside it, releasable part of that, the largest block too
    assert (r.reserved_bytes <= capacity).all() and (r.free_bytes >= 0).all()
    assert (0 <= r.releasable_bytes).all() and (r.releasable_bytes <= r.free_bytes).all()
    assert (r.largest_free_bytes <= r.free_bytes).all()
    # analyze's figures of it: the largest usable request never above what is free, every
    # ratio in [0, 1], stranded never negative
    assert (largest <= free).all()
    g = (free - largest) / capacity
    local = np.where(free > 0, 1 - largest / np.maximum(free, 1), 0.0)
    assert ((0 <= g) & (g <= 1)).all() and ((0 <= local) & (local <= 1)).all()
    assert (pool.reserved_bytes - pool.active_bytes - pool.releasable_bytes >= 0).all()
    # releasable is what the policy's own release returns: at each empty_cache() the reserved
    # bytes fall by exactly what was releasable just before, and nothing releasable is left
    for i in np.flatnonzero(stream.kind == EMPTY_CACHE):
        before_reserved = int(r.reserved_bytes[i - 1]) if i else 0
        before_releasable = int(r.releasable_bytes[i - 1]) if i else 0
        assert before_reserved - int(r.reserved_bytes[i]) == before_releasable, (policy, i)
        assert int(r.releasable_bytes[i]) == 0, (policy, i)


def test_analyzes_advice_names_what_whatif_recommends_for_a_run_that_died() -> None:
    path = SAMPLES / "torch_fragmentation_snapshot.pickle"
    (s,) = whatif(path).spaces
    rec = s.recommendation
    assert rec.reason == "fewer_ooms" and rec.chosen is not None
    (a,) = analyze(open_input(path, InputOptions())).spaces
    from nsysfrag.analysis.advice import advise

    advice = " ".join(advise(a))
    assert rec.chosen.alloc_conf is not None and rec.chosen.alloc_conf in advice
    assert "Keep" not in advice and "keep its settings" not in advice

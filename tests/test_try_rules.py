"""The rules of ``record --try`` that need no program: what a --try may say, how it merges
into the program's PYTORCH_CUDA_ALLOC_CONF and which ``whatif`` policy predicts it, and the
verdict rule (a gain must clear the run-to-run spread with --repeat, else the what-if's error
on the baseline, and 1 % at least)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsysfrag.errors import InputError
from nsysfrag.trial.compare import Measured, round_document
from nsysfrag.trial.measure import RankFigures
from nsysfrag.trial.predict import Prediction, Predictions
from nsysfrag.trial.rounds import DURATION, EXIT, Round, RunOutcome, RunPlan
from nsysfrag.trial.settings import (
    TrySetting,
    merged,
    parse_tries,
    parse_try,
    program_conf,
    settings_from_conf,
)

ES = TrySetting("expandable_segments", "True")
MiB = 1 << 20


def test_a_try_is_one_option_pytorch_takes() -> None:
    assert parse_try(" expandable_segments : True ") == ES
    assert parse_try("roundup_power2_divisions:[256:1,>:4]").value == "[256:1,>:4]"
    for bad, said in [
        ("max_split_size_mb:20", "above 20"),
        ("roundup_power2_divisions:3", "a power of 2"),
        ("backend:cuda", "native or cudaMallocAsync"),
        ("expandable_segments=True", "KEY:VALUE"),
    ]:
        with pytest.raises(InputError, match=said):
            parse_try(bad)
    with pytest.raises(InputError, match="set the same key"):
        parse_tries(["max_split_size_mb:128", "max_split_size_mb:256"])
    assert parse_tries(["auto", "expandable_segments:True"]) == ([ES], True)


def test_a_setting_merges_into_the_programs_conf_and_names_its_policy() -> None:
    assert merged("garbage_collection_threshold:0.6", ES) == "garbage_collection_threshold:0.6,expandable_segments:True"
    assert merged("", ES) == "expandable_segments:True" and merged("x:1", None) == "x:1"
    assert ES.policy("") == "torch:expandable_segments=True"
    assert ES.policy("garbage_collection_threshold:0.6") == (
        "torch:garbage_collection_threshold=0.6,expandable_segments=True"
    )
    assert TrySetting("backend", "cudaMallocAsync").policy("") == "cuda-async"
    assert ES.folder == "expandable_segments=True"
    assert TrySetting("roundup_power2_divisions", "[256:1,>:4]").folder == "roundup_power2_divisions=_256_1___4_"
    # PyTorch 2.9 reads PYTORCH_ALLOC_CONF first: that is the one the program's allocator sees.
    assert program_conf({"PYTORCH_ALLOC_CONF": "a:1", "PYTORCH_CUDA_ALLOC_CONF": "b:2"}) == ("PYTORCH_ALLOC_CONF", "a:1")
    assert program_conf({}) == ("PYTORCH_CUDA_ALLOC_CONF", "")


def test_auto_adds_only_what_the_candidate_changes() -> None:
    own = "garbage_collection_threshold:0.6"
    assert settings_from_conf("garbage_collection_threshold:0.6,expandable_segments:True", own) == [ES]
    assert settings_from_conf("backend:cudaMallocAsync", "") == [TrySetting("backend", "cudaMallocAsync")]
    assert settings_from_conf(None, own) == []


def _measured(setting: TrySetting | None, k: int, peak: int, ooms: int = 0, code: int = 0) -> Measured:
    plan = RunPlan(setting, k, Path(f"/round/{setting.folder if setting else 'baseline'}.r{k}"))
    outcome = RunOutcome(plan, "PYTORCH_CUDA_ALLOC_CONF", str(setting or ""), code, EXIT, 1.0)
    return Measured(outcome, [RankFigures(0, "rank0", peak, peak // 2, ooms, 0, 0.1, 1.0, None, 0, Path("final.pickle"))])


def _verdict(runs: list[Measured], repeats: int, predictions: dict[int, Predictions] | None = None) -> dict:
    doc = round_document(["python", "train.py"], Round(), runs, predictions or {},
                         {str(ES): "torch:expandable_segments=True"}, None, repeats, {})  # fmt: skip
    (setting,) = doc["settings"]
    return setting


def test_with_repeat_a_gain_must_clear_the_run_to_run_spread() -> None:
    base = [_measured(None, 1, 100 * MiB), _measured(None, 2, 110 * MiB)]
    within = _verdict([*base, _measured(ES, 1, 95 * MiB), _measured(ES, 2, 97 * MiB)], 2)
    assert within["spread"] == pytest.approx(10 / 105) and within["bar_basis"] == "spread"
    assert within["gain"] == pytest.approx((105 - 96) / 105)
    assert not within["kept"] and within["why"] == "within_bar"
    beyond = _verdict([*base, _measured(ES, 1, 50 * MiB), _measured(ES, 2, 52 * MiB)], 2)
    assert beyond["kept"] and beyond["why"] == "gain"


def test_without_repeat_the_bar_is_the_whatifs_error_on_the_baseline() -> None:
    # The what-if replayed the baseline at 120 MiB where the run measured 100 MiB: 20 % off.
    predictions = {0: Predictions(0, Prediction("torch", 120 * MiB, 0),
                                  {"torch:expandable_segments=True": Prediction("p", 80 * MiB, 0)})}  # fmt: skip
    small = _verdict([_measured(None, 1, 100 * MiB), _measured(ES, 1, 85 * MiB)], 1, predictions)
    assert small["bar"] == pytest.approx(0.2) and small["bar_basis"] == "whatif_error"
    assert not small["kept"]
    assert small["whatif_error"] == pytest.approx((80 - 85) / 85)
    large = _verdict([_measured(None, 1, 100 * MiB), _measured(ES, 1, 70 * MiB)], 1, predictions)
    assert large["kept"]
    unweighed = _verdict([_measured(None, 1, 100 * MiB), _measured(ES, 1, 70 * MiB)], 1)
    assert not unweighed["kept"] and unweighed["why"] == "no_bar"


def test_out_of_memory_errors_decide_before_memory() -> None:
    fewer = _verdict([_measured(None, 1, 100 * MiB, ooms=2, code=1), _measured(ES, 1, 120 * MiB)], 1)
    assert fewer["kept"] and fewer["why"] == "fewer_ooms"
    more = _verdict([_measured(None, 1, 100 * MiB), _measured(ES, 1, 50 * MiB, ooms=1, code=1)], 1)
    assert not more["kept"] and more["why"] == "more_ooms"


def test_a_run_ended_by_duration_counts_as_finished() -> None:
    base = _measured(None, 1, 100 * MiB)
    ended = _measured(ES, 1, 50 * MiB, code=143)
    ended = Measured(RunOutcome(ended.outcome.plan, "PYTORCH_CUDA_ALLOC_CONF", "", 143, DURATION, 5.0), ended.ranks)
    base = Measured(RunOutcome(base.outcome.plan, "PYTORCH_CUDA_ALLOC_CONF", "", 143, DURATION, 5.0), base.ranks)
    predictions = {0: Predictions(0, Prediction("torch", 100 * MiB, 0), {})}
    assert _verdict([base, ended], 1, predictions)["kept"]


def test_a_runs_figures_are_read_as_hostile_input(tmp_path: Path) -> None:
    """A damaged facts file, timeline or steps file gives missing figures, never an error or an
    invented one: only the lines that check out count."""
    import json

    from nsysfrag.trial.measure import measure_run

    rank = tmp_path / "rank0"
    rank.mkdir()
    (rank / "final.pickle").write_bytes(b"not a pickle")
    (rank / "final.device.json").write_text("{not json")
    (rank / "timeline.jsonl").write_text("\n".join([
        json.dumps({"time_unix_ns": 1, "reserved_bytes_peak": 5 * MiB, "allocated_bytes_peak": 2 * MiB}),
        json.dumps({"time_unix_ns": 2, "reserved_bytes_peak": True, "alloc_retries": -3}),
        json.dumps({"time_unix_ns": 3, "reserved_bytes_peak": 7 * MiB, "alloc_retries": 2}),
        json.dumps({"event": "oom", "time_unix_ns": 4}),
        '{"time_unix_ns": 5, "reserved_bytes_pe',  # a rank killed mid-line
    ]))  # fmt: skip
    (rank / "steps.jsonl").write_text('{"step": 1, "time_unix_ns": 0}\n{"step": "x"}\n'
                                      '{"step": 11, "time_unix_ns": 2000000000}\n')  # fmt: skip
    (figures,) = measure_run(tmp_path, 1)
    assert (figures.peak_reserved_bytes, figures.peak_allocated_bytes) == (7 * MiB, 2 * MiB)
    assert (figures.alloc_retries, figures.ooms) == (2, 1)
    assert figures.steps == 11 and figures.step_s == pytest.approx(0.2)
    assert figures.wall_s is None  # no readable final facts, no CUDA start
    assert figures.document is None and figures.analysis_error  # the snapshot is refused
    assert figures.frag_at_peak is None

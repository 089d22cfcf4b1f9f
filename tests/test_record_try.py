"""``nsysfrag record --try`` end to end on the fake torch (tests/fake_torch), whose allocator
reacts to each PYTORCH_CUDA_ALLOC_CONF setting as PyTorch's does
(tests/fake_torch/torch/_alloc_conf.py): real processes, real record folders, no mocks.

The planted workload (tests/record_workloads/settings.py, ``growing``) asks for one activation
a step, 10 MiB larger each step. Under PyTorch's native rules no cached segment fits a larger
request, so every step adds a segment of its own: peak reserved is the sum of the requests.
Expandable segments grow one mapped range in 20 MiB pages instead: peak reserved is the largest
request rounded up to a page. The round must measure both and keep expandable_segments:True.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.record_helpers import WORKLOADS, Run, fake_env, record

MiB = 1 << 20
WORKLOAD = WORKLOADS / "settings.py"
STEPS = 20
STEP_S = 0.05
REQUESTS = [(100 + 10 * step) * MiB for step in range(STEPS)]  # the workload's activations
PAGE = 20 * MiB  # an expandable segment's large-pool page


def python() -> str:
    import sys

    return sys.executable


def run_round(out: Path, *args: str, **env: str) -> Run:
    return record(
        out, *args, "--", python(), str(WORKLOAD),
        env=fake_env(**{"NSYSFRAG_KERNELS": "interpreted", "STEPS": str(STEPS), "STEP_S": str(STEP_S), **env}),
        timeout=300,
    )  # fmt: skip


def final_stats(folder: Path) -> dict[str, Any]:
    """The memory_stats() the fake's allocator wrote beside the run's final snapshot."""
    facts = json.loads((folder / "rank0" / "final.device.json").read_text())
    (device,) = [d for d in facts["devices"] if "memory_stats" in d]
    return device["memory_stats"]


def run_of(doc: dict[str, Any], setting: str) -> dict[str, Any]:
    return next(r for r in doc["runs"] if r["setting"] == setting)


@pytest.fixture(scope="module")
def growing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run, dict[str, Any], Path]:
    base = tmp_path_factory.mktemp("try")
    out, html = base / "round", base / "round.html"
    run = run_round(
        out, "--try", "expandable_segments:True", "--try", "max_split_size_mb:200",
        "--json", str(base / "round.json"), "--html", str(html),
    )  # fmt: skip
    return out, run, json.loads((base / "round.json").read_text()), html


def test_the_planted_workload_keeps_expandable_segments(growing: tuple[Path, Run, dict[str, Any], Path]) -> None:
    out, run, doc, _ = growing
    assert run.code == 0, run.err
    assert doc["schema"] == "nsysfrag-try/1"
    assert doc["verdict"]["keep"] == "expandable_segments:True"
    assert doc["verdict"]["line"].startswith("keep expandable_segments:True: peak reserved 3.81 GiB → 300.00 MiB")
    assert "verdict: keep expandable_segments:True" in run.out
    assert json.loads((out / "try.json").read_text()) == doc


def test_the_figures_are_the_ones_the_fake_measured(growing: tuple[Path, Run, dict[str, Any], Path]) -> None:
    out, _, doc, _ = growing
    expected = {
        "baseline": sum(-(-r // (2 * MiB)) * 2 * MiB for r in REQUESTS),  # a segment per request
        "expandable_segments:True": -(-max(REQUESTS) // PAGE) * PAGE,  # one range, whole pages
        "max_split_size_mb:200": sum(REQUESTS),  # oversize blocks are not reused for larger ones
    }
    for setting, peak in expected.items():
        run = run_of(doc, setting)
        stats = final_stats(out / run["folder"])
        (rank,) = run["ranks"]
        assert rank["peak_reserved_bytes"] == stats["reserved_bytes.all.peak"] == peak, setting
        assert rank["peak_allocated_bytes"] == stats["allocated_bytes.all.peak"] == max(REQUESTS)
        assert rank["ooms"] == stats["num_ooms"] == 0
        assert rank["alloc_retries"] == stats["num_alloc_retries"]
        assert run["job"]["peak_reserved_bytes"] == peak
        # monitor().step() every 5 steps: the time per step is at least the workload's sleep.
        assert rank["steps"] == STEPS and STEP_S <= rank["step_s"] < 10 * STEP_S
        assert 0.0 <= rank["frag_at_peak"] <= 1.0
    setting = next(s for s in doc["settings"] if s["setting"] == "expandable_segments:True")
    assert setting["gain"] == pytest.approx(1 - expected["expandable_segments:True"] / expected["baseline"])
    assert setting["kept"] and setting["why"] == "gain"


def test_each_run_is_a_record_of_its_own_with_the_setting_merged(
    growing: tuple[Path, Run, dict[str, Any], Path],
) -> None:
    out, _, doc, _ = growing
    assert [r["folder"] for r in doc["runs"]] == ["baseline", "expandable_segments=True", "max_split_size_mb=200"]
    for run in doc["runs"]:
        folder = out / run["folder"]
        assert (folder / "record.json").is_file() and (folder / "rank0" / "final.pickle").is_file()
        seen = json.loads((folder / "rank0" / "process.json").read_text())["allocator_env"]
        if run["setting"] == "baseline":
            assert "PYTORCH_CUDA_ALLOC_CONF" not in seen
        else:
            assert seen["PYTORCH_CUDA_ALLOC_CONF"] == run["setting"] == run["conf"]


def test_the_whatif_prediction_and_its_error_are_beside_each_run(
    growing: tuple[Path, Run, dict[str, Any], Path],
) -> None:
    _, _, doc, _ = growing
    for run in doc["runs"]:
        (rank,) = run["ranks"]
        predicted = rank["predicted"]
        assert predicted is not None, run["setting"]
        measured = rank["peak_reserved_bytes"]
        assert predicted["error"] == pytest.approx((predicted["peak_reserved_bytes"] - measured) / measured)
        assert run["job"]["whatif_error"] == pytest.approx(predicted["error"])
    assert run_of(doc, "expandable_segments:True")["ranks"][0]["predicted"]["policy"] == "torch:expandable_segments=True"
    assert doc["whatif_baseline_error"] == pytest.approx(abs(run_of(doc, "baseline")["job"]["whatif_error"]))


def test_the_html_page_shows_the_table_and_verdict(growing: tuple[Path, Run, dict[str, Any], Path]) -> None:
    _, _, doc, html = growing
    page = html.read_text()
    assert "verdict: keep expandable_segments:True" in page and "max_split_size_mb:200" in page
    assert "<script" not in page


def test_a_setting_that_runs_out_of_memory_is_a_row_not_a_crash(tmp_path: Path) -> None:
    # Five 1.1 GiB buffers fit the 8 GiB device; roundup_power2_divisions:2 makes each 1.5 GiB.
    run = run_round(tmp_path / "r", "--try", "roundup_power2_divisions:2", "--json", str(tmp_path / "r.json"),
                    WORKLOAD="rounding")  # fmt: skip
    assert run.code == 0, run.err
    doc = json.loads((tmp_path / "r.json").read_text())
    failed = run_of(doc, "roundup_power2_divisions:2")
    assert failed["exit_code"] == 1 and failed["ranks"][0]["ooms"] == 1
    assert run_of(doc, "baseline")["ranks"][0]["ooms"] == 0
    assert doc["verdict"]["keep"] is None
    assert "roundup_power2_divisions:2 ran out of memory (1 OOMs, the baseline 0)" in doc["verdict"]["line"]
    assert (tmp_path / "r" / "roundup_power2_divisions=2" / "rank0" / "oom-1.pickle").is_file()


def test_duration_ends_a_program_that_runs_forever(tmp_path: Path) -> None:
    started = time.monotonic()
    run = run_round(tmp_path / "r", "--duration", "3", "--try", "expandable_segments:True",
                    "--json", str(tmp_path / "r.json"), WORKLOAD="forever")  # fmt: skip
    assert run.code == 0, run.err
    assert time.monotonic() - started < 120
    doc = json.loads((tmp_path / "r.json").read_text())
    for r in doc["runs"]:
        assert r["ended"] == "duration" and r["exit_code"] == 128 + 15
        facts = json.loads((tmp_path / "r" / r["folder"] / "rank0" / "final.device.json").read_text())
        assert facts["reason"] == "SIGTERM"  # the recorder's own handler wrote the final snapshot
        assert r["ranks"][0]["steps"] >= 5
    assert doc["duration_s"] == 3


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--try", "expandable_segments:Maybe"], {}, "expandable_segments takes True or False"),
        (["--try", "not_a_knob:1"], {}, "not_a_knob is not an allocator setting nsysfrag can try"),
        (["--try", "expandable_segments"], {}, "write one PYTORCH_CUDA_ALLOC_CONF option as KEY:VALUE"),
        (["--try", "garbage_collection_threshold:1.5"], {}, "a fraction strictly between 0 and 1"),
        (["--try", "expandable_segments:True", "--duration", "0"], {}, "'--duration': 0.0 is not in the range x>0"),
        (["--duration", "5"], {}, "--duration and --repeat go with --try"),
        (["--try", "expandable_segments:True"], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
         "the program already sets expandable_segments:False (in $PYTORCH_CUDA_ALLOC_CONF)"),
        (["--try", "expandable_segments:True"], {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
         "PYTORCH_NO_CUDA_MEMORY_CACHING=1 turns the caching allocator off"),
        (["--try", "expandable_segments:True", "--record"], {}, "drop --record"),
    ],
)
def test_bad_input_is_one_line_and_nothing_runs(
    tmp_path: Path, args: list[str], env: dict[str, str], said: str
) -> None:
    out = tmp_path / "r"
    run = run_round(out, *args, **env)
    assert run.code == 2, run.err
    lines = run.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nsysfrag: error: ") and said in lines[0], run.err
    assert not out.exists()


def test_a_program_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "r"
    run = record(out, "--try", "expandable_segments:True", "--", str(tmp_path / "no-such-program"), env=fake_env())
    assert run.code == 2
    assert run.err.strip() == f"nsysfrag: error: {tmp_path / 'no-such-program'}: not an executable file; check the command after --"
    assert not out.exists()


def test_a_folder_holding_a_round_is_replaced_only_with_overwrite(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    run = run_round(mine, "--try", "expandable_segments:True")
    assert run.code == 2 and "holds no round of --try" in run.err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    out = tmp_path / "r"
    assert run_round(out, "--try", "expandable_segments:True", "-q", STEPS="3").code == 0
    again = run_round(out, "--try", "max_split_size_mb:200", "-q", STEPS="3")
    assert again.code == 2 and "already holds a round of --try; pass --overwrite" in again.err
    assert run_round(out, "--try", "max_split_size_mb:200", "-q", "--overwrite", STEPS="3").code == 0
    assert sorted(p.name for p in out.iterdir()) == ["baseline", "max_split_size_mb=200", "try.json"]




def test_a_setting_the_program_sets_itself_is_refused_and_one_it_replaces_is_not_kept(tmp_path: Path) -> None:
    # The program puts its own PYTORCH_CUDA_ALLOC_CONF in place before torch reads it: the
    # baseline shows it, so expandable_segments is refused; the other setting never reaches
    # the allocator (the program replaced the variable), so its run is not a measurement of it.
    run = run_round(tmp_path / "r", "--try", "expandable_segments:True", "--try", "roundup_power2_divisions:2",
                    "--json", str(tmp_path / "r.json"), PROGRAM_CONF="expandable_segments:False", STEPS="5")  # fmt: skip
    assert run.code == 0, run.err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["refused"] == [{"setting": "expandable_segments:True",
                               "reason": "the program sets expandable_segments:False itself"}]  # fmt: skip
    assert [r["setting"] for r in doc["runs"]] == ["baseline", "roundup_power2_divisions:2"]
    replaced = run_of(doc, "roundup_power2_divisions:2")
    assert replaced["overridden"] == "rank 0 saw PYTORCH_CUDA_ALLOC_CONF='expandable_segments:False'"
    (setting,) = doc["settings"]
    assert not setting["kept"] and setting["why"] == "overridden"
    assert doc["verdict"]["keep"] is None


def test_the_docs_show_a_round_this_test_makes(growing: tuple[Path, Run, dict[str, Any], Path]) -> None:
    """docs/record.md shows this module's round (a ```txt block: its ```text blocks are the
    record of tests/test_record_e2e.py's job): its lines after the table (the table's wall
    times and times per step differ from run to run) are the ones the round prints."""
    from tests.conftest import REPO

    _, run, _, _ = growing
    page = (REPO / "docs" / "record.md").read_text()
    shown = page.split("```txt\nnsysfrag record --try", 1)[1].split("```", 1)[0]

    def after_table(text: str) -> list[str]:
        lines = [ln.rstrip() for ln in text.splitlines()]
        start = next(i for i, ln in enumerate(lines) if ln.startswith("expandable_segments:True ·"))
        return [ln for ln in lines[start:] if ln]

    assert after_table(shown) == after_table(run.out)
    assert "verdict: keep expandable_segments:True" in shown


def test_a_sigterm_to_nsysfrag_stops_the_round_and_keeps_what_it_measured(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    out = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsysfrag", "record", "-o", str(out), "--try", "expandable_segments:True",
         "--json", str(tmp_path / "r.json"), "--", python(), str(WORKLOAD)],
        env=fake_env(NSYSFRAG_KERNELS="interpreted", WORKLOAD="forever", STEP_S=str(STEP_S)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    steps, deadline = out / "baseline" / "rank0" / "steps.jsonl", time.monotonic() + 60
    while time.monotonic() < deadline and not (steps.exists() and '"step":5' in steps.read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM received; the round stopped after 1 run" in err
    doc = json.loads((tmp_path / "r.json").read_text())
    (run,) = doc["runs"]
    assert doc["stopped"] and run["ended"] == "stopped" and run["ranks"][0]["steps"] >= 5
    assert not (out / "expandable_segments=True").exists()  # the next run never started


def test_fail_on_gates_are_checked_on_the_kept_settings_runs(tmp_path: Path) -> None:
    # Kept: expandable_segments:True, whose peak reserved is 5 steps' largest request rounded
    # up to whole 20 MiB pages (140 MiB); the baseline's (the sum, 600 MiB) is not gated.
    kept_peak = -(-max(REQUESTS[:5]) // PAGE) * PAGE
    run = run_round(tmp_path / "r", "-q", "--try", "expandable_segments:True",
                    "--fail-on", f"reserved_bytes_peak>{kept_peak - 1}",
                    "--fail-on", f"reserved_bytes_peak>{kept_peak}", STEPS="5")  # fmt: skip
    assert run.code == 1, run.err
    tripped = [ln for ln in run.err.splitlines() if "gate tripped" in ln]
    assert tripped == [
        f"nsysfrag: expandable_segments:True: gate tripped: rank 0: pid 0 device 0:"
        f" reserved_bytes_peak = {kept_peak} > {kept_peak - 1} (--fail-on"
        f" 'reserved_bytes_peak>{kept_peak - 1}')"
    ]
    assert run.out == ""  # -q


def test_a_job_of_two_ranks_has_a_row_per_rank_and_one_for_the_job(tmp_path: Path) -> None:
    from tests.record_helpers import LAUNCH

    out = tmp_path / "r"
    run = record(
        out, "--try", "expandable_segments:True", "--json", str(tmp_path / "r.json"),
        "--html", str(tmp_path / "r.html"), "--", python(), str(LAUNCH), str(WORKLOAD),
        env=fake_env(NSYSFRAG_KERNELS="interpreted", STEPS="5", STEP_S=str(STEP_S)), timeout=300,
    )  # fmt: skip
    assert run.code == 0, run.err
    doc = json.loads((tmp_path / "r.json").read_text())
    for r in doc["runs"]:
        assert [rank["rank"] for rank in r["ranks"]] == [0, 1]
        peaks = [final_stats_of(out / r["folder"], rank) for rank in (0, 1)]
        assert [rank["peak_reserved_bytes"] for rank in r["ranks"]] == peaks
        assert peaks[1] > peaks[0]  # rank 1 asks for 50 MiB more each step
        assert r["job"]["peak_reserved_bytes"] == max(peaks)
        assert r["job"]["predicted_peak_reserved_bytes"] == max(
            rank["predicted"]["peak_reserved_bytes"] for rank in r["ranks"]
        )
    rows = [ln for ln in run.out.splitlines() if ln.split()[:1] == ["baseline"] or " job " in ln]
    assert any(" job " in ln for ln in rows), run.out
    assert 'class="job"' in (tmp_path / "r.html").read_text()


def final_stats_of(folder: Path, rank: int) -> int:
    facts = json.loads((folder / f"rank{rank}" / "final.device.json").read_text())
    (device,) = [d for d in facts["devices"] if "memory_stats" in d]
    return int(device["memory_stats"]["reserved_bytes.all.peak"])


def test_auto_tries_what_whatif_recommends_on_the_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nsysfrag.whatif import whatif

    out = tmp_path / "r"
    run = run_round(out, "--try", "auto", "--json", str(tmp_path / "r.json"), STEPS="8")
    assert run.code == 0, run.err
    doc = json.loads((tmp_path / "r.json").read_text())
    monkeypatch.setenv("NSYSFRAG_KERNELS", "interpreted")  # a small input: no compiling
    report = whatif(out / "baseline" / "rank0" / "final.pickle")
    (space,) = report.spaces
    r = space.recommendation
    expected = [c.alloc_conf for c in (r.chosen, r.worth_trying) if c is not None and c.alloc_conf]
    assert r.chosen is not None and r.chosen.alloc_conf == "expandable_segments:True"
    assert [x["setting"] for x in doc["runs"]] == ["baseline", *expected]
    assert f"--try auto: whatif on the baseline's snapshots suggests {', '.join(expected)}" in doc["notes"]
    # The verdict keeps what the runs measured best; the fake's cudaMallocAsync caches nothing,
    # so where whatif also suggests it, it measures the least peak reserved of all.
    base_peak = doc["runs"][0]["job"]["peak_reserved_bytes"]
    tried = {x["setting"]: x["job"]["peak_reserved_bytes"] for x in doc["runs"][1:]}
    assert tried["expandable_segments:True"] < 0.99 * base_peak
    assert doc["verdict"]["keep"] == min(tried, key=lambda k: tried[k])

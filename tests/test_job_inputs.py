"""A job's inputs: files, folders, globs and nsys output names, and the rank of each."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nsysfrag.errors import InputError
from nsysfrag.job.inputs import is_job, job_inputs, rank_from_name


def _touch(folder: Path, *names: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / n for n in names]
    for p in paths:
        p.write_bytes(b"x")
    return paths


def _ranks(inputs: list) -> list[tuple[int, str]]:  # type: ignore[type-arg]
    return [(i.rank, i.path.name) for i in inputs]


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank3.sqlite", 3),
        ("rank_12.nsys-rep", 12),
        ("RANK-7.pickle", 7),
        ("job_node0_rank5_step2.sqlite", 5),  # "rank" wins over a later _N.
        ("snapshot_3.pickle", 3),
        ("report_14.nsys-rep", 14),
        ("3.sqlite", 3),
        ("llm__1.3b_snapshot.pickle", None),  # a version, not a rank
        ("v2025.3.2_uvm.sqlite", None),
        ("training_loop.sqlite", None),
        ("v2.sqlite", None),
    ],
)
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank


def test_names_give_ranks_and_inputs_sort_by_rank(tmp_path: Path) -> None:
    files = _touch(tmp_path, "rank10.sqlite", "rank2.sqlite", "rank0.sqlite")
    assert _ranks(job_inputs(files)) == [(0, "rank0.sqlite"), (2, "rank2.sqlite"), (10, "rank10.sqlite")]


def test_without_a_rank_in_the_name_the_order_given_decides(tmp_path: Path) -> None:
    b, a = _touch(tmp_path, "b.sqlite", "a.pickle")
    assert _ranks(job_inputs([b, a])) == [(0, "b.sqlite"), (1, "a.pickle")]


def test_a_folder_holds_traces_and_snapshots_and_a_report_stands_for_its_export(tmp_path: Path) -> None:
    _touch(tmp_path, "rank0.nsys-rep", "rank0.sqlite", "rank1.qdrep", "rank1.nsysfrag.sqlite",
           "snapshot_2.pickle", "rank3.sqlite", "notes.txt")  # fmt: skip
    (tmp_path / "sub").mkdir()
    inputs = job_inputs([tmp_path])
    assert _ranks(inputs) == [
        (0, "rank0.nsys-rep"), (1, "rank1.qdrep"), (2, "snapshot_2.pickle"), (3, "rank3.sqlite")
    ]  # fmt: skip


def test_a_glob_and_a_file_named_twice_are_one_input(tmp_path: Path) -> None:
    files = _touch(tmp_path, "rank0.sqlite", "rank1.sqlite", "other.txt")
    inputs = job_inputs([Path(tmp_path, "rank*.sqlite"), files[1]])
    assert _ranks(inputs) == [(0, "rank0.sqlite"), (1, "rank1.sqlite")]


def test_the_nsys_output_name_finds_every_rank(tmp_path: Path) -> None:
    _touch(tmp_path, "run_rank0.nsys-rep", "run_rank0.sqlite", "run_rank1.nsys-rep", "run_rank12.nsys-rep",
           "unrelated_rank3.nsys-rep")  # fmt: skip
    inputs = job_inputs([Path(tmp_path, "run_rank%q{OMPI_COMM_WORLD_RANK}")])
    assert _ranks(inputs) == [(0, "run_rank0.nsys-rep"), (1, "run_rank1.nsys-rep"), (12, "run_rank12.nsys-rep")]


def test_the_nsys_output_name_takes_the_rank_variable_among_several(tmp_path: Path) -> None:
    _touch(tmp_path, "n7_7.sqlite", "n7_1.sqlite", "n8_0.sqlite")
    inputs = job_inputs([Path(tmp_path, "n%q{NODE}_%q{SLURM_PROCID}.sqlite")])
    assert _ranks(inputs) == [(0, "n8_0.sqlite"), (1, "n7_1.sqlite"), (7, "n7_7.sqlite")]
    with pytest.raises(InputError, match="which %q"):
        job_inputs([Path(tmp_path, "n%q{RANK}_%q{PMI_RANK}.sqlite")])


def test_rank_pattern_reads_the_rank_from_the_path(tmp_path: Path) -> None:
    a = _touch(tmp_path / "node0" / "gpu3", "trace.sqlite")[0]
    b = _touch(tmp_path / "node1" / "gpu0", "trace.sqlite")[0]
    inputs = job_inputs([a, b], rank_pattern=r"gpu(\d+)")
    assert [(i.rank, i.path) for i in inputs] == [(0, b), (3, a)]
    named = job_inputs([a, b], rank_pattern=r"node(?P<node>\d)/gpu(?P<rank>\d+)")
    assert [i.rank for i in named] == [0, 3]


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("gpu(", "not a regular expression"),
        (r"gpu\d+", "needs one group"),
        (r"(node)(\d)", "needs one group"),
        (r"zzz(\d+)", "does not match this path"),
        (r"(trace)", "not a rank number"),
    ],
)
def test_a_bad_rank_pattern_says_why(tmp_path: Path, pattern: str, message: str) -> None:
    a = _touch(tmp_path / "node0" / "gpu3", "trace.sqlite")[0]
    with pytest.raises(InputError, match=message):
        job_inputs([a], rank_pattern=pattern)


def test_two_inputs_of_one_rank_are_an_error_that_names_both(tmp_path: Path) -> None:
    a = _touch(tmp_path / "x", "rank1.sqlite")[0]
    b = _touch(tmp_path / "y", "rank1.sqlite")[0]
    with pytest.raises(InputError) as err:
        job_inputs([a, b])
    text = str(err.value)
    assert "rank 1 twice" in text and str(a) in text and str(b) in text and "--rank-pattern" in text
    assert "\n" not in text
    # A name without a rank falls back to its position, which may collide with a named rank.
    c, d = _touch(tmp_path / "z", "plain.sqlite", "rank0.sqlite")
    with pytest.raises(InputError, match="rank 0 twice.*position.*name"):
        job_inputs([c, d])


@pytest.mark.parametrize(
    ("argument", "message"),
    [("missing.sqlite", "no such file"), ("nothing*.sqlite", "matches no file"),
     ("empty", "no traces or snapshots"), ("r%q{RANK}", "no file matches")],
)  # fmt: skip
def test_an_argument_that_names_nothing_is_an_error(tmp_path: Path, argument: str, message: str) -> None:
    (tmp_path / "empty").mkdir()
    _touch(tmp_path, "rank0.sqlite")
    with pytest.raises(InputError, match=message):
        job_inputs([Path(tmp_path, "rank0.sqlite"), Path(tmp_path, argument)])


def test_is_job(tmp_path: Path) -> None:
    (a,) = _touch(tmp_path, "a[1].sqlite")
    assert not is_job([a])  # an existing file is one input, even with glob characters
    assert not is_job([tmp_path / "missing.sqlite"])  # reported as today: no such file
    assert is_job([a, a])
    assert is_job([tmp_path])
    assert is_job([tmp_path / "*.sqlite"])
    assert is_job([tmp_path / "rank%q{RANK}"])


def test_relative_arguments_stay_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _touch(tmp_path / "runs", "rank0.sqlite", "rank1.sqlite")
    monkeypatch.chdir(tmp_path)
    inputs = job_inputs([Path("runs")])
    assert [str(i.path) for i in inputs] == [os.path.join("runs", "rank0.sqlite"), os.path.join("runs", "rank1.sqlite")]

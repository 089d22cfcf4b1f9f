"""``nsysfrag record``'s bad cases, each a real run: nothing recorded (and why), a folder it
must refuse, a recorder that cannot start, a full disk, Ctrl-C, an existing sitecustomize."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import sys
import time
from pathlib import Path

import pytest

from nsysfrag.record.layout import rank_folders
from tests.record_helpers import LAUNCH, TRAIN, fake_env, jsonl, record, warnings_of

PY = sys.executable


@pytest.mark.parametrize(
    ("program", "code", "why"),
    [
        (["-c", "import sys; sys.exit(5)"], 5, "1 Python process ran, but none imported torch"),
        (["-c", "import torch"], 0, "1 process imported torch but none initialized CUDA"),
    ],
)
def test_nothing_recorded_says_why_and_keeps_the_exit_code(
    tmp_path: Path, program: list[str], code: int, why: str
) -> None:
    run = record(tmp_path / "rec", "--", PY, *program)
    assert run.code == code, run.err
    assert f"nsysfrag: nothing was recorded: {why}" in run.err
    assert run.out == ""


def test_a_command_that_is_not_python_records_nothing(tmp_path: Path) -> None:
    run = record(tmp_path / "rec", "--", "sh", "-c", "exit 3")
    assert run.code == 3
    assert "nothing was recorded: no Python process of the command ran the recorder" in run.err


def test_cuda_unavailable_is_torch_without_cuda(tmp_path: Path) -> None:
    program = "import torch; print(torch.cuda.is_available())"
    run = record(tmp_path / "rec", "--", PY, "-c", program, env=fake_env(FAKE_TORCH_GPUS="0"))
    assert run.code == 0 and "False" in run.out
    assert "imported torch but none initialized CUDA" in run.err


def test_a_folder_that_cannot_be_written_is_refused_before_the_command_starts(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    ran = tmp_path / "ran"
    run = record(tmp_path / "a-file" / "rec", "--", "touch", str(ran))
    assert run.code == 2 and not ran.exists()
    assert run.err.startswith("nsysfrag: error: -o ") and "cannot write the record there" in run.err


def test_a_record_is_refused_unless_overwrite(tmp_path: Path) -> None:
    out, ran = tmp_path / "rec", tmp_path / "ran"
    program = ["-c", "import torch; x = torch.empty(1 << 20, device='cuda')"]
    assert record(out, "--", PY, *program).code == 0
    first = (out / "rank0" / "final.pickle").stat().st_mtime_ns
    run = record(out, "--", "touch", str(ran))
    assert run.code == 2 and not ran.exists()
    assert "already holds a record of this host; pass --overwrite to replace it" in run.err
    assert record(out, "--overwrite", "--", PY, *program).code == 0
    assert (out / "rank0" / "final.pickle").stat().st_mtime_ns != first
    assert [r.path.name for r in rank_folders(out)] == ["rank0"]
    # A folder with other files in it is never a record's to take, --overwrite or not.
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    run = record(other, "--overwrite", "--", "touch", str(ran))
    assert run.code == 2 and "not empty and holds no record" in run.err and not ran.exists()


def test_cuda_malloc_async_has_its_own_line_and_still_records_samples(tmp_path: Path) -> None:
    # PyTorch's cudaMallocAsync backend refuses history (and the OOM observer, and snapshots).
    program = (
        "import torch, time; x = torch.empty(1 << 20, dtype=torch.uint8, device='cuda');"
        " time.sleep(1.3); print('done')"
    )
    env = fake_env(PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    run = record(tmp_path / "rec", "--interval", "1", "--", PY, "-c", program, env=env)
    assert run.code == 0 and run.out.strip().endswith("done")
    assert warnings_of(run.err) == [], run.err
    (line,) = [ln for ln in run.err.splitlines() if "cudaMallocAsync" in ln]
    assert line.startswith("nsysfrag: backend:cudaMallocAsync keeps no allocation history")
    assert "only memory_stats() samples are recorded (rank0/timeline.jsonl)" in line
    (rank,) = rank_folders(tmp_path / "rec")
    samples = jsonl(rank.timeline)
    assert samples and all(s["reserved_bytes"] >= 1 << 20 for s in samples)
    assert rank.snapshot is None


@pytest.mark.parametrize("version", ["2.0.1", "1.13.1"])
def test_a_torch_before_2_1_is_one_line_and_the_program_runs_unrecorded(
    tmp_path: Path, version: str
) -> None:
    program = (
        "import torch; x = torch.empty(1 << 20, dtype=torch.uint8, device='cuda'); print('done')"
    )
    env = fake_env(FAKE_TORCH_VERSION=version)
    run = record(tmp_path / "rec", "--", PY, str(LAUNCH), "--nproc", "2", "-c", program, env=env)
    assert run.code == 0 and run.out.count("done") == 2, run.err
    expected = f"nsysfrag record needs torch \u2265 2.1 (found {version}+fake): the program ran unrecorded"
    assert run.err.splitlines() == [expected], run.err
    assert rank_folders(tmp_path / "rec") == []


def test_a_full_disk_stops_sampling_with_one_warning(tmp_path: Path) -> None:
    # A file size limit makes every write beyond it fail (EFBIG; Python ignores SIGXFSZ), as a
    # full disk fails them (ENOSPC): the recorder's first failed write stops the sampling.
    out = tmp_path / "rec"
    script = f"ulimit -f 2; exec {PY} {TRAIN}"  # 2 KiB: the first state snapshot is larger
    env = fake_env(STEPS="6", STEP_S="0.5")
    run = record(out, "--interval", "1", "--", "bash", "-c", script, env=env)
    assert run.code == 0, run.err
    (warning,) = warnings_of(run.err)
    assert "rank 0 (pid " in warning and "File too large" in warning
    assert warning.endswith("nothing more is sampled, the program runs on")
    assert "state-1.pickle" in warning  # the first sample's snapshot: nothing sampled after
    assert len(jsonl(out / "rank0" / "timeline.jsonl")) <= 1
    assert "nothing was recorded: a process initialized CUDA but left no snapshot" in run.err


def test_ctrl_c_reaches_the_command_and_the_record_stays_readable(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    argv = [PY, "-m", "nsysfrag", "record", "-o", str(out), "--interval", "1", "--json",
            str(tmp_path / "job.json"), "--", PY, str(TRAIN)]  # fmt: skip
    env = fake_env(STEPS="200", STEP_S="0.2")
    pid, fd = pty.fork()
    if pid == 0:  # the child: nsysfrag in the foreground of a terminal of its own
        os.execve(argv[0], argv, env)
    output = b""
    try:
        deadline = time.monotonic() + 60
        timeline = out / "rank0" / "timeline.jsonl"
        while time.monotonic() < deadline and not (timeline.exists() and timeline.read_text()):
            output += _drain(fd, 0.2)
        assert timeline.exists(), output.decode(errors="replace")
        os.write(fd, b"\x03")  # Ctrl-C: the terminal signals the whole foreground group
        while time.monotonic() < deadline:
            chunk = _drain(fd, 0.5)
            output += chunk
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
        else:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(output.decode(errors="replace"))
    finally:
        os.close(fd)
    text = output.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 130, text
    assert "SIGINT received; the command stopped" in text
    assert json.loads((out / "rank0" / "final.device.json").read_text())["reason"] == "exit"
    doc = json.loads((tmp_path / "job.json").read_text())
    assert doc["ranks"][0]["analysis"]["spaces"][0]["capacity_source"] == "device"


def _drain(fd: int, wait: float) -> bytes:
    ready, _, _ = select.select([fd], [], [], wait)
    if not ready:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError:
        return b""


def test_an_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "site"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text(
        "import os, sys\nopen(os.environ['MARK'], 'a').write(sys.argv[0] + '\\n')\n"
    )
    mark = tmp_path / "mark"
    env = fake_env(MARK=str(mark))
    env["PYTHONPATH"] += os.pathsep + str(theirs)
    program = "import torch; x = torch.empty(1 << 20, device='cuda')"
    run = record(tmp_path / "rec", "--", PY, "-c", program, env=env)
    assert run.code == 0, run.err
    # nsysfrag's own process ran it too (it has the same PYTHONPATH): that is "-m".
    assert sorted(mark.read_text().split()) == ["-c", "-m"]
    assert (tmp_path / "rec" / "rank0" / "final.pickle").is_file()


def test_processes_that_never_use_cuda_write_nothing_of_their_own(tmp_path: Path) -> None:
    # The launcher is Python too (as torchrun is): it imports nothing of torch and gets no
    # rank folder; the processes log shows it ran the bootstrap.
    out = tmp_path / "rec"
    program = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', 'import torch; torch.empty(8, device=\"cuda\")']))"
    run = record(out, "--", PY, "-c", program)
    assert run.code == 0, run.err
    events = jsonl(out / "processes.jsonl")
    assert [e["event"] for e in events].count("python") == 2
    assert [e["event"] for e in events].count("cuda") == 1
    assert [r.path.name for r in rank_folders(out)] == ["rank0"]


def test_options_that_cannot_apply_are_refused_before_the_command_starts(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    for bad in (["--csv", str(tmp_path / "t.csv")], ["--png", str(tmp_path / "png")],
                ["--fail-on", "nonsense"], ["--baseline", str(tmp_path / "missing.json")]):  # fmt: skip
        run = record(tmp_path / "rec", *bad, "--", "touch", str(ran))
        assert run.code == 2 and not ran.exists(), (bad, run.err)
        assert run.err.startswith("nsysfrag: error: "), run.err
        assert not (tmp_path / "rec").exists()


def test_a_record_compares_with_an_earlier_record(tmp_path: Path) -> None:
    program = ["-c", "import torch; x = torch.empty(1 << 24, device='cuda')"]
    first = tmp_path / "first.json"
    assert record(tmp_path / "a", "--json", str(first), "--", PY, *program).code == 0
    run = record(tmp_path / "b", "--baseline", str(first), "--fail-on-regression", "0.05",
                 "--", PY, *program)  # fmt: skip
    assert run.code == 0, run.err
    # The comparison table of rank 0 against the earlier record follows the job report.
    assert "rank 0" in run.out.split("Recorded live")[-1] and "first.json" in run.out.replace("\n", "")

"""`nsysfrag profile` and `nsysfrag analyze X.nsys-rep`, end to end against the fake nsys."""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsysfrag.cli import main
from nsysfrag.testing.nsys_export import MemoryRow, write_export
from tests.test_nsys import FAKE, FakeNsys, install_fake_nsys

REPO = Path(__file__).resolve().parent.parent
FAKE_VERSION_LINE = "NVIDIA Nsight Systems version 2025.3.2.367-253236389321v0"
PROGRAM_FAILED = (
    "nsysfrag: the profiled program exited with code {code} (the report covers what nsys"
    " recorded until then)"
)
APP = """\
import os, sys
with open(sys.argv[1], "w") as f:
    f.write(os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "<unset>"))
print("app stdout marker", flush=True)
print("app stderr marker", file=sys.stderr, flush=True)
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def fake_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNsys:
    return install_fake_nsys(tmp_path, monkeypatch)


def run_main(capfd: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The console script in-process; fd-level capture also catches nsys and the program."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capfd.readouterr()
    code = exc.value.code
    return code if isinstance(code, int) else 0, out, err


def one_error(err: str) -> str:
    """The single error line; everything else on stderr is a note or the fake nsys talking."""
    assert "Traceback" not in err
    errors = [ln for ln in err.splitlines() if ln.startswith("nsysfrag: error:")]
    assert len(errors) == 1, err
    others = [ln for ln in err.splitlines() if ln not in errors]
    assert all(ln.startswith(("nsysfrag: using", "fake nsys:", "app ")) for ln in others), err
    return errors[0]


@pytest.fixture
def app(tmp_path: Path) -> tuple[list[str], Path]:
    """A profiled program that records PYTORCH_NO_CUDA_MEMORY_CACHING and exits 0."""
    script = tmp_path / "app.py"
    script.write_text(APP)
    seen = tmp_path / "env-seen.txt"
    return [sys.executable, str(script), str(seen), "0"], seen


# --- profile -------------------------------------------------------------------------------------


def test_profile_records_exports_and_analyzes(
    fake_nsys: FakeNsys, tmp_path: Path, app: tuple[list[str], Path], capfd: pytest.CaptureFixture[str]
) -> None:
    prefix, out = tmp_path / "runs" / "exp1", tmp_path / "exp1.json"
    code, stdout, err = run_main(capfd, "profile", "-o", str(prefix), "--json", str(out), "-q",
                                 "--", *app[0])
    assert code == 0, err
    assert fake_nsys.calls() == [
        ["--version"],
        ["profile", "--help"],
        ["profile", "--trace=cuda,nvtx,osrt", "--cuda-memory-usage=true", "--output", str(prefix),
         "--force-overwrite=true", *app[0]],
        ["export", "--type", "sqlite", "--force-overwrite=true", "--output", f"{prefix}.sqlite",
         f"{prefix}.nsys-rep"],
    ]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "nsysfrag/1" and doc["trace"]["path"] == f"{prefix}.sqlite"
    assert doc["spaces"][0]["counts"]["allocations"] == 4
    assert doc["trace"]["warnings"] == []
    assert app[1].read_text() == "<unset>"
    # The program's streams are its own: nothing swallowed them.
    assert "app stdout marker" in stdout and "app stderr marker" in err
    assert f"nsysfrag: using {FAKE_VERSION_LINE} ({FAKE})" in err.splitlines()



def test_profile_options_reach_nsys(
    fake_nsys: FakeNsys, tmp_path: Path, app: tuple[list[str], Path], capfd: pytest.CaptureFixture[str]
) -> None:
    prefix = tmp_path / "exp2"
    code, _, err = run_main(
        capfd, "profile", "-o", str(prefix), "-q", "--backtrace", "--capture-range", "nvtx",
        "--nsys-arg=--sample=none", "--nsys-arg", "--cuda-graph-trace=node", "--", *app[0],
    )
    assert code == 0, err
    assert fake_nsys.calls()[2] == [
        "profile", "--trace=cuda,nvtx,osrt", "--cuda-memory-usage=true", "--output", str(prefix),
        "--force-overwrite=true", "--cudabacktrace=memory:0", "--python-backtrace=cuda",
        "--capture-range=nvtx", "--sample=none", "--cuda-graph-trace=node", *app[0],
    ]


def test_backtrace_of_a_native_program(
    fake_nsys: FakeNsys, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    native = tmp_path / "my_cuda_app"
    native.write_text("#!/bin/sh\necho native app\n")
    native.chmod(0o755)
    code, out, err = run_main(capfd, "profile", "-o", str(tmp_path / "r"), "-q", "--backtrace",
                              str(native), "--flag")  # no "--" needed before the program
    assert code == 0, err
    argv = fake_nsys.calls()[2]
    assert "--cudabacktrace=memory:0" in argv and "--python-backtrace=cuda" not in argv
    assert argv[-2:] == [str(native), "--flag"] and "native app" in out


def test_torch_tensors_sets_the_environment_and_says_so(
    fake_nsys: FakeNsys, tmp_path: Path, app: tuple[list[str], Path], capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.json"
    code, stdout, err = run_main(capfd, "profile", "-o", str(tmp_path / "t"), "--torch-tensors",
                                 "--json", str(out), "--", *app[0])
    assert code == 0, err
    assert app[1].read_text() == "1"
    warnings = json.loads(out.read_text())["trace"]["warnings"]
    assert any("PYTORCH_NO_CUDA_MEMORY_CACHING=1" in w and "--torch-tensors" in w for w in warnings)
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING=1" in stdout  # the terminal report shows it too
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" not in os.environ


def test_the_programs_exit_code_passes_through_after_the_report(
    fake_nsys: FakeNsys, tmp_path: Path, app: tuple[list[str], Path], capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fail.json"
    argv = [*app[0][:-1], "3"]
    code, _, err = run_main(capfd, "profile", "-o", str(tmp_path / "fail"), "--json", str(out),
                            "-q", "--", *argv)
    assert code == 3
    assert json.loads(out.read_text())["schema"] == "nsysfrag/1"
    notes = [ln for ln in err.splitlines() if "exited with code" in ln]
    assert notes == [PROGRAM_FAILED.format(code=3)]
    assert err.rstrip().splitlines()[-1] == notes[0]  # said after everything else
    assert "Traceback" not in err and "error" not in err


def test_nsys_failing_after_writing_its_report_counts_as_the_program_failing(
    fake_nsys: FakeNsys, tmp_path: Path, app: tuple[list[str], Path],
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NSYS_EXIT", "5")  # an older nsys, or nsys's own trouble
    out = tmp_path / "n.json"
    code, _, err = run_main(capfd, "profile", "-o", str(tmp_path / "n"), "--json", str(out), "-q",
                            "--", *app[0])
    assert code == 5 and json.loads(out.read_text())["spaces"]
    assert err.rstrip().splitlines()[-1] == PROGRAM_FAILED.format(code=5)


def test_json_on_stdout_keeps_the_programs_output_off_stdout(
    fake_nsys: FakeNsys, tmp_path: Path, app: tuple[list[str], Path], capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(capfd, "profile", "-o", str(tmp_path / "j"), "--json", "-", "--",
                              *app[0])
    assert code == 0, err
    assert json.loads(out)["schema"] == "nsysfrag/1"
    assert "app stdout marker" in err and "Collecting data" in err


def test_default_prefix_is_timestamped_in_the_current_folder(
    fake_nsys: FakeNsys, tmp_path: Path, app: tuple[list[str], Path],
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, _, err = run_main(capfd, "profile", "-q", "--", *app[0])
    assert code == 0, err
    names = sorted(p.name for p in work.iterdir())
    assert len(names) == 2 and re.fullmatch(r"nsysfrag-\d{8}-\d{6}\.nsys-rep", names[0])
    assert names[1] == names[0].replace(".nsys-rep", ".sqlite")
    assert Path(fake_nsys.calls()[2][4]).name == names[0].removesuffix(".nsys-rep")


def test_a_prefix_ending_in_nsys_rep_is_not_doubled(
    fake_nsys: FakeNsys, tmp_path: Path, app: tuple[list[str], Path], capfd: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(capfd, "profile", "-o", str(tmp_path / "x.nsys-rep"), "-q", "--", *app[0])
    assert code == 0, err
    assert (tmp_path / "x.nsys-rep").exists() and (tmp_path / "x.sqlite").exists()


# --- profile: errors ------------------------------------------------------------------------------


def test_nsys_not_found(
    fake_nsys: FakeNsys, tmp_path: Path, app: tuple[list[str], Path],
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    code, out, err = run_main(capfd, "profile", "-o", str(tmp_path / "r"), "--", *app[0])
    assert code == 3 and out == ""
    assert len(err.splitlines()) == 1
    line = one_error(err)
    assert "nsys not found" in line and "/opt/nvidia/nsight-systems/*/bin" in line
    assert "--nsys" in line and "install Nsight Systems" in line


def test_nsys_given_with_the_flag_or_the_environment(
    fake_nsys: FakeNsys, tmp_path: Path, app: tuple[list[str], Path],
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    copy = tmp_path / "elsewhere" / "nsys"
    copy.parent.mkdir()
    shutil.copy(FAKE, copy)
    code, _, err = run_main(capfd, "profile", "--nsys", str(copy), "-o", str(tmp_path / "a"), "-q",
                            "--", *app[0])
    assert code == 0, err
    monkeypatch.setenv("NSYS", str(copy))
    code, _, err = run_main(capfd, "profile", "-o", str(tmp_path / "b"), "-q", "--", *app[0])
    assert code == 0, err
    assert f"({copy})" in err


def test_nsys_too_old(
    fake_nsys: FakeNsys, tmp_path: Path, app: tuple[list[str], Path],
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NSYS_OLD", "1")
    code, _, err = run_main(capfd, "profile", "-o", str(tmp_path / "r"), "--", *app[0])
    assert code == 3
    assert "too old" in one_error(err) and "--cuda-memory-usage" in one_error(err)
    assert [c[0] for c in fake_nsys.calls()] == ["--version", "profile"]  # nothing recorded
    assert not app[1].exists()


def test_nsys_profile_failure_quotes_its_last_lines(
    fake_nsys: FakeNsys, tmp_path: Path, app: tuple[list[str], Path],
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NSYS_FAIL", "profile")
    code, _, err = run_main(capfd, "profile", "-o", str(tmp_path / "r"), "--", *app[0])
    assert code == 3
    line = one_error(err)
    assert "nsys profile failed (exit 1)" in line
    assert ("fake nsys: starting profile | fake nsys: profile went wrong"
            " | fake nsys: profile failed, giving up") in line
    assert "export" not in [c[0] for c in fake_nsys.calls()]


def test_nsys_export_failure_after_profiling(
    fake_nsys: FakeNsys, tmp_path: Path, app: tuple[list[str], Path],
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NSYS_FAIL", "export")
    code, _, err = run_main(capfd, "profile", "-o", str(tmp_path / "r"), "--", *app[0])
    assert code == 3
    line = one_error(err)
    assert "nsys export failed" in line and "export went wrong | fake nsys: export failed" in line
    assert (tmp_path / "r.nsys-rep").exists() and not (tmp_path / "r.sqlite").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--capture-range", "always"], "Invalid value for '--capture-range'"),
        (["-o", "run-%p"], "% patterns"),
        (["--", "no-such-program-xyz"], "command not found"),
        (["--", "./missing/app"], "not an executable file"),
    ],
)
def test_usage_errors_exit_2_before_nsys_runs(
    fake_nsys: FakeNsys, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    if "--" not in args:
        args = [*args, "--", sys.executable, "-c", "pass"]
    code, out, err = run_main(capfd, "profile", *args)
    assert code == 2 and out == "" and message in err and "Traceback" not in err
    assert fake_nsys.calls() == []


# --- profile: signals -----------------------------------------------------------------------------


def _spawn_env(fake_nsys: FakeNsys) -> dict[str, str]:
    return {**os.environ, "FAKE_NSYS_HANG": "1", "PYTHONPATH": str(REPO)}


def _wait_for_recording(fake_nsys: FakeNsys, proc: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if {"waiting": True} in fake_nsys.entries():
            return
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"nsysfrag exited early: {proc.communicate()}")
        time.sleep(0.05)
    pytest.fail("nsys profile never started")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_is_forwarded_to_nsys_and_its_report_analyzed(
    fake_nsys: FakeNsys, tmp_path: Path, signum: signal.Signals
) -> None:
    out = tmp_path / "sig.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsysfrag", "profile", "-o", str(tmp_path / "sig"), "--json",
         str(out), "-q", "--", sys.executable, "-c", "pass"],
        env=_spawn_env(fake_nsys), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    _wait_for_recording(fake_nsys, proc)
    os.kill(proc.pid, signum)  # to nsysfrag only, as `kill` or a job scheduler would
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, stderr
    assert [e for e in fake_nsys.entries() if "signals" in e] == [{"signals": [int(signum)]}]
    assert json.loads(out.read_text())["spaces"], "the report nsys finished was analyzed"
    assert f"{signum.name} received" in stderr and "Traceback" not in stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs a Linux pty")
def test_ctrl_c_in_a_terminal_reaches_nsys_once(fake_nsys: FakeNsys, tmp_path: Path) -> None:
    """The terminal signals nsys itself; nsysfrag must not send it a second SIGINT."""
    import pty

    out = tmp_path / "tty.json"
    argv = [sys.executable, "-m", "nsysfrag", "profile", "-o", str(tmp_path / "tty"), "--json",
            str(out), "-q", "--", sys.executable, "-c", "pass"]
    env = _spawn_env(fake_nsys)
    pid, master = pty.fork()
    if pid == 0:  # the child: a session leader with the pty as its terminal
        try:
            os.execve(sys.executable, argv, env)
        finally:
            os._exit(127)
    screen, sent, status = b"", False, None
    deadline = time.monotonic() + 120
    while status is None and time.monotonic() < deadline:
        if select.select([master], [], [], 0.05)[0]:
            try:
                screen += os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                pass
        if not sent and {"waiting": True} in fake_nsys.entries():
            os.write(master, b"\x03")  # Ctrl-C, as typed
            sent = True
        done, raw = os.waitpid(pid, os.WNOHANG)
        status = raw if done else None
    os.close(master)
    assert status is not None, screen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 130, screen.decode(errors="replace")
    assert [e for e in fake_nsys.entries() if "signals" in e] == [{"signals": [2]}]
    assert json.loads(out.read_text())["spaces"]
    assert b"recording" in screen  # the terminal-only status lines


# --- analyze X.nsys-rep -----------------------------------------------------------------------------


@pytest.fixture
def report(fake_nsys: FakeNsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A report the fake nsys recorded (and can export)."""
    subprocess.run([str(FAKE), "profile", "--output", str(tmp_path / "run"), sys.executable,
                    "-c", "pass"], check=True, capture_output=True)
    fake_nsys.log.unlink()
    path = tmp_path / "run.nsys-rep"
    st = path.stat()
    # Recorded a minute ago: an export made now is unambiguously newer.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 60 * 10**9))
    return path


def _exports(fake_nsys: FakeNsys) -> list[list[str]]:
    return [c for c in fake_nsys.calls() if c[0] == "export"]


def test_analyze_exports_a_report_once_and_reuses_it(
    fake_nsys: FakeNsys, report: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    sqlite = report.with_name("run.sqlite")
    code, out, err = run_main(capfd, "analyze", str(report), "--json", "-")
    assert code == 0, err
    assert json.loads(out)["trace"]["path"] == str(sqlite)
    assert _exports(fake_nsys) == [["export", "--type", "sqlite", "--force-overwrite=true",
                                    "--output", str(sqlite), str(report)]]
    assert f"nsysfrag: using {FAKE_VERSION_LINE} ({FAKE})" in err

    calls = len(fake_nsys.calls())
    code, out, err = run_main(capfd, "analyze", str(report), "--json", "-")
    assert code == 0, err
    assert json.loads(out)["spaces"]
    assert len(fake_nsys.calls()) == calls  # no export, not even a look at nsys
    assert f"nsysfrag: using {sqlite}, exported earlier from run.nsys-rep" in err

    code, _, err = run_main(capfd, "analyze", str(report), "-q", "--reexport")
    assert code == 0, err
    assert len(_exports(fake_nsys)) == 2

    os.utime(report)  # recorded again: newer than its export
    code, _, err = run_main(capfd, "analyze", str(report), "-q")
    assert code == 0, err
    assert len(_exports(fake_nsys)) == 3


def test_analyze_reuses_an_export_without_nsys_installed(
    fake_nsys: FakeNsys, report: Path, capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_main(capfd, "analyze", str(report), "-q")[0] == 0
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    code, _, err = run_main(capfd, "analyze", str(report), "-q")
    assert code == 0, err


def test_analyze_never_overwrites_an_unrelated_sqlite(
    fake_nsys: FakeNsys, report: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    mine = write_export(report.with_name("run.sqlite"), [MemoryRow(1, 1, 0, 1 << 40, 1 << 20)])
    digest = hashlib.sha256(mine.read_bytes()).hexdigest()
    code, out, err = run_main(capfd, "analyze", str(report), "--json", "-")
    assert code == 0, err
    ours = report.with_name("run.nsysfrag.sqlite")
    assert json.loads(out)["trace"]["path"] == str(ours)
    assert _exports(fake_nsys)[0][-3:] == ["--output", str(ours), str(report)]
    assert hashlib.sha256(mine.read_bytes()).hexdigest() == digest
    assert f"{mine} was not exported from run.nsys-rep" in err
    # And the fallback export is reused next time.
    assert run_main(capfd, "analyze", str(report), "-q")[0] == 0
    assert len(_exports(fake_nsys)) == 1


def test_an_export_recording_only_the_report_name_is_recognized(
    fake_nsys: FakeNsys, report: Path, capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NSYS_INPUT_META", "name")
    assert run_main(capfd, "analyze", str(report), "-q")[0] == 0
    assert run_main(capfd, "analyze", str(report), "-q")[0] == 0
    assert len(_exports(fake_nsys)) == 1
    assert not report.with_name("run.nsysfrag.sqlite").exists()


def test_analyze_cache_dir(
    fake_nsys: FakeNsys, report: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache" / "nsysfrag"
    code, _, err = run_main(capfd, "analyze", str(report), "-q", "--cache-dir", str(cache))
    assert code == 0, err
    assert (cache / "run.sqlite").exists() and not report.with_name("run.sqlite").exists()
    assert run_main(capfd, "analyze", str(report), "-q", "--cache-dir", str(cache))[0] == 0
    assert len(_exports(fake_nsys)) == 1


def test_analyze_routes_qdrep_reports_too(
    fake_nsys: FakeNsys, report: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    qdrep = report.rename(report.with_name("old.qdrep"))
    code, out, err = run_main(capfd, "analyze", str(qdrep), "--json", "-")
    assert code == 0, err
    assert json.loads(out)["trace"]["path"] == str(qdrep.with_name("old.sqlite"))


def test_analyze_a_report_nsys_cannot_export(
    fake_nsys: FakeNsys, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    bogus = tmp_path / "bogus.nsys-rep"
    bogus.write_bytes(b"\x00binary report")
    code, out, err = run_main(capfd, "analyze", str(bogus))
    assert code == 3 and out == ""
    line = one_error(err)
    assert "nsys export failed" in line and "not a valid report file" in line
    assert not (tmp_path / "bogus.sqlite").exists()


def test_analyze_a_report_without_nsys(
    fake_nsys: FakeNsys, report: Path, capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    code, out, err = run_main(capfd, "analyze", str(report))
    assert code == 3 and out == "" and len(err.splitlines()) == 1
    line = one_error(err)
    assert "nsys not found" in line and f"nsys export --type sqlite {report}" in line


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (False, [], "no such file"),
        (True, ["--reexport"], "apply to .nsys-rep reports"),
        (True, ["--cache-dir", "c"], "apply to .nsys-rep reports"),
    ],
)
def test_analyze_input_errors_exit_2(
    fake_nsys: FakeNsys, tmp_path: Path, capfd: pytest.CaptureFixture[str],
    make: bool, args: list[str], message: str
) -> None:
    path = tmp_path / ("t.sqlite" if make else "missing.nsys-rep")
    if make:
        write_export(path, [MemoryRow(1, 1, 0, 1 << 40, 1 << 20)])
    code, out, err = run_main(capfd, "analyze", str(path), *args)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert message in one_error(err)
    assert fake_nsys.calls() == []


# --- the real tool ---------------------------------------------------------------------------------

REAL_APP = """\
try:
    import torch
    if torch.cuda.is_available():
        xs = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (1, 3, 2, 5)]
        del xs[1]
        xs.append(torch.empty(7 << 20, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
except ImportError:
    pass
print("real app done")
"""


@pytest.mark.nsys
@pytest.mark.skipif(shutil.which("nsys") is None, reason="no nsys on PATH")
def test_profile_with_the_real_nsys(tmp_path: Path) -> None:
    script = tmp_path / "real_app.py"
    script.write_text(REAL_APP)
    out = tmp_path / "real.json"
    proc = subprocess.run(
        [sys.executable, "-m", "nsysfrag", "profile", "--torch-tensors", "-o",
         str(tmp_path / "real"), "--json", str(out), "-q", "--", sys.executable, str(script)],
        check=False, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert "Traceback" not in proc.stderr
    assert "nsysfrag: using NVIDIA Nsight Systems version" in proc.stderr
    assert (tmp_path / "real.nsys-rep").exists() and (tmp_path / "real.sqlite").exists()
    if proc.returncode == 0:
        assert json.loads(out.read_text())["spaces"]
    else:  # no GPU or no torch here: nsys recorded no allocations, and nsysfrag says so
        assert proc.returncode == 2 and "memory" in proc.stderr, proc.stderr
    # Analyzing the report afterwards reuses that export.
    again = subprocess.run(
        [sys.executable, "-m", "nsysfrag", "analyze", str(tmp_path / "real.nsys-rep"), "-q"],
        check=False, capture_output=True, text=True, timeout=600,
    )
    assert "exported earlier" in again.stderr and again.returncode == proc.returncode

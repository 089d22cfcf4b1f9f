"""Finding and running nsys (nsysfrag/inputs/nsys/runner.py), against the fake nsys in tests/fake_nsys/."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from nsysfrag import destinations
from nsysfrag.errors import NsysError
from nsysfrag.inputs.nsys import runner as nsys
from nsysfrag.inputs.nsys.runner import Nsys, ProfilePlan
from nsysfrag.testing.nsys_export import MemoryRow, write_export

FAKE_DIR = Path(__file__).resolve().parent / "fake_nsys"
_STAGED = re.compile(rf"^(.*/)?{re.escape(destinations.TEMP_PREFIX)}[^/]+/([^/]+)$")
FAKE = FAKE_DIR / "nsys"
FAKE_VERSION = "NVIDIA Nsight Systems version 2025.3.2.367-253236389321v0"
_KNOBS = (
    "NSYS", "FAKE_NSYS_OLD", "FAKE_NSYS_FAIL", "FAKE_NSYS_HANG", "FAKE_NSYS_EXIT",
    "FAKE_NSYS_EXPORT_EMPTY", "FAKE_NSYS_INPUT_META", "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "FAKE_NSYS_STALL", "FAKE_NSYS_STALL_PIDS",
)


@dataclass(frozen=True)
class FakeNsys:
    """The fake nsys first on PATH, and what it was asked to do."""

    log: Path

    def entries(self) -> list[dict[str, object]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def raw_calls(self) -> list[list[str]]:
        return [e["argv"] for e in self.entries() if "argv" in e]  # type: ignore[misc]

    def calls(self) -> list[list[str]]:
        """Each call, with the private folder nsys was given to write in taken out of its
        paths (``nsysfrag.destinations``: a file lands by a rename from there), so a path reads
        as where the file lands."""
        return [[_STAGED.sub(r"\1\2", arg) for arg in argv] for argv in self.raw_calls()]

    def subcommands(self) -> list[str]:
        return [" ".join(c[:2]) if c[:2] == ["profile", "--help"] else c[0] for c in self.calls()]


@pytest.fixture
def fake_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNsys:
    return install_fake_nsys(tmp_path, monkeypatch)


def install_fake_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNsys:
    """Put the fake nsys first on PATH (then this Python, which the fake's shebang finds)."""
    log = tmp_path / "nsys-calls.jsonl"
    path = [str(FAKE_DIR), str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    monkeypatch.setenv("FAKE_NSYS_LOG", str(log))
    monkeypatch.setenv("COLUMNS", "120")
    for var in _KNOBS:
        monkeypatch.delenv(var, raising=False)
    # Never look in this machine's /opt or /usr/local.
    monkeypatch.setattr(nsys, "INSTALL_ROOT", tmp_path / "no-install-root")
    return FakeNsys(log)


def _tool(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho fake\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# --- discovery ---------------------------------------------------------------------------------


def test_discovery_order_is_flag_env_path_then_install_dirs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    installed = _tool(root / "opt/nvidia/nsight-systems/2025.3.2/bin/nsys")
    on_path = _tool(tmp_path / "pathdir/nsys")
    from_env = _tool(tmp_path / "envdir/nsys")
    explicit = _tool(tmp_path / "flagdir/nsys")
    env = {"NSYS": str(from_env), "PATH": str(on_path.parent)}

    assert nsys.find_nsys(str(explicit), env, root) == explicit
    assert nsys.find_nsys(None, env, root) == from_env
    assert nsys.find_nsys(None, {"PATH": str(on_path.parent)}, root) == on_path
    assert nsys.find_nsys(None, {"PATH": str(tmp_path / "empty")}, root) == installed


def test_install_dirs_newest_version_first(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for d in (
        "opt/nvidia/nsight-systems/2024.1.1/bin",
        "opt/nvidia/nsight-systems/2025.10.1/bin",  # numeric, not text, order: 10 > 3
        "opt/nvidia/nsight-systems/2025.3.2/bin",
        "usr/local/cuda/bin",
        "usr/local/cuda-12.4/bin",
        "usr/local/cuda-12.4/nsight-systems-2023.4.1/bin",
        "usr/local/cuda-11.8/bin",
    ):
        _tool(root / d / "nsys")
    (root / "usr/local/cuda-12.6/bin").mkdir(parents=True)  # no nsys in it: skipped by find
    order = [str(d.relative_to(root)) for d in nsys.install_dirs(root)]
    assert order == [
        "opt/nvidia/nsight-systems/2025.10.1/bin",
        "opt/nvidia/nsight-systems/2025.3.2/bin",
        "opt/nvidia/nsight-systems/2024.1.1/bin",
        "usr/local/cuda-12.4/nsight-systems-2023.4.1/bin",
        "usr/local/cuda-12.6/bin",
        "usr/local/cuda-12.4/bin",
        "usr/local/cuda-11.8/bin",
        "usr/local/cuda/bin",
    ]
    found = nsys.find_nsys(None, {"PATH": ""}, root)
    assert found == root / "opt/nvidia/nsight-systems/2025.10.1/bin/nsys"


def test_cuda_folder_without_nsys_is_passed_over(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/local/cuda-12.6/bin").mkdir(parents=True)
    older = _tool(root / "usr/local/cuda-12.4/bin/nsys")
    assert nsys.find_nsys(None, {"PATH": ""}, root) == older


def test_explicit_nsys_may_name_its_folder_or_a_command_on_path(tmp_path: Path) -> None:
    tool = _tool(tmp_path / "bin/nsys")
    assert nsys.find_nsys(str(tool.parent), {}, tmp_path) == tool
    renamed = _tool(tmp_path / "bin/nsys-2025")
    assert nsys.find_nsys("nsys-2025", {"PATH": str(renamed.parent)}, tmp_path) == renamed


@pytest.mark.parametrize("source", ["flag", "env"])
def test_a_broken_explicit_choice_is_an_error_not_a_fallback(tmp_path: Path, source: str) -> None:
    fallback = _tool(tmp_path / "pathdir/nsys")
    missing = str(tmp_path / "nope/nsys")
    env = {"PATH": str(fallback.parent)} | ({"NSYS": missing} if source == "env" else {})
    with pytest.raises(NsysError) as err:
        nsys.find_nsys(missing if source == "flag" else None, env, tmp_path)
    message = str(err.value)
    assert ("--nsys" if source == "flag" else "$NSYS") in message and missing in message
    assert "\n" not in message


def test_not_found_says_where_it_looked_and_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(NsysError) as err:
        nsys.find_nsys(None, {"PATH": str(tmp_path)}, tmp_path)
    message = str(err.value)
    assert "nsys not found" in message and "PATH" in message and "$NSYS" in message
    for place in ("/opt/nvidia/nsight-systems/*/bin", "/usr/local/cuda*/bin",
                  "/usr/local/cuda*/nsight-systems*/bin"):
        assert place in message
    assert "--nsys" in message and "developer.nvidia.com/nsight-systems" in message
    assert "\n" not in message


# --- version and capability ----------------------------------------------------------------------


def test_version_is_the_line_nsys_prints(fake_nsys: FakeNsys) -> None:
    tool = nsys.nsys_version(FAKE)
    assert tool == Nsys(FAKE, FAKE_VERSION)
    assert fake_nsys.calls() == [["--version"]]


def test_memory_tracking_check_reads_profile_help_every_time(
    fake_nsys: FakeNsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = Nsys(FAKE, FAKE_VERSION)
    nsys.require_memory_tracking(tool)
    monkeypatch.setenv("FAKE_NSYS_OLD", "1")
    with pytest.raises(NsysError) as err:
        nsys.require_memory_tracking(tool)
    assert "too old" in str(err.value) and "--cuda-memory-usage" in str(err.value)
    monkeypatch.delenv("FAKE_NSYS_OLD")
    nsys.require_memory_tracking(tool)  # nothing was remembered from the failing run
    assert fake_nsys.calls() == [["profile", "--help"]] * 3


def test_something_that_is_not_nsys_fails_cleanly(tmp_path: Path) -> None:
    liar = tmp_path / "nsys"
    liar.write_text("#!/bin/sh\necho 'line one' >&2\necho 'bad flag' >&2\nexit 2\n")
    liar.chmod(0o755)
    with pytest.raises(NsysError) as err:
        nsys.nsys_version(liar)
    assert "exit 2" in str(err.value) and "line one | bad flag" in str(err.value)


# --- the profile command line ----------------------------------------------------------------------


BASE_ARGV = ["/x/nsys", "profile", "--trace=cuda,nvtx,osrt", "--cuda-memory-usage=true",
             "--output", "runs/exp1", "--force-overwrite=true"]


def test_profile_argv_defaults() -> None:
    plan = ProfilePlan(command=("./my_cuda_app", "--n", "3"), prefix=Path("runs/exp1"))
    assert plan.argv(Path("/x/nsys")) == [*BASE_ARGV, "./my_cuda_app", "--n", "3"]
    assert plan.report == Path("runs/exp1.nsys-rep") and plan.export == Path("runs/exp1.sqlite")


def test_profile_argv_with_every_option() -> None:
    plan = ProfilePlan(
        command=("python3", "train.py"),
        prefix=Path("runs/exp1"),
        backtrace=True,
        capture_range="cudaProfilerApi",
        extra_args=("--sample=none", "--cuda-graph-trace=node"),
    )
    assert plan.argv(Path("/x/nsys")) == [
        *BASE_ARGV, "--cudabacktrace=memory:0", "--python-backtrace=cuda",
        "--capture-range=cudaProfilerApi", "--sample=none", "--cuda-graph-trace=node",
        "python3", "train.py",
    ]


def test_backtrace_of_a_native_program_has_no_python_backtrace() -> None:
    plan = ProfilePlan(command=("./my_cuda_app",), prefix=Path("runs/exp1"), backtrace=True)
    assert plan.argv(Path("/x/nsys")) == [*BASE_ARGV, "--cudabacktrace=memory:0", "./my_cuda_app"]


@pytest.mark.parametrize(
    ("argv0", "python"),
    [("python", True), ("/usr/bin/python3.11", True), ("train.py", True), ("./tools/run.py", True),
     ("./my_cuda_app", False), ("torchrun", False), ("ipython", False), ("/opt/py/app", False)],
)
def test_python_program_detection(argv0: str, python: bool) -> None:
    assert nsys.is_python_program([argv0, "x"]) is python


def test_torch_tensors_environment() -> None:
    base = {"PATH": "/bin", "HOME": "/root"}
    plan = ProfilePlan(command=("python",), prefix=Path("r"))
    assert plan.environ(base) == base
    with_torch = ProfilePlan(command=("python",), prefix=Path("r"), torch_tensors=True)
    assert with_torch.environ(base) == base | {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    assert base == {"PATH": "/bin", "HOME": "/root"}


def test_a_stale_report_is_not_taken_for_a_new_one(fake_nsys: FakeNsys, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    plan = ProfilePlan(command=(sys.executable, "-c", "pass"), prefix=tmp_path / "run")
    plan.report.write_bytes(b"FAKE-NSYS-REP\nfrom an earlier run\n")
    monkeypatch.setenv("FAKE_NSYS_FAIL", "profile")
    chunks: list[bytes] = []
    outcome = nsys.run_profile(Nsys(FAKE, FAKE_VERSION), plan, stderr_sink=chunks.append)
    assert outcome.returncode == 1 and outcome.report is None and outcome.signal is None
    assert b"profile went wrong" in b"".join(chunks)  # relayed as it came
    assert outcome.stderr_tail == (
        "fake nsys: starting profile | fake nsys: profile went wrong"
        " | fake nsys: profile failed, giving up"
    )
    assert plan.report.read_bytes().endswith(b"from an earlier run\n")  # left as it was
    message = str(outcome.failure(plan))
    assert "exit 1" in message and str(plan.report) in message and "giving up" in message


def test_run_profile_reports_the_programs_exit_code(fake_nsys: FakeNsys, tmp_path: Path) -> None:
    plan = ProfilePlan(command=(sys.executable, "-c", "raise SystemExit(7)"), prefix=tmp_path / "r")
    outcome = nsys.run_profile(Nsys(FAKE, FAKE_VERSION), plan)
    assert outcome.returncode == 7 and outcome.report == plan.report and plan.report.exists()


# --- export and its cache -----------------------------------------------------------------------


def _report(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"FAKE-NSYS-REP\n{}\n")
    return path


def _export(path: Path, table: str = "META_DATA_EXPORT", **inputs: str) -> Path:
    """A synthetic export whose metadata names its input with ``inputs`` (key=value)."""
    write_export(path, [MemoryRow(1, 1, 0, 1 << 40, 1 << 20)])
    con = sqlite3.connect(path)
    with con:
        if table != "META_DATA_EXPORT":
            con.execute(f"CREATE TABLE {table} (name TEXT NOT NULL, value TEXT)")
        con.executemany(f"INSERT INTO {table} VALUES (?,?)", list(inputs.items()))
    con.close()
    return path


def _age(path: Path, seconds: float) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - int(seconds * 1e9)))


def test_export_goes_beside_the_report_or_into_the_cache_dir(tmp_path: Path) -> None:
    report = _report(tmp_path / "runs/exp1.nsys-rep")
    assert nsys.plan_export(report) == nsys.ExportPlan(tmp_path / "runs/exp1.sqlite", False)
    cache = tmp_path / "cache"
    assert nsys.plan_export(report, cache).path == cache / "exp1.sqlite"
    qdrep = _report(tmp_path / "old.qdrep")
    assert nsys.plan_export(qdrep).path == tmp_path / "old.sqlite"


def test_an_export_of_the_report_is_reused_while_newer(tmp_path: Path) -> None:
    report = _report(tmp_path / "run.nsys-rep")
    _age(report, 10)
    export = _export(tmp_path / "run.sqlite", EXPORT_PARAM_INPUT_PATH_ABS=str(report))
    assert nsys.plan_export(report) == nsys.ExportPlan(export, True)
    assert nsys.plan_export(report, reexport=True) == nsys.ExportPlan(export, False)
    _age(export, 20)  # now older than the report: the report was recorded again
    assert nsys.plan_export(report) == nsys.ExportPlan(export, False)


@pytest.mark.parametrize(
    ("table", "inputs"),
    [
        ("META_DATA_EXPORT", {"EXPORT_PARAM_INPUT_PATH_ABS": "{abs}"}),
        ("META_DATA_EXPORT", {"EXPORT_PARAM_INPUT_PATH": "{abs}"}),
        ("META_DATA_EXPORT", {"EXPORT_PARAM_INPUT_FILE": "run.nsys-rep"}),
        ("META_DATA_EXPORT", {"EXPORT_PARAM_INPUT_PATH": "run.nsys-rep",
                              "EXPORT_PARAM_INPUT_FILE": "run.nsys-rep"}),
        ("EXPORT_META_DATA", {"EXPORT_INPUT_FILE": "run.nsys-rep"}),  # nsys 2022.x-2023.1
        ("EXPORT_META_DATA", {"EXPORT_INPUT_PATH_ABS": "{abs}"}),
    ],
)
def test_metadata_that_names_the_report(tmp_path: Path, table: str, inputs: dict[str, str]) -> None:
    report = _report(tmp_path / "run.nsys-rep")
    values = {k: v.format(abs=report.resolve()) for k, v in inputs.items()}
    export = _export(tmp_path / "run.sqlite", table, **values)
    assert nsys.exported_from(export, report)


@pytest.mark.parametrize(
    "inputs",
    [
        {},  # a database that says nothing about where it came from
        {"EXPORT_PARAM_INPUT_FILE": "other.nsys-rep"},
        # The same name in another folder: the absolute path decides over the name.
        {"EXPORT_PARAM_INPUT_PATH_ABS": "/elsewhere/run.nsys-rep",
         "EXPORT_PARAM_INPUT_FILE": "run.nsys-rep"},
    ],
)
def test_metadata_that_does_not_name_the_report(tmp_path: Path, inputs: dict[str, str]) -> None:
    report = _report(tmp_path / "run.nsys-rep")
    export = _export(tmp_path / "run.sqlite", **inputs)
    assert not nsys.exported_from(export, report)
    plan = nsys.plan_export(report)
    assert plan == nsys.ExportPlan(tmp_path / "run.nsysfrag.sqlite", False, avoided=export)


def test_an_unrelated_file_of_that_name_is_read_only_and_left_alone(tmp_path: Path) -> None:
    report = _report(tmp_path / "run.nsys-rep")
    for content in (b"my notes, not a database\n", None):
        mine = tmp_path / "run.sqlite"
        if content is None:
            _export(mine, EXPORT_PARAM_INPUT_FILE="another.nsys-rep")
        else:
            mine.write_bytes(content)
        before = (mine.read_bytes(), mine.stat().st_mtime_ns)
        mine.chmod(0o444)
        assert nsys.plan_export(report).avoided == mine
        assert (mine.read_bytes(), mine.stat().st_mtime_ns) == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run.nsys-rep", "run.sqlite"]
        mine.chmod(0o644)
        mine.unlink()


def test_our_fallback_export_is_reused_too(tmp_path: Path) -> None:
    report = _report(tmp_path / "run.nsys-rep")
    _age(report, 10)
    _export(tmp_path / "run.sqlite")  # the user's
    ours = _export(tmp_path / "run.nsysfrag.sqlite", EXPORT_PARAM_INPUT_PATH_ABS=str(report))
    assert nsys.plan_export(report) == nsys.ExportPlan(ours, True, avoided=tmp_path / "run.sqlite")


def test_export_runs_nsys_and_checks_the_result(fake_nsys: FakeNsys, tmp_path: Path) -> None:
    report = _report(tmp_path / "run.nsys-rep")
    out = nsys.export_sqlite(Nsys(FAKE, FAKE_VERSION), report, tmp_path / "run.sqlite")
    assert out == tmp_path / "run.sqlite" and nsys.exported_from(out, report)
    assert fake_nsys.calls() == [
        ["export", "--type", "sqlite", "--force-overwrite=true", "--output", str(out), str(report)]
    ]


def test_export_failure_quotes_nsys_and_leaves_the_file_there_as_it_was(
    fake_nsys: FakeNsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = _report(tmp_path / "run.nsys-rep")
    earlier = tmp_path / "run.sqlite"
    earlier.write_bytes(b"an earlier export")
    monkeypatch.setenv("FAKE_NSYS_FAIL", "export")
    with pytest.raises(NsysError) as err:
        nsys.export_sqlite(Nsys(FAKE, FAKE_VERSION), report, earlier)
    assert "nsys export failed" in str(err.value) and "exit 1" in str(err.value)
    assert ("fake nsys: starting export | fake nsys: export went wrong"
            " | fake nsys: export failed, giving up") in str(err.value)
    # nsys wrote into a folder of its own, removed with what it left; nothing else changed.
    assert earlier.read_bytes() == b"an earlier export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nsys-calls.jsonl", "run.nsys-rep",
                                                          "run.sqlite"]  # fmt: skip
    (staged,) = [a for a in fake_nsys.raw_calls()[0] if a.endswith("run.sqlite")]
    assert Path(staged).parent.name.startswith(destinations.TEMP_PREFIX)


def test_a_report_nsys_cannot_export(fake_nsys: FakeNsys, tmp_path: Path) -> None:
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"\x00not a report")
    with pytest.raises(NsysError) as err:
        nsys.export_sqlite(Nsys(FAKE, FAKE_VERSION), report, tmp_path / "run.sqlite")
    assert "not a valid report file | Failed to open the report." in str(err.value)


def test_an_export_that_writes_nothing(fake_nsys: FakeNsys, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    report = _report(tmp_path / "run.nsys-rep")
    monkeypatch.setenv("FAKE_NSYS_EXPORT_EMPTY", "1")
    with pytest.raises(NsysError) as err:
        nsys.export_sqlite(Nsys(FAKE, FAKE_VERSION), report, tmp_path / "run.sqlite")
    assert "wrote no" in str(err.value) and FAKE_VERSION in str(err.value)

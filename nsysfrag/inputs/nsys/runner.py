"""Find and run nsys (profile, export): the only module that starts nsys.

Nothing here prints: results come back as values, problems as :class:`NsysError` (exit 3) or
:class:`InputError` (exit 2), and the child's stderr goes to a sink the caller chooses. Every
call but ``profile`` (which runs the user's program, as long as it takes) runs under a time
limit in a process group of its own (``processes``); nsys writes its files into a private
folder, and each is renamed into place through ``nsysfrag.destinations``.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from nsysfrag import destinations, limits
from nsysfrag.errors import InputError, NsysError
from nsysfrag.inputs.nsys.processes import Finished, TimedOut, run_bounded
from nsysfrag.inputs.nsys.target_info import export_inputs

# Relative to INSTALL_ROOT so tests can point the search at a temporary tree instead of /opt.
INSTALL_ROOT = Path("/")
INSTALL_GLOBS = (
    "opt/nvidia/nsight-systems/*/bin",
    "usr/local/cuda*/bin",
    "usr/local/cuda*/nsight-systems*/bin",
)
INSTALL_HINT = (
    "install Nsight Systems (https://developer.nvidia.com/nsight-systems, also shipped with the"
    " CUDA toolkit) or pass --nsys /path/to/nsys"
)
CAPTURE_RANGES = ("cudaProfilerApi", "nvtx", "none")
RECORD_OPTIONS = ("--trace=cuda,nvtx,osrt", "--cuda-memory-usage=true")
TORCH_NO_CACHING = "PYTORCH_NO_CUDA_MEMORY_CACHING"
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_TAIL_LINES = 3
# After --nsys-timeout stops a recording (SIGINT, as Ctrl-C would): how long nsys may take to
# write its report before it is killed.
_PROFILE_GRACE_S = 60.0


@dataclass(frozen=True, slots=True)
class Nsys:
    """An nsys executable, the line ``nsys --version`` printed, and ``--nsys-timeout``: how
    long one of its commands may run (None: the defaults of ``nsysfrag.limits``)."""

    path: Path
    version: str
    timeout_s: float | None = None

    def query_timeout(self) -> float:
        return _query_timeout(self.timeout_s)

    def export_timeout(self) -> float:
        return self.timeout_s if self.timeout_s is not None else limits.NSYS_EXPORT_S.value()


def _query_timeout(timeout_s: float | None) -> float:
    query = limits.NSYS_QUERY_S.value()
    return query if timeout_s is None else min(query, timeout_s)


def install_dirs(root: Path | None = None) -> list[Path]:
    """The usual install folders that exist under ``root``, newest version first."""
    root = INSTALL_ROOT if root is None else root
    found = {Path(p) for pattern in INSTALL_GLOBS for p in glob.glob(str(root / pattern))}
    return sorted(
        (d for d in found if d.is_dir()),
        key=lambda d: (_version_key(d.relative_to(root)), str(d)),
        reverse=True,
    )


def _version_key(directory: Path) -> tuple[tuple[int, ...], ...]:
    # The versioned component nearest to bin/ decides first, so nsight-systems-2024.1 inside
    # cuda-12.4 is ranked by 2024.1; an unversioned folder (the cuda symlink) sorts last.
    parts = (tuple(int(n) for n in re.findall(r"\d+", part)) for part in reversed(directory.parts))
    return tuple(p for p in parts if p)


def find_nsys(
    explicit: str | None = None,
    environ: Mapping[str, str] | None = None,
    install_root: Path | None = None,
) -> Path:
    """``--nsys``, then ``$NSYS``, then ``PATH``, then the install folders (newest first)."""
    env = os.environ if environ is None else environ
    if explicit:
        return _executable(explicit, "--nsys", env)
    if env.get("NSYS"):
        return _executable(env["NSYS"], "$NSYS", env)
    on_path = shutil.which("nsys", path=env.get("PATH", os.defpath))
    if on_path:
        return Path(on_path)
    for directory in install_dirs(install_root):
        if _is_executable(directory / "nsys"):
            return directory / "nsys"
    raise NsysError(
        "nsys not found (no --nsys, $NSYS unset, not on PATH, not in "
        + ", ".join("/" + g for g in INSTALL_GLOBS)
        + f"); {INSTALL_HINT}"
    )


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _executable(value: str, source: str, env: Mapping[str, str]) -> Path:
    path = Path(value).expanduser()
    if path.is_dir():
        path = path / "nsys"
    elif os.sep not in value and not path.exists():
        found = shutil.which(value, path=env.get("PATH", os.defpath))
        path = Path(found) if found else path
    if not _is_executable(path):
        raise NsysError(f"{source} {value}: not an executable nsys; {INSTALL_HINT}")
    return path


def nsys_version(path: Path, timeout_s: float | None = None) -> Nsys:
    """Ask ``path --version``; the first line it prints is the version we report."""
    out = _query(path, ["--version"], _query_timeout(timeout_s))
    line = next((ln.strip() for ln in out.splitlines() if ln.strip()), "")
    if not line:
        raise NsysError(f"{path} --version printed nothing; is it nsys? {INSTALL_HINT}")
    return Nsys(path, line[:500], timeout_s)


def require_memory_tracking(nsys: Nsys) -> None:
    """Fail unless this nsys can record allocations (asked afresh every run: nothing is cached)."""
    if "--cuda-memory-usage" not in _query(nsys.path, ["profile", "--help"], nsys.query_timeout()):
        raise NsysError(
            f"{nsys.path} ({nsys.version}) is too old: `nsys profile --help` lists no"
            " --cuda-memory-usage, which nsysfrag needs to record allocations; install a current"
            " Nsight Systems (https://developer.nvidia.com/nsight-systems) or pass --nsys"
        )


def _run(argv: list[str], timeout_s: float, fix: str) -> Finished:
    """``argv`` run by ``processes.run_bounded``: NsysError when it cannot start or ran past
    ``timeout_s`` (``fix`` says what to do then)."""
    try:
        return run_bounded(argv, timeout_s)
    except TimedOut:
        what = " ".join([Path(argv[0]).name, *(argv[1:2] if argv[1:2] == ["export"] else argv[1:])])
        raise NsysError(
            f"`{what}` did not finish within {timeout_s:g} s and was killed; {fix}"
        ) from None
    except OSError as err:
        raise NsysError(f"cannot run {argv[0]} ({err.strerror}); {INSTALL_HINT}") from None


def _query(path: Path, args: list[str], timeout_s: float) -> str:
    argv = [str(path), *args]
    fix = f"check that {path} is nsys and its install is reachable, or raise {limits.NSYS_QUERY_S.env}"
    proc = _run(argv, timeout_s, fix)
    if proc.returncode != 0:
        raise NsysError(
            f"`{' '.join(argv)}` failed (exit {proc.returncode}): {_tail(proc.stderr, proc.stdout)}"
        )
    return proc.stdout + proc.stderr


def _tail(*texts: str) -> str:
    """The last lines of the first non-empty text, joined into one line."""
    for text in texts:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if lines:
            return " | ".join(lines[-_TAIL_LINES:])
    return "no message"


def is_python_program(command: Sequence[str]) -> bool:
    """``python3 train.py`` or ``./train.py``: worth a Python backtrace."""
    name = os.path.basename(command[0]) if command else ""
    return name.startswith("python") or name.endswith(".py")


@dataclass(frozen=True, slots=True)
class ProfilePlan:
    """One ``nsys profile`` run: the program, where the report goes and the extra options."""

    command: tuple[str, ...]
    prefix: Path
    backtrace: bool = False
    capture_range: str | None = None
    extra_args: tuple[str, ...] = ()
    torch_tensors: bool = False

    @property
    def report(self) -> Path:
        return self.prefix.with_name(self.prefix.name + ".nsys-rep")

    @property
    def export(self) -> Path:
        return self.prefix.with_name(self.prefix.name + ".sqlite")

    def argv(self, nsys: Path) -> list[str]:
        argv = [str(nsys), "profile", *RECORD_OPTIONS, "--output", str(self.prefix),
                "--force-overwrite=true"]
        if self.backtrace:
            # Threshold 0: a stack for every allocation call, not only the slow ones.
            argv.append("--cudabacktrace=memory:0")
            if is_python_program(self.command):
                argv.append("--python-backtrace=cuda")
        if self.capture_range is not None:
            argv.append(f"--capture-range={self.capture_range}")
        # nsys takes the first positional argument as the program, so no "--" before it.
        return [*argv, *self.extra_args, *self.command]

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        env = dict(base)
        if self.torch_tensors:
            # Without PyTorch's caching allocator every tensor is its own cudaMalloc/cudaFree.
            env[TORCH_NO_CACHING] = "1"
        return env


@dataclass(frozen=True, slots=True)
class ProfileOutcome:
    """What ``nsys profile`` left behind."""

    returncode: int
    report: Path | None  # the report written by this run; None when nsys wrote none
    signal: int | None  # the last SIGINT/SIGTERM nsysfrag received while nsys ran
    stderr_tail: str = ""  # its last stderr lines, when the caller relayed them
    timed_out: bool = False  # --nsys-timeout stopped the recording

    def failure(self, plan: ProfilePlan) -> NsysError:
        """The error for a run that wrote no report."""
        why = self.stderr_tail or "see its messages above"
        return NsysError(
            f"nsys profile failed (exit {self.returncode}) without writing {plan.report}: {why};"
            " check the program runs on its own and the options passed with --nsys-arg"
        )


def run_profile(
    nsys: Nsys,
    plan: ProfilePlan,
    *,
    environ: Mapping[str, str] | None = None,
    stdout: int | None = None,
    stderr_sink: Callable[[bytes], None] | None = None,
) -> ProfileOutcome:
    """Run ``nsys profile`` to the end, forwarding SIGINT/SIGTERM so nsys can finish its report.

    The program's stdin and stdout are inherited (``stdout`` may name another descriptor), so
    its output streams live. Its stderr is inherited too unless ``stderr_sink`` is given: then
    every chunk goes there as it arrives and the last lines are kept for the error message.
    nsys writes its report into a private folder beside ``plan.report``, renamed into place when
    it is done (``destinations``). No time limit unless ``nsys.timeout_s`` (--nsys-timeout):
    then the recording is stopped as Ctrl-C would stop it, and nsys killed if it does not
    finish its report within a minute.
    """
    env = plan.environ(os.environ if environ is None else environ)
    option = destinations.NSYS_RECORDING
    destinations.check(plan.report, option)
    staging = Path(_staging_folder(plan.report))
    staged = replace(plan, prefix=staging / plan.prefix.name)
    keep_staging = False
    try:
        try:
            proc = subprocess.Popen(
                staged.argv(nsys.path),
                env=env,
                stdout=stdout,
                stderr=subprocess.PIPE if stderr_sink is not None else None,
            )
        except OSError as err:
            raise NsysError(f"cannot run {nsys.path} ({err.strerror}); {INSTALL_HINT}") from None
        tail: deque[str] = deque(maxlen=_TAIL_LINES)
        relay = None
        if stderr_sink is not None and proc.stderr is not None:
            relay = threading.Thread(
                target=_relay, args=(proc.stderr, stderr_sink, tail), daemon=True
            )
            relay.start()
        started = time.monotonic()
        received = wait_forwarding_signals(proc, nsys.timeout_s)
        timed_out = nsys.timeout_s is not None and time.monotonic() - started >= nsys.timeout_s
        if relay is not None:
            # A grandchild that outlives nsys can hold the pipe open; don't wait for it forever.
            relay.join(timeout=2)
        written = staged.report.is_file()
        if written:
            try:
                destinations.place(staged.report, plan.report, option)
            except InputError as err:
                keep_staging = True  # an hour's recording is not thrown away
                raise InputError(f"{err}; the recording is kept as {staged.report}") from None
        return ProfileOutcome(
            returncode=proc.returncode,
            report=plan.report if written else None,
            signal=received,
            stderr_tail=" | ".join(tail),
            timed_out=timed_out,
        )
    finally:
        if not keep_staging:
            shutil.rmtree(staging, ignore_errors=True)


def _staging_folder(near: Path) -> str:
    import tempfile

    try:
        return tempfile.mkdtemp(prefix=destinations.TEMP_PREFIX, dir=near.parent)
    except OSError as err:
        raise InputError(
            f"{near.parent}: cannot write the recording there ({err.strerror}); choose another"
            " -o PREFIX"
        ) from None


def _relay(pipe: IO[bytes], sink: Callable[[bytes], None], tail: deque[str]) -> None:
    if hasattr(signal, "pthread_sigmask"):
        # Leave process-directed signals to the main thread, which forwards them.
        signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED_SIGNALS)
    partial = b""
    while chunk := os.read(pipe.fileno(), 65536):
        sink(chunk)
        # Progress bars redraw with \r: each redraw counts as a line.
        *lines, partial = (partial + chunk).replace(b"\r", b"\n").split(b"\n")
        tail.extend(s for ln in lines if (s := ln.decode(errors="replace").strip()))
        partial = partial[-4096:]
    if partial.strip():
        tail.append(partial.decode(errors="replace").strip())
    pipe.close()


def wait_forwarding_signals(
    proc: subprocess.Popen[bytes], timeout_s: float | None = None, kill_after_s: float | None = None
) -> int | None:
    """Wait for ``proc``, passing SIGINT/SIGTERM sent to us on to it; return the last one.
    Past ``timeout_s`` it gets SIGINT (nsys then stops the program and writes its report), and
    SIGKILL if it is still running a minute later. With ``kill_after_s``, a program still
    running that long after the first signal reached it gets SIGKILL: one that ignores SIGTERM
    must not keep nsysfrag waiting forever (its returncode is then -SIGKILL)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    if threading.current_thread() is not threading.main_thread():
        _wait_until(proc, deadline)
        return None
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        # Reached only when no siginfo is available (see _wait_with_siginfo): forward always.
        received.append(signum)
        _send(proc, signum)

    previous = {s: signal.signal(s, forward) for s in _FORWARDED_SIGNALS}
    try:
        if hasattr(signal, "sigtimedwait"):
            _wait_with_siginfo(proc, received, deadline, kill_after_s)
        else:
            _wait_until(proc, deadline)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return received[-1] if received else None


def _wait_until(proc: subprocess.Popen[bytes], deadline: float | None) -> None:
    if deadline is None:
        proc.wait()
        return
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        return
    except subprocess.TimeoutExpired:
        _send(proc, signal.SIGINT)
    try:
        proc.wait(timeout=_PROFILE_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_with_siginfo(
    proc: subprocess.Popen[bytes],
    received: list[int],
    deadline: float | None = None,
    kill_after_s: float | None = None,
) -> None:
    # Ctrl-C in a terminal signals the whole foreground process group, nsys included; sending
    # it a second SIGINT could cut its report short. The sender is known only from siginfo:
    # a terminal's signal comes from the kernel (si_code > 0), kill() from a process (<= 0).
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED_SIGNALS)
    stopped_at: float | None = None
    signalled_at: float | None = None
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if kill_after_s is not None and signalled_at is not None and now - signalled_at > kill_after_s:
                proc.kill()
            if deadline is not None and stopped_at is None and now >= deadline:
                stopped_at = now  # --nsys-timeout: stop the recording as Ctrl-C would
                _send(proc, signal.SIGINT)
            if stopped_at is not None and now - stopped_at > _PROFILE_GRACE_S:
                proc.kill()
            info = signal.sigtimedwait(_FORWARDED_SIGNALS, 0.1)
            if info is not None:
                received.append(info.si_signo)
                signalled_at = signalled_at or time.monotonic()
                if info.si_code <= 0:
                    _send(proc, info.si_signo)
        # Take signals that came as nsys exited, so they don't surface once unblocked.
        while (info := signal.sigtimedwait(_FORWARDED_SIGNALS, 0)) is not None:
            received.append(info.si_signo)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _send(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        proc.send_signal(signum)
    except OSError:  # it exited meanwhile
        pass


def export_sqlite(
    nsys: Nsys, report: Path, output: Path, option: str = destinations.NSYS_EXPORT
) -> Path:
    """``nsys export --type sqlite`` ``report`` into ``output``, replacing it once complete.

    nsys writes into a private folder beside ``output`` (so it never follows a link there, nor
    leaves half a file under that name), within ``nsys.export_timeout()`` seconds; the export
    is then renamed onto ``output`` if that is no file the run keeps (``destinations``). A
    failure leaves ``output`` as it was.
    """
    with destinations.staging_folder(output, option) as staging:
        staged = staging / output.name
        argv = [str(nsys.path), "export", "--type", "sqlite", "--force-overwrite=true",
                "--output", str(staged), str(report)]
        fix = f"{report} may be damaged; pass --nsys-timeout SECONDS to give nsys longer"
        proc = _run(argv, nsys.export_timeout(), fix)
        if proc.returncode != 0:
            raise NsysError(
                f"nsys export failed on {report} (exit {proc.returncode}): "
                f"{_tail(proc.stderr, proc.stdout)}; the report may be incomplete or newer than"
                f" {nsys.version} (pass --nsys to use another nsys)"
            )
        if not staged.is_file() or staged.stat().st_size == 0:
            raise NsysError(
                f"nsys export wrote no {output} for {report} ({_tail(proc.stderr, proc.stdout)});"
                f" the report may be damaged or newer than {nsys.version} (pass --nsys to use"
                " another nsys)"
            )
        destinations.place(staged, output, option)
    return output


@dataclass(frozen=True, slots=True)
class ExportPlan:
    """Where the SQLite export of a report lives and whether it can be reused."""

    path: Path
    reusable: bool
    # An X.sqlite next to the report that did not come from it: left alone, noted to the user.
    avoided: Path | None = field(default=None)


def plan_export(report: Path, cache_dir: Path | None = None, reexport: bool = False) -> ExportPlan:
    """``X.nsys-rep`` exports to ``X.sqlite`` beside it (or in ``cache_dir``).

    An existing ``X.sqlite`` that some other report (or no report) produced is never
    overwritten: the export goes to ``X.nsysfrag.sqlite`` instead, unless that too is some
    other file (then InputError). An export is reused when it came from this report and is
    newer than it, unless ``reexport``.
    """
    path, fallback = export_candidates(report, cache_dir)
    avoided = None
    if os.path.lexists(path) and not exported_from(path, report):
        path, avoided = fallback, path
        if os.path.lexists(path) and not exported_from(path, report):
            raise InputError(
                f"{avoided} and {path} are both there and neither was exported from"
                f" {report.name}; nsysfrag replaces neither: move one away, or pass --cache-dir"
                " DIR for the export"
            )
    reusable = (
        not reexport
        and path.is_file()
        and path.stat().st_mtime_ns > report.stat().st_mtime_ns
        and exported_from(path, report)
    )
    return ExportPlan(path, reusable, avoided)


def export_candidates(report: Path, cache_dir: Path | None = None) -> tuple[Path, Path]:
    """Where the export of ``report`` goes: ``X.sqlite``, else ``X.nsysfrag.sqlite`` when the
    first is some other file (beside the report, or in ``cache_dir``)."""
    folder = report.parent if cache_dir is None else cache_dir
    stem = report.name[: -len(report.suffix)] if report.suffix else report.name
    return folder / f"{stem}.sqlite", folder / f"{stem}.nsysfrag.sqlite"


def exported_from(export: Path, report: Path) -> bool:
    """Does ``export``'s metadata name ``report`` as its input? (Absolute paths decide first.)"""
    values = export_inputs(export)
    absolute = [v for v in values if os.path.isabs(v)]
    if absolute:
        return any(_same_file(v, report) for v in absolute)
    # Only a name (or a path relative to an unknown folder) was recorded.
    return any(re.split(r"[\\/]", v)[-1] == report.name for v in values)


def _same_file(recorded: str, report: Path) -> bool:
    try:
        return os.path.samefile(recorded, report)
    except OSError:
        return os.path.normpath(recorded) in {str(report.absolute()), str(report.resolve())}

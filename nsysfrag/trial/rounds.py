"""``nsysfrag record --try``: the round. The command runs once as given (the baseline), then
once per setting with that setting merged into its PYTORCH_CUDA_ALLOC_CONF, each run a fresh
process recorded exactly as ``nsysfrag record`` records one, into ``OUT/<setting>/``;
``--repeat N`` runs the whole round N times (``OUT/<setting>.r<k>/``), ``--duration S`` ends
each run after S seconds with SIGTERM, which the recorder answers with the final snapshots.

This module runs the programs and says what happened to each run; ``measure`` reads the figures,
``predict`` asks ``whatif``, ``compare`` weighs them.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nsysfrag.errors import InputError
from nsysfrag.inputs.nsys.runner import wait_forwarding_signals
from nsysfrag.limits import TRY_GRACE_S
from nsysfrag.record import launch, layout
from nsysfrag.record.bootstrap.nsysfrag_recorder.options import Options
from nsysfrag.trial.settings import BASELINE, CONF_VARIABLES, TrySetting, merged
from nsysfrag.record.watch import Rater, Watch

ROUND_DOCUMENT = "try.json"  # the round's own document, in OUT beside the run folders
EXIT = "exit"  # the program ended by itself
DURATION = "duration"  # --duration ended it (SIGTERM)
KILLED = "killed"  # it outlived --duration by the grace: SIGKILL
STOPPED = "stopped"  # nsysfrag itself was sent SIGINT/SIGTERM: the round stops


@dataclass(frozen=True, slots=True)
class RunPlan:
    setting: TrySetting | None  # None: the baseline
    repeat: int  # 1..N
    folder: Path

    @property
    def label(self) -> str:
        return BASELINE if self.setting is None else str(self.setting)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    plan: RunPlan
    conf_variable: str
    conf: str  # the PYTORCH_CUDA_ALLOC_CONF the run was given
    exit_code: int
    ended: str  # EXIT, DURATION, KILLED or STOPPED
    wall_s: float
    received: int | None = None  # STOPPED: the signal nsysfrag received (and passed on)


@dataclass
class Round:
    """What the round ran, in order, and the settings it refused on the way."""

    runs: list[RunOutcome] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (setting, why)
    stopped: bool = False


def folder_for(out: Path, setting: TrySetting | None, repeat: int, repeats: int) -> Path:
    name = BASELINE if setting is None else setting.folder
    return out / (name if repeats == 1 else f"{name}.r{repeat}")


def prepare_round(out: Path, overwrite: bool) -> None:
    """``OUT`` new or empty, or an earlier round replaced with ``overwrite``; refused before
    anything runs otherwise."""
    if out.exists() and not out.is_dir():
        raise InputError(f"-o {out}: is a file, not a folder; name a folder for the round")
    if out.is_dir() and any(out.iterdir()):
        if not (out / ROUND_DOCUMENT).is_file():
            raise InputError(
                f"-o {out}: the folder is not empty and holds no round of --try; name a new or"
                " empty folder"
            )
        if not overwrite:
            raise InputError(
                f"-o {out}: already holds a round of --try; pass --overwrite to replace it, or"
                " name another folder"
            )
        for child in out.iterdir():  # only what a round wrote: its record folders, its document
            if child.is_dir() and not child.is_symlink() and layout.is_record(child):
                shutil.rmtree(child)
        (out / ROUND_DOCUMENT).unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"-o {out}: cannot make the folder ({err.strerror})") from None


def run_round(
    command: tuple[str, ...],
    out: Path,
    settings: Sequence[TrySetting],
    repeats: int,
    duration_s: float | None,
    options: Options,
    environ: Mapping[str, str],
    conf_variable: str,
    stdout: int | None,
    say: Callable[[str], None],
    after_baseline: Callable[[RunOutcome], tuple[list[TrySetting], list[tuple[str, str]]]],
    alert_command: str | None = None,
) -> Round:
    """Baseline first, then each setting, ``repeats`` times over. ``after_baseline`` sees the
    first baseline run and returns the settings to try (``--try auto`` chooses them there; a
    setting the program turns out to set itself is refused there) with those refused."""
    result = Round()
    chosen = list(settings)
    for k in range(1, repeats + 1):
        i = 0
        while i <= len(chosen):  # the baseline, then each setting (auto chooses after it)
            setting = None if i == 0 else chosen[i - 1]
            i += 1
            plan = RunPlan(setting, k, folder_for(out, setting, k, repeats))
            of = f" (round {k} of {repeats})" if repeats > 1 else ""
            say(f"run {len(result.runs) + 1}: {plan.label}{of}")
            outcome = run_one(
                command, plan, options, environ, conf_variable, stdout, duration_s, say,
                alert_command,
            )
            result.runs.append(outcome)
            if outcome.ended == STOPPED:
                result.stopped = True
                return result
            if k == 1 and setting is None:
                chosen, refused = after_baseline(outcome)
                result.refused += refused
    return result


def run_one(
    command: tuple[str, ...],
    plan: RunPlan,
    options: Options,
    environ: Mapping[str, str],
    conf_variable: str,
    stdout: int | None,
    duration_s: float | None,
    say: Callable[[str], None],
    alert_command: str | None = None,
) -> RunOutcome:
    """One run in a fresh process, recorded into its folder, watched as ``record`` watches."""
    conf = merged(environ.get(conf_variable, ""), plan.setting)
    base = dict(environ)
    if conf:
        base[conf_variable] = conf
    layout.prepare(plan.folder, command, {**options.as_dict(), "try": plan.label}, overwrite=False)
    env = launch.command_environment(plan.folder, options, base)
    started_ns = time.time_ns()
    watch = Watch(plan.folder, options.interval_s, Rater(started_ns, say, alert_command))
    watch.start()
    started = time.monotonic()
    try:
        proc = subprocess.Popen(command, env=env, stdout=stdout)
    except OSError as err:
        watch.stop()
        raise InputError(
            f"{command[0]}: cannot run it ({err.strerror}); check the command after --"
        ) from None
    ended: list[str] = []
    timers = _end_after(proc, duration_s, ended)
    try:
        received = wait_forwarding_signals(proc)
    finally:
        for t in timers:
            t.cancel()
        watch.stop()
    wall = time.monotonic() - started
    how = STOPPED if received is not None else (ended[-1] if ended else EXIT)
    code = launch.Outcome(proc.returncode, received).exit_code
    layout.update_marker(plan.folder, status="ended", ended_unix_ns=time.time_ns(), exit_code=code,
                         signal=received, ended_by=how)  # fmt: skip
    return RunOutcome(plan, conf_variable, conf, code, how, wall, received)


def _end_after(
    proc: subprocess.Popen[bytes], duration_s: float | None, ended: list[str]
) -> list[threading.Timer]:
    """SIGTERM at ``duration_s`` (what ``record`` passes on when it is itself ended: the
    recorder's handler writes the final snapshots), SIGKILL a grace later."""
    if duration_s is None:
        return []
    grace = TRY_GRACE_S.value()

    def send(signum: int, why: str) -> None:
        if proc.poll() is None:
            ended.append(why)
            try:
                proc.send_signal(signum)
            except OSError:
                pass  # it ended meanwhile

    timers = [
        threading.Timer(duration_s, send, (signal.SIGTERM, DURATION)),
        threading.Timer(duration_s + grace, send, (signal.SIGKILL, KILLED)),
    ]
    for t in timers:
        t.daemon = True
        t.start()
    return timers


def conf_seen(folder: Path) -> dict[int, str]:
    """The PYTORCH_CUDA_ALLOC_CONF each rank's process saw when CUDA started (its
    ``process.json``): what the program set itself, ours merged in or not."""
    import json

    seen: dict[int, str] = {}
    for r in layout.rank_folders(folder):
        try:
            about = json.loads(r.process.read_bytes()[: 1 << 20])
        except (OSError, ValueError, RecursionError):
            continue
        env = about.get("allocator_env") if isinstance(about, dict) else None
        if isinstance(env, dict):
            values = [env.get(v) for v in CONF_VARIABLES]
            seen.setdefault(r.rank, next((v for v in values if isinstance(v, str) and v), ""))
    return seen


def environment_conf(environ: Mapping[str, str]) -> dict[str, str]:
    """The allocator variables of our own environment, for the document."""
    return {k: environ[k] for k in CONF_VARIABLES if k in environ}


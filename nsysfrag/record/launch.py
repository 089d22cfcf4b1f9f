"""Running the recorded command: its environment arms the recorder in every Python process it
starts, and the signals ``nsysfrag`` receives reach it.

The command stays in nsysfrag's process group, so a Ctrl-C at the terminal reaches every
process of it (torchrun and its workers alike) at once, as it would without nsysfrag; a signal
sent to nsysfrag alone (``kill``) is passed on to the command, as ``profile`` does.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nsysfrag.errors import InputError
from nsysfrag.inputs.nsys.runner import wait_forwarding_signals
from nsysfrag.limits import RECORD_GRACE_S
from nsysfrag.record.bootstrap import BOOTSTRAP_DIR
from nsysfrag.record.bootstrap.nsysfrag_recorder.names import ENV_DIR, ENV_OPTIONS
from nsysfrag.record.bootstrap.nsysfrag_recorder.options import Options


@dataclass(frozen=True, slots=True)
class Outcome:
    returncode: int
    signal: int | None  # the last SIGINT/SIGTERM nsysfrag received while it ran

    @property
    def exit_code(self) -> int:
        """As a shell reports it: a death by signal N is 128 + N."""
        return self.returncode if self.returncode >= 0 else 128 - self.returncode


def command_environment(
    out: Path, options: Options, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``base`` (our own environment) with the record folder, the options, and the bootstrap
    first on ``PYTHONPATH``."""
    env = dict(os.environ if base is None else base)
    env[ENV_DIR] = str(out.resolve())
    env[ENV_OPTIONS] = options.to_json()
    existing = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), existing) if p)
    return env


def run(command: tuple[str, ...], env: Mapping[str, str], stdout: int | None) -> Outcome:
    """Run ``command`` to its end; its stdin and stderr are ours, its stdout too unless
    ``stdout`` names another descriptor (the report owns stdout with ``--json -``)."""
    try:
        proc = subprocess.Popen(command, env=dict(env), stdout=stdout)
    except OSError as err:
        raise InputError(f"{command[0]}: cannot run it ({err.strerror}); check the command after --") from None
    # A program that ignores the signal is killed a grace later: nothing waits forever, and
    # what its processes wrote before stays in the record.
    received = wait_forwarding_signals(proc, kill_after_s=RECORD_GRACE_S.value())
    return Outcome(proc.returncode, received)

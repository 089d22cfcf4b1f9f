"""The contract every hostile or unlucky input must keep, checked on the real command line.

A user's CI job must never hang, blow up or lose a file because of a bad input. Each case runs
``python -m nsysfrag ARGS`` in a fresh process under a wall-clock limit and an address-space
limit, and then checks:

- it finished within ``timeout_s`` (30 s) under a 4 GiB address-space limit;
- the exit code is 0 or 2 (or whatever ``allowed_codes`` says, e.g. 1 for a tripped gate);
- stderr is at most one line, with no "internal error" and no traceback (besides lines that
  start with one of ``notes``, e.g. the nsys a run used);
- every input listed in ``inputs`` has the same bytes and mtime afterwards.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
ADDRESS_SPACE_BYTES = 4 << 30
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def _limit_address_space() -> None:  # runs in the child, before exec
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))


FINGERPRINT_BYTES = 64 << 20  # of a larger file (a sparse terabyte): these, its size and blocks


def _fingerprint(path: Path) -> tuple[bytes, int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    if not os.path.isfile(path):
        return b"", st.st_mtime_ns, 0, 0
    with open(path, "rb") as f:
        head = f.read(FINGERPRINT_BYTES)
    return head, st.st_mtime_ns, st.st_size, st.st_blocks


def run_nsysfrag(
    args: Sequence[str | os.PathLike[str] | bytes],
    *,
    inputs: Sequence[Path] = (),
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    timeout_s: float = TIMEOUT_S,
    allowed_codes: Sequence[int] = (0, 2),
    notes: Sequence[str] = (),
) -> Outcome:
    """Run the CLI on ``args`` and assert the hostile-input contract; return what it printed."""
    before = {p: _fingerprint(p) for p in inputs}
    full_env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1", **(env or {}))
    full_env.pop("NSYSFRAG_DEBUG", None)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "nsysfrag", *args],
            check=False,
            cwd=cwd or REPO,
            env=full_env,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            preexec_fn=_limit_address_space,
        )
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"nsysfrag {list(args)!r} ran past {timeout_s:.0f} s") from err
    stdout = proc.stdout.decode("utf-8", "replace")
    stderr = proc.stderr.decode("utf-8", "replace")
    check_outcome(proc.returncode, stderr, before, allowed_codes, notes)
    return Outcome(proc.returncode, stdout, stderr)


def check_outcome(
    returncode: object,
    stderr: str,
    before: dict[Path, tuple[bytes, int, int, int] | None],
    allowed_codes: Sequence[int],
    notes: Sequence[str] = (),
) -> None:
    """The contract on what a finished run left: its exit code, its stderr, its inputs."""
    assert returncode in allowed_codes, (
        f"exit {returncode} (allowed {list(allowed_codes)}); stderr: {stderr[-2000:]}"
    )
    lines = [ln for ln in stderr.splitlines() if not ln.startswith(tuple(notes))]
    assert len(lines) <= 1, f"stderr must be at most one line, got {len(lines)}: {stderr[-2000:]}"
    assert "internal error" not in stderr, stderr
    assert "Traceback" not in stderr, stderr
    for path, fingerprint in before.items():
        assert _fingerprint(path) == fingerprint, f"{path} was modified"

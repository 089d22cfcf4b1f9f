"""README's two commands, as a new user runs them, leave a CLI that works from any folder.

On a copy of this checkout in a deep path, with a fresh virtual environment: README's try-it
command (``pip install .`` then ``nsysfrag analyze``), then its test command's install
(``pip install -e '.[test]'``), and the reverse order; after each, ``nsysfrag --version`` and
an analysis from another folder must work. Once, a regular install's first run wrote numba's
cache into ``site-packages/nsysfrag``; pip left that folder behind on the editable install and
every later call failed with ``cannot import name '__version__'``.

The commands are taken from README.md, so the test follows README. To stay offline and quick,
pip gets ``--no-deps --no-build-isolation --no-index`` and the new environment sees the test
environment's packages (numba, pandas, setuptools, …) through a ``.pth`` file; the test
command's ``pytest`` run is replaced by the two CLI checks. Compiled kernels go to a fresh
cache folder, so this also checks that the first run on a sample compiles nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.conftest import REPO

README = REPO / "README.md"
SAMPLE = "sample_traces/inference_serving.sqlite"
SNAPSHOT = "sample_traces/training_snapshot.pickle"
OFFLINE = ["--no-deps", "--no-build-isolation", "--no-index"]
# Far deeper than any header line fits in: a report must not depend on where the clone is.
DEEP = Path(*(["a-folder-with-a-long-name"] * 8))


def readme_commands() -> tuple[str, str]:
    """README's try-it command and its test command, verbatim."""
    found = re.findall(r"^python3 -m venv \.venv && .*$", README.read_text(), re.MULTILINE)
    try_it = next(c for c in found if "pip install . " in c and "nsysfrag analyze" in c)
    tests = next(c for c in found if "pip install -e " in c and "pytest" in c)
    return try_it, tests


def _copy_checkout(target: Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=False,
    )  # fmt: skip
    if listed.returncode == 0 and listed.stdout:
        for name in listed.stdout.decode().split("\0"):
            if name and (REPO / name).is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, target / name)
    else:  # not a git checkout (a source archive): everything but what git would ignore
        ignore = shutil.ignore_patterns(".venv", "__pycache__", ".*_cache", ".hypothesis", "*.nb?")
        shutil.copytree(REPO, target, ignore=ignore, dirs_exist_ok=True)


class Clone:
    """A copy of the checkout, where README's commands run as a user would run them."""

    def __init__(self, root: Path, cache: Path) -> None:
        self.root = root
        self.env = {**os.environ, "XDG_CACHE_HOME": str(cache), "NO_COLOR": "1"}
        # A user's environment: no NSYSFRAG_KERNELS either (the suite's conftest sets it).
        for name in ("PYTHONPATH", "NUMBA_CACHE_DIR", "NSYSFRAG_DEBUG", "VIRTUAL_ENV",
                     "NSYSFRAG_KERNELS"):  # fmt: skip
            self.env.pop(name, None)

    def sh(self, argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            argv, cwd=cwd or self.root, env=self.env, capture_output=True, text=True, timeout=600,
            check=False,
        )
        assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def run_readme(self, command: str) -> list[subprocess.CompletedProcess[str]]:
        """``python3 -m venv .venv && .venv/bin/pip install X && REST``: the venv, the install
        (offline), and REST unless it is the test suite."""
        parts = [p.strip() for p in command.split("&&")]
        assert parts[0] == "python3 -m venv .venv", command
        self.sh([sys.executable, "-m", "venv", ".venv"])  # over an existing one, as a user would
        self._see_test_packages()
        install = parts[1].split()
        assert install[:2] == [".venv/bin/pip", "install"], command
        self.sh([*install[:2], *OFFLINE, *(a.strip("'") for a in install[2:])])
        done = []
        for rest in parts[2:]:
            if "pytest" not in rest:
                done.append(self.sh(rest.split()))
        return done

    def _see_test_packages(self) -> None:
        """The new environment uses this environment's packages instead of downloading them;
        its own setuptools (an old one bundled by venv on some Pythons) steps aside."""
        self.sh([".venv/bin/python", "-m", "pip", "uninstall", "-q", "-y", "setuptools"])
        purelib = self.site_packages()
        (purelib / "zz-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    def site_packages(self) -> Path:
        out = self.sh([".venv/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        return Path(out.stdout.strip())

    def check_cli_anywhere(self, elsewhere: Path) -> None:
        nsysfrag = str(self.root / ".venv" / "bin" / "nsysfrag")
        version = self.sh([nsysfrag, "--version"], cwd=elsewhere)
        assert version.stdout.startswith("nsysfrag, version "), version.stdout
        for sample in (SAMPLE, SNAPSHOT):  # an nsys trace and a snapshot: both models' code
            argv = [nsysfrag, "analyze", str(self.root / sample), "-q", "--json", "-"]
            assert '"schema": "nsysfrag/1"' in self.sh(argv, cwd=elsewhere).stdout


def _package_holds_only_python(folder: Path) -> None:
    strays = [p for p in folder.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    assert not strays, f"files other than Python in the package folder: {strays[:5]}"


def test_readme_commands_in_order_then_reversed_leave_a_working_cli(tmp_path: Path) -> None:
    try_it, tests = readme_commands()
    root = tmp_path / DEEP / "nsysfrag"
    cache = tmp_path / "cache"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _copy_checkout(root)
    clone = Clone(root, cache)

    # README's order: try it, then set up for the tests.
    (analyzed,) = clone.run_readme(try_it)
    assert "observed device pages" in analyzed.stdout
    # A sample this small runs the kernels interpreted: no compile wait, nothing cached.
    assert "compiling" not in analyzed.stderr
    installed = clone.site_packages() / "nsysfrag"
    _package_holds_only_python(installed)
    assert not list((cache / "nsysfrag").rglob("*.nbi")), "a kernel compiled for a sample"
    # What an older nsysfrag's first run left there; pip does not remove it on uninstall.
    (installed / "__pycache__" / "replay._replay_kernel-267.py311.nbi").write_bytes(b"old")
    assert clone.run_readme(tests) == []
    clone.check_cli_anywhere(elsewhere)
    _package_holds_only_python(root / "nsysfrag")

    # The reverse order, in a fresh environment.
    shutil.rmtree(root / ".venv")
    clone.run_readme(tests)
    clone.check_cli_anywhere(elsewhere)
    (analyzed,) = clone.run_readme(try_it)
    assert "observed device pages" in analyzed.stdout
    clone.check_cli_anywhere(elsewhere)
    _package_holds_only_python(clone.site_packages() / "nsysfrag")
    _package_holds_only_python(root / "nsysfrag")

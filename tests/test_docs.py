"""The README and the documentation site say what the code does today.

- docs/commands/ is exactly what ``python -m tests.docs_pages`` makes from the commands' help,
  every command has a page in the site's navigation, and every option has help text;
- every command's ``--help`` ends its description with an Examples block;
- every example command of README.md, of docs/ and of the commands' Examples blocks is run here,
  in a folder that holds the sample inputs under the names the examples use, and must succeed;
  each output shown (a ``console`` block: ``$ command`` then what it prints, ``…`` where lines
  are left out) must be what the command prints today at 80 columns. A command that needs what
  this machine lacks (nsys, a GPU, a cluster) is named by its need and skipped;
- README stays short and points only at files that exist; the site builds with ``--strict``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from nsysfrag.cli import COMMANDS, cli
from tests import docs_pages
from tests.conftest import REAL_SNAPSHOTS, REPO, SAMPLES

README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 250


# ---------------------------------------------------------------- the commands' help and pages


def _command(name: str) -> click.Command:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, name
    return command


def test_the_command_pages_are_the_commands_help() -> None:
    stale = [
        str(path.relative_to(REPO))
        for path, text in docs_pages.pages().items()
        if not path.is_file() or path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"out of date (run `python -m tests.docs_pages`): {stale}"
    extra = {p.name for p in docs_pages.PAGES.glob("*.md")} - {p.name for p in docs_pages.pages()}
    assert not extra, f"pages of no command: {sorted(extra)}"


def test_every_command_has_a_page_in_the_site_navigation() -> None:
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [name for name in COMMANDS if f"commands/{name}.md" not in nav]
    assert not missing, missing
    assert "commands/index.md" in nav


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_and_argument_has_help(name: str) -> None:
    command = _command(name)
    assert (command.help or "").strip(), f"{name} has no help"
    assert command.short_help or command.help
    described = command.help or ""
    for param in command.params:
        if isinstance(param, click.Option):
            assert (param.help or "").strip(), f"nsysfrag {name} {param.opts[0]} has no help text"
        elif isinstance(param, click.Argument):
            metavar = (param.metavar or param.name or "").upper().rstrip(".")
            assert metavar in described, f"nsysfrag {name}: argument {metavar} is not described"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_matches_the_page_and_ends_with_examples(name: str) -> None:
    # The real command line, as a user runs it at 80 columns.
    shown = _nsysfrag([name, "--help"], env={**os.environ, "COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.rstrip("\n") == docs_pages.command_help(name).rstrip("\n")
    assert help_examples(name), f"nsysfrag {name} --help has no Examples block"
    shown_lines = {line.strip() for line in shown.stdout.splitlines()}
    for line in _example_lines(name):
        # click's \b paragraph keeps each line of the examples as written
        assert line in shown_lines, line


def _nsysfrag(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nsysfrag", *argv], capture_output=True, text=True, env=env,
        timeout=120, check=False,
    )  # fmt: skip


def _example_lines(name: str) -> list[str]:
    text = _command(name).help or ""
    if "Examples:" not in text:
        return []
    block = text.split("Examples:", 1)[1]
    return [ln.strip() for ln in block.splitlines() if ln.strip() and ln.strip() != "\b"]


def help_examples(name: str) -> list[str]:
    """The example commands of a command's help (continuation lines joined)."""
    return list(_joined(_example_lines(name)))


# ---------------------------------------------------------------- README


def test_readme_is_short_and_its_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    for target in re.findall(r"\]\(([^)]+)\)", text):
        path = target.split("#")[0]
        assert not re.match(r"[a-z]+:", target), f"README points outside the repository: {target}"
        assert (REPO / path).exists(), f"README links to a missing file: {target}"


def test_no_page_speaks_of_a_specification() -> None:
    pages = [README, *sorted(DOCS.rglob("*.md"))]
    found = [
        f"{p.relative_to(REPO)}:{n}"
        for p in pages
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"specification|\bspec\b", line, re.IGNORECASE)
    ]
    assert not found, found


def test_the_screenshot_is_a_small_png() -> None:
    image = DOCS / "images" / "html-report.png"
    data = image.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) < 300_000
    assert "images/html-report.png" in README.read_text(encoding="utf-8")


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="the docs extra is not installed (pip install -e '.[docs]')")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    site = tmp_path / "site"
    assert (site / "commands" / "analyze.html").is_file()
    # Opened from disk (file://), every link between pages names a file that exists: main
    # linked folders ("ci/"), which a browser shows as a directory listing without a server.
    for page in site.rglob("*.html"):
        for link in re.findall(r'href="([^"#:]*)(?:#[^"]*)?"', page.read_text(encoding="utf-8")):
            if link and not link.startswith("/") and page.name != "404.html":  # 404: served only
                target = (page.parent / link).resolve()
                assert target.is_file(), f"{page.relative_to(site)} links {link!r}, not a file"


# ---------------------------------------------------------------- example commands


@dataclass(frozen=True)
class Example:
    where: str  # file:line
    command: str
    output: tuple[str, ...] | None = None  # what a console block shows it printing

    def __str__(self) -> str:
        return f"{self.where}: {self.command}"


# What an example needs that this machine may not have; such an example is skipped, by name.
NEEDS = [
    (r"^nsysfrag profile\b", "nsys and a CUDA program to record"),
    (r"^nsys\s", "nsys and a CUDA program to record"),
    (r"\.nsys-rep\b|\.qdrep\b", "nsys, to export the report"),
    (r"^nsysfrag record\b", "PyTorch with a GPU and a training script"),
    (r"\bnsysfrag-record\b|\bruns/oom\b", "a record made by nsysfrag record on a GPU"),
    (r"DASK_SCHEDULER_ADDRESS=|--scheduler\b", "a Dask cluster"),
    (r"postgresql", "a PostgreSQL server"),
]
# Commands in the docs that are not nsysfrag examples, and what checks each.
CHECKED_ELSEWHERE = [
    (r"^python3 -m venv \.venv && ", "README's set-up commands: tests/test_install.py"),
    (r"^\.venv/bin/pip install -e '\.\[docs\]' && \.venv/bin/mkdocs build --strict", "test_the_site_builds_strictly"),
    (r"^\.venv/bin/python -m tests\.docs_pages\b", "test_the_command_pages_are_the_commands_help"),
    (r"^(\w+=\S+ )*\.venv/bin/python -m pytest\b", "the test suite itself"),
    (r"^\.venv/bin/pip install ruff mypy\b", "the linters (a developer's check)"),
    (r"^python benchmarks/", "a benchmark: minutes of CPU, run by hand (docs/performance.md)"),
    (r"^PYTHONPATH=\. \.venv/bin/python sample_traces/make_samples\.py$", "tests/test_samples.py"),
]  # fmt: skip
# A gate or a check may trip: exit 1 is one of its answers.
MAY_TRIP = re.compile(r"--fail-on|--check\b")


def _joined(lines: list[str]) -> Iterator[str]:
    """Shell lines with their trailing comments dropped and backslash continuations joined."""
    pending = ""
    for raw in lines:
        line = re.sub(r"\s{2,}#.*$", "", raw).rstrip()
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        command = (pending + line.strip()).strip()
        pending = ""
        if command and not command.startswith("#"):
            yield command


def _fenced_blocks(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^(\s*)```(\w*)", lines[i])
        if not opening:
            i += 1
            continue
        start, language, body = i + 1, opening.group(2), []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        yield start + 1, language, body


def doc_examples() -> list[Example]:
    """Every command of README.md and docs/ (but the generated command pages: their examples
    are the help's, collected below)."""
    found: list[Example] = []
    pages = [README, *sorted(p for p in DOCS.rglob("*.md") if p.parent != docs_pages.PAGES)]
    for page in pages:
        where = page.relative_to(REPO)
        for line_no, language, body in _fenced_blocks(page):
            if language in ("sh", "bash", "shell"):
                found += [Example(f"{where}:{line_no}", c) for c in _joined(body)]
            elif language == "console":
                found += _console_examples(f"{where}:{line_no}", body)
            elif language == "yaml":  # a CI workflow: its nsysfrag steps
                steps = [s for s in _joined(_yaml_commands(body))]
                found += [Example(f"{where}:{line_no}", c) for c in steps]
    return found


def _yaml_commands(body: list[str]) -> list[str]:
    """The shell lines of a workflow's steps that run nsysfrag (with their continuations)."""
    out: list[str] = []
    continuing = False
    for raw in body:
        line = raw.strip().removeprefix("- ").removeprefix("run: ").strip()
        if line.startswith("nsysfrag ") or continuing:
            out.append(line)
            continuing = line.endswith("\\")
    return out


def _console_examples(where: str, body: list[str]) -> list[Example]:
    examples: list[Example] = []
    command: str | None = None
    output: list[str] = []
    for line in [*body, "$ "]:
        if line.startswith("$ "):
            if command is not None:
                examples.append(Example(where, command, tuple(output)))
            command, output = line[2:].strip() or None, []
        else:
            output.append(line.rstrip())
    return examples


def help_example_list() -> list[Example]:
    return [Example(f"nsysfrag {n} --help", c) for n in sorted(COMMANDS) for c in help_examples(n)]


def _need(command: str) -> str | None:
    for pattern, need in NEEDS:
        if re.search(pattern, command):
            return need
    if re.search(r"\|\s*jq\b", command) and shutil.which("jq") is None:
        return "jq"
    return None


def _checked_elsewhere(command: str) -> str | None:
    return next((why for pattern, why in CHECKED_ELSEWHERE if re.search(pattern, command)), None)


def _examples() -> list[object]:
    params: list[object] = []
    for example in [*doc_examples(), *help_example_list()]:
        if _checked_elsewhere(example.command):
            continue
        need = _need(example.command)
        marks = [pytest.mark.skip(reason=f"needs {need}")] if need else []
        params.append(pytest.param(example, marks=marks, id=str(example)[:120]))
    return params


def test_every_command_in_the_docs_is_known() -> None:
    """A command that is neither nsysfrag nor checked by another test needs a rule above."""
    unknown = [
        str(e)
        for e in doc_examples()
        if not re.match(r"nsysfrag(\s|$)", e.command)
        and _checked_elsewhere(e.command) is None
        and _need(e.command) is None
    ]
    assert not unknown, unknown
    readme_setup = [e.command for e in doc_examples() if e.command.startswith("python3 -m venv")]
    from tests.test_install import readme_commands

    assert set(readme_setup) == set(readme_commands()), "a set-up command differs from README's"


# The inputs the examples name, made from the samples: (name, sample it is a copy of).
STAND_INS = {
    "run.sqlite": "training_loop.sqlite",
    "snap.pickle": "torch_fragmentation_snapshot.pickle",
    "runs/rank0.sqlite": "training_loop.sqlite",
    "runs/rank1.sqlite": "inference_serving.sqlite",
    "runs/worker0/trace.sqlite": "training_loop.sqlite",
    "runs/worker1/trace.sqlite": "churn_anomalies.sqlite",
    "snapshots/snapshot_0.pickle": "training_snapshot.pickle",
    "snapshots/snapshot_1.pickle": "inference_snapshot.pickle",
    "out/run.sqlite": "training_loop.sqlite",
    "ctx128.pickle": "torch_fragmentation_snapshot.pickle",
    "ctx256.pickle": "torch_capacity_snapshot.pickle",
    "runs/monday/rank0.sqlite": "training_loop.sqlite",
    "runs/monday/rank1.sqlite": "inference_serving.sqlite",
    "runs/tuesday/rank0.sqlite": "training_loop.sqlite",
    "runs/tuesday/rank1.sqlite": "churn_anomalies.sqlite",
}
# Earlier analyses the examples compare with: (name, the stand-in analyzed).
DOCUMENTS = {"base.json": "run.sqlite", "run.json": "run.sqlite", "main.json": "run.sqlite",
             "baseline/run.json": "out/run.sqlite", "last-week.json": "run.sqlite"}  # fmt: skip


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("examples")
    (root / "sample_traces").symlink_to(SAMPLES)
    for name, sample in STAND_INS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SAMPLES / sample, root / name)
    bin_dir = root / ".bin"
    bin_dir.mkdir()
    launcher = bin_dir / "nsysfrag"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m nsysfrag "$@"\n')
    launcher.chmod(0o755)
    env = {
        **os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "80",
        "NO_COLOR": "1", "NSYSFRAG_DB": str(root / "history.sqlite"), "HOME": str(root / "home"),
    }  # fmt: skip
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    # A user's cache: the compiled kernels stay where the rest of the suite put them.
    env.setdefault("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    for name, source in DOCUMENTS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        made = subprocess.run(["nsysfrag", "analyze", source, "-q", "--json", name], cwd=root,
                              env=env, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert made.returncode == 0, made.stderr
    return root, env


@pytest.mark.parametrize("example", _examples())
def test_example_runs_and_prints_what_the_docs_show(
    example: Example, sandbox: tuple[Path, dict[str, str]]
) -> None:
    root, env = sandbox
    done = subprocess.run(["bash", "-c", example.command], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600, check=False)  # fmt: skip
    allowed = (0, 1) if MAY_TRIP.search(example.command) else (0,)
    assert done.returncode in allowed, f"{example}: exit {done.returncode}\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr and "error:" not in done.stderr, done.stderr[-2000:]
    if example.output is not None:
        assert_shows(example.output, done.stdout, str(example))


def assert_shows(shown: tuple[str, ...], printed: str, where: str) -> None:
    """Each run of lines between `…` lines is printed as such, whole lines, in that order; the
    first and last run are at the start and end of the output unless a `…` says otherwise."""
    actual = [line.rstrip() for line in printed.rstrip("\n").splitlines()]
    lines = list(shown)
    while lines and not lines[-1]:
        lines.pop()
    chunks: list[list[str]] = [[]]
    for line in lines:
        if line == "…":
            chunks.append([])
        else:
            chunks[-1].append(line)
    at = 0
    for index, chunk in enumerate(chunks):
        if not chunk:
            continue
        anchored_start = index == 0
        found = next(
            (i for i in range(at, len(actual) - len(chunk) + 1) if actual[i : i + len(chunk)] == chunk),
            None,
        )
        assert found is not None and (not anchored_start or found == 0), (
            f"{where}: the docs show lines the command does not print today:\n"
            + "\n".join(chunk) + "\n--- it prints:\n" + "\n".join(actual)
        )  # fmt: skip
        at = found + len(chunk)
    if chunks[-1]:
        assert at == len(actual), f"{where}: the command prints more after the lines shown"


@pytest.mark.skipif(not REAL_SNAPSHOTS.is_dir(), reason="../shared/real_snapshots is absent")
def test_the_real_snapshots_page_is_what_its_generator_prints_today() -> None:
    # main quoted figures the tool no longer printed (inference2: 22.69 GiB / 68.7 % where it
    # prints 25.14 GiB / 69.8 %): the page is the generator's output, byte for byte.
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "real_snapshot_table.py"),
                           str(REAL_SNAPSHOTS)], capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    page = (REPO / "docs" / "real-snapshots.md").read_text(encoding="utf-8")
    assert page == done.stdout, (
        "docs/real-snapshots.md differs from what the tool prints; regenerate it with"
        " `python benchmarks/real_snapshot_table.py > docs/real-snapshots.md`"
    )

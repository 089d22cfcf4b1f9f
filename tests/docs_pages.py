"""docs/commands/: one page per command, made from click's own help so that it cannot drift.

    python -m tests.docs_pages               # rewrite docs/commands/ from the commands' help
    python -m tests.docs_pages --screenshot  # render docs/images/html-report.png again

tests/test_docs.py fails when a committed page differs from what this writes, so a change to a
command's help comes with its page. The help is rendered as a terminal 80 columns wide shows it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import click

from nsysfrag.cli import COMMANDS, cli

REPO = Path(__file__).resolve().parent.parent
PAGES = REPO / "docs" / "commands"
# A terminal 80 columns wide: click fills all but two of them.
WIDTH = 80 - 2

# The guide pages that explain each command beyond its options (relative to docs/commands/).
GUIDES: dict[str, list[tuple[str, str]]] = {
    "analyze": [("Reading a report", "../reading-a-report.md"), ("Reports and outputs", "../reports.md"),
                ("CI gates and keys", "../ci.md"), ("Distributed jobs", "../jobs.md")],
    "compare": [("Comparing runs", "../compare.md")],
    "history": [("History", "../history.md")],
    "profile": [("Nsight Systems traces", "../nsys.md")],
    "record": [("PyTorch jobs (record)", "../record.md")],
    "whatif": [("What if", "../whatif.md")],
}  # fmt: skip

_NOTE = "Generated from the command's own help by `python -m tests.docs_pages`: edit the help, not this page."


def _root_context() -> click.Context:
    # The group's settings (-h as well as --help), as `nsysfrag` itself runs with them.
    return click.Context(cli, info_name="nsysfrag", terminal_width=WIDTH, **cli.context_settings)


def _context(command: click.Command, name: str) -> click.Context:
    return click.Context(command, info_name=name, parent=_root_context(), terminal_width=WIDTH)


def command_help(name: str) -> str:
    """`nsysfrag NAME --help` as an 80-column terminal shows it."""
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, name
    return command.get_help(_context(command, name))


def root_help() -> str:
    return cli.get_help(_root_context())


def command_page(name: str) -> str:
    guides = "".join(f"- [{title}]({href})\n" for title, href in GUIDES.get(name, []))
    see_also = f"\nMore on this command:\n\n{guides}" if guides else ""
    return (
        f"# nsysfrag {name}\n\n<!-- {_NOTE} -->\n\n"
        f"```text\n$ nsysfrag {name} --help\n{command_help(name)}\n```\n{see_also}"
    )


def index_page() -> str:
    rows = []
    for name in sorted(COMMANDS):
        command = cli.get_command(click.Context(cli), name)
        assert command is not None, name
        rows.append(f"| [`nsysfrag {name}`]({name}.md) | {command.get_short_help_str(limit=200)} |\n")
    return (
        f"# Commands\n\n<!-- {_NOTE} -->\n\n"
        "Every page here is the command's `--help`, word for word.\n\n"
        "| command | what it does |\n|---|---|\n" + "".join(rows)
        + f"\n```text\n$ nsysfrag --help\n{root_help()}\n```\n"
    )  # fmt: skip


def pages() -> dict[Path, str]:
    """Every generated page, by path."""
    made = {PAGES / "index.md": index_page()}
    for name in sorted(COMMANDS):
        made[PAGES / f"{name}.md"] = command_page(name)
    return made


SCREENSHOT = REPO / "docs" / "images" / "html-report.png"
SCREENSHOT_SAMPLE = REPO / "sample_traces" / "inference_serving.sqlite"
# The part of the page the image shows, in pixels of a 1200-wide window: from the state table to
# the end of the fragmentation timeline (chosen by eye on the page as it is laid out today).
SCREENSHOT_BOX = (0, 1730, 1200, 3190)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]  # fmt: skip


def screenshot() -> None:
    """The README's image: the sample's HTML report in headless Chromium, cropped, 80 % size,
    128 colours (about 100 kB)."""
    from PIL import Image  # matplotlib's own dependency

    with tempfile.TemporaryDirectory() as tmp:
        page, shot = Path(tmp) / "report.html", Path(tmp) / "page.png"
        subprocess.run([sys.executable, "-m", "nsysfrag", "analyze", str(SCREENSHOT_SAMPLE), "-q",
                        "--html", str(page)], check=True, env={**os.environ, "COLUMNS": "80"})  # fmt: skip
        subprocess.run([os.environ.get("CHROMIUM", "/usr/bin/chromium"), *CHROMIUM_FLAGS,
                        "--window-size=1200,6000", f"--screenshot={shot}", page.as_uri()],
                       check=True, capture_output=True, timeout=300)  # fmt: skip
        image = Image.open(shot).convert("RGB").crop(SCREENSHOT_BOX)
        image = image.resize((image.width * 4 // 5, image.height * 4 // 5), Image.Resampling.LANCZOS)
        image.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(SCREENSHOT, optimize=True)
    print(f"{SCREENSHOT.relative_to(REPO)}: {SCREENSHOT.stat().st_size:,} bytes", file=sys.stderr)


def main() -> None:
    if sys.argv[1:] == ["--screenshot"]:
        screenshot()
        return
    PAGES.mkdir(parents=True, exist_ok=True)
    for path, text in pages().items():
        path.write_text(text, encoding="utf-8")
        print(path.relative_to(REPO), file=sys.stderr)


if __name__ == "__main__":
    main()

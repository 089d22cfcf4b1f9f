"""A command our sentences quote in backticks is <code> on an HTML page, and stays backticked on
the terminal; backticks from the input are left as they are."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from nsysfrag.analysis.advice import WHATIF_TRIES
from nsysfrag.cli import cli
from nsysfrag.reporters.html_page import prose
from tests.conftest import SAMPLES


@pytest.mark.parametrize(
    ("text", "markup"),
    [
        ("try it (`nsysfrag whatif` evaluates each).",
         "try it (<code>nsysfrag whatif</code> evaluates each)."),
        ("`a` and `b`", "<code>a</code> and <code>b</code>"),
        ("run `x <y> & z`.", "run <code>x &lt;y&gt; &amp; z</code>."),  # escaped inside too
        ("one` backtick", "one` backtick"),
        ("no`span`here", "no`span`here"),  # inside a word: not ours
        # A site name from the input, quoted, with backticks of its own: left as text, and our
        # own span after it still found.
        ("'a`b' then `nsysfrag whatif`", "&#x27;a`b&#x27; then <code>nsysfrag whatif</code>"),
        ("'`odd` site' was freed", "&#x27;`odd` site&#x27; was freed"),
        ("<script>`", "&lt;script&gt;`"),
    ],
)  # fmt: skip
def test_prose_turns_our_backticked_spans_into_code(text: str, markup: str) -> None:
    assert prose(text) == markup


def run(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args, env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def test_analyze_page_shows_code_where_the_terminal_shows_backticks(tmp_path: Path) -> None:
    # This snapshot's advice and its failure's explanation both name `nsysfrag whatif`.
    snapshot = SAMPLES / "torch_window_snapshot.pickle"
    page = tmp_path / "r.html"
    terminal = run(["analyze", str(snapshot), "--html", str(page)])
    assert WHATIF_TRIES.startswith("`nsysfrag whatif` ")
    assert "`nsysfrag whatif`" in " ".join(terminal.split())  # the terminal keeps its backticks
    text = page.read_text()
    body = text[text.index("<body>") :]
    advice = re.search(r'<ul class="advice">(.*?)</ul>', body)
    assert advice is not None and "<code>nsysfrag whatif</code>" in advice.group(1)
    failures = re.search(r'<ul class="oom">(.*?)</ul>', body)
    assert failures is not None and "<code>nsysfrag whatif</code>" in failures.group(1)
    assert "`" not in advice.group(1) + failures.group(1)

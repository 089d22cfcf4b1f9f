"""The what-if report: JSON data first (:func:`document`), then the terminal table
(:func:`render_terminal`) and the self-contained HTML page (:func:`render_html`) drawn from the
same report; ``words`` holds the sentences and formatters they share."""

from __future__ import annotations

from nsysfrag.reporters.whatif.document import SCHEMA, document, dumps
from nsysfrag.reporters.whatif.html import render_html
from nsysfrag.reporters.whatif.terminal import render_terminal

__all__ = ["SCHEMA", "document", "dumps", "render_html", "render_terminal"]

"""The HTML reports as a browser lays them out at 1,100 px: the what-if ranking table fits, no
bar label is clipped by its figure, and no ``file.py:43`` location is split across lines.

Each check loads a copy of the page with a measuring script appended (the reports themselves
carry no script) in headless Chromium and reads what the script found from the dumped DOM.
"""

from __future__ import annotations

import html
import json
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from nsysfrag.cli import cli
from tests.conftest import REAL_SNAPSHOTS, SAMPLES
from tests.test_html import needs_chromium, run_chromium
from tests.test_snapshot import S, block, ev, segment, snap

MiB = 1 << 20
WIDTH = 1100
MEASURE = """
(function () {
  const out = {width: document.documentElement.scrollWidth, tables: [], clipped: [], split: []};
  document.querySelectorAll("table").forEach(t => {
    out.tables.push(Math.round(t.getBoundingClientRect().right));
  });
  document.querySelectorAll("svg").forEach(svg => {
    const box = svg.viewBox.baseVal;
    if (!box || !box.width) return;
    svg.querySelectorAll("text").forEach(t => {
      const b = t.getBBox();
      if (b.x < box.x - 0.5 || b.x + b.width > box.x + box.width + 0.5)
        out.clipped.push(t.textContent);
    });
  });
  const location = /[^\\s\\/]+\\.py:\\d+/g;
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    location.lastIndex = 0;
    for (let m = location.exec(n.data); m; m = location.exec(n.data)) {
      const range = document.createRange();
      range.setStart(n, m.index);
      range.setEnd(n, m.index + m[0].length);
      const rects = Array.from(range.getClientRects()).filter(r => r.width > 0);
      if (new Set(rects.map(r => Math.round(r.top))).size > 1) out.split.push(m[0]);
    }
  }
  const pre = document.createElement("pre");
  pre.id = "nsysfrag-measure";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
"""


def measured(tmp_path: Path, page: Path) -> dict[str, Any]:
    copy = tmp_path / f"measured-{page.name}"
    copy.write_text(page.read_text().replace("</body>", f"<script>{MEASURE}</script></body>"))
    done = run_chromium(
        tmp_path, f"--window-size={WIDTH},1000", "--virtual-time-budget=5000", "--dump-dom",
        copy.as_uri(),
    )  # fmt: skip
    found = re.search(r'<pre id="nsysfrag-measure">(.*?)</pre>', done.stdout, re.DOTALL)
    assert found, done.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))  # type: ignore[no-any-return]


def report(tmp_path: Path, command: str, path: Path) -> Path:
    page = tmp_path / f"{command}-{path.stem}.html"
    result = CliRunner().invoke(cli, [command, str(path), "--html", str(page), "-q"])
    assert result.exit_code == 0, result.output
    return page


def long_sites(tmp_path: Path) -> Path:
    """Blocks from deep, long-named frames freed out of order: hotspot rows whose site and
    pinning sites must wrap in their 26rem column."""
    def frame(i: int) -> list[dict[str, Any]]:
        name = f"/home/someone/projects/a_rather_long_package_name/sub_package_{i}/modeling_transformer_block_{i}.py"
        return [{"name": f"forward_with_a_long_function_name_{i}", "filename": name, "line": 40 + i}]

    trace = []
    for k in range(6):
        trace.append(ev("alloc", S + k * 2 * MiB, 2 * MiB, 10 * k, frame(k)))
    for k in (1, 3):  # out of order, between live neighbours: holes
        trace.append(ev("free_requested", S + k * 2 * MiB, 2 * MiB, 100 + k, frame(k)))
        trace.append(ev("free_completed", S + k * 2 * MiB, 2 * MiB, 100 + k, frame(k)))
    live = [block(S + k * 2 * MiB, 2 * MiB) for k in (0, 2, 4, 5)]
    path = tmp_path / "long_sites.pickle"
    path.write_bytes(pickle.dumps(snap([segment(S, 20 * MiB, live)], trace), protocol=4))
    return path


WHATIF_INPUTS = [SAMPLES / "inference_expandable_snapshot.pickle", SAMPLES / "training_snapshot.pickle",
                 REAL_SNAPSHOTS / "Constructor-Sun+code_location__memory_snapshot.pickle"]  # fmt: skip


@needs_chromium
@pytest.mark.parametrize("path", WHATIF_INPUTS, ids=lambda p: p.name[:40])
def test_the_whatif_ranking_fits_and_no_bar_label_is_clipped(tmp_path: Path, path: Path) -> None:
    """GIVEN policies named with two options (expandable segments on, and a setting added)
    WHEN the what-if page is laid out at 1,100 px THEN no table reaches past the window, the
    page does not scroll sideways, and every label lies inside its figure."""
    if not path.exists():
        pytest.skip(f"{path.name} absent")
    found = measured(tmp_path, report(tmp_path, "whatif", path))
    assert found["width"] <= WIDTH and max(found["tables"]) <= WIDTH, found
    assert found["clipped"] == [], found["clipped"]


@needs_chromium
def test_a_source_location_is_never_split_across_lines(tmp_path: Path) -> None:
    """GIVEN hotspots whose sites are long paths WHEN the analyze page is laid out at 1,100 px
    THEN the sites wrap (after a '/') but every ``file.py:43`` stays on one line."""
    page = report(tmp_path, "analyze", long_sites(tmp_path))
    text = page.read_text()
    assert "modeling_transformer_block_1.py:41" in text.replace("<wbr>", "")
    found = measured(tmp_path, page)
    assert found["split"] == [], found["split"]
    real = REAL_SNAPSHOTS / "Constructor-Sun+code_location__memory_snapshot.pickle"
    if real.exists():  # 262 splits before (its attention and model sites)
        assert measured(tmp_path, report(tmp_path, "analyze", real))["split"] == []

"""How long an HTML report takes to open in headless Chromium (issue 13: ≤ 3 s at 1 M entries).

    python benchmarks/html_open_time.py REPORT.html [--runs 3]

The measure: a wrapper page loads the report into a 1280 × 1000 frame and times, with the
browser's own clock, from the start of loading to the end of the report's load event with the
whole page then laid out (its height read, which forces style and layout of every part and
figure): parsing the HTML and its inline SVG, styles and layout. Chromium's start and exit are
not counted (about 1 s here); nor is painting, which Chromium does only for what is on screen.
Medians of ``--runs``, each a fresh headless Chromium with a fresh profile folder.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from nsysfrag.testing.browser import find_chromium

WRAPPER = """<!doctype html><title>open time</title><pre id="out">pending</pre>
<script>
const t0 = performance.now();
const frame = document.createElement("iframe");
frame.style.width = "1280px"; frame.style.height = "1000px";
frame.onload = () => {
  const d = frame.contentDocument;
  const height = d.documentElement.scrollHeight;  // forces style and layout of the whole page
  const figures = d.querySelectorAll("figure").length;
  document.getElementById("out").textContent =
    JSON.stringify({ms: performance.now() - t0, height: height, figures: figures});
};
frame.src = "report.html";
document.body.appendChild(frame);
</script>
"""
_OUT = re.compile(r'<pre id="out">([^<]*)</pre>')


def _open_once(browser: str, page: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copyfile(page, folder / "report.html")
        (folder / "wrap.html").write_text(WRAPPER, encoding="utf-8")
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-background-networking", "--allow-file-access-from-files",
               f"--user-data-dir={folder / 'profile'}", "--dump-dom",
               (folder / "wrap.html").as_uri()]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300)
        found = _OUT.search(done.stdout)
        if found is None or found.group(1) == "pending":
            raise RuntimeError(f"Chromium did not finish loading {page}")
        result: dict[str, float] = json.loads(found.group(1))
        return result


def open_seconds(page: Path, runs: int = 3) -> float:
    """Seconds from the start of loading ``page`` to the end of its load event with the whole
    page laid out, in headless Chromium; median of ``runs``. Raises ``RuntimeError`` when there
    is no Chromium or the page does not load."""
    browser = find_chromium()
    if browser is None:
        raise RuntimeError("no Chromium or Chrome on PATH")
    return statistics.median(_open_once(browser, page)["ms"] / 1e3 for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("page", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    seconds = open_seconds(args.page, args.runs)
    print(f"{args.page}: {args.page.stat().st_size / 1e6:.2f} MB, opens in {seconds:.2f} s")


if __name__ == "__main__":
    main()

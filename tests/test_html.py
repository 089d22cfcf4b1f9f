"""The HTML report: one self-contained page, escaped, offline, deterministic; a browser draws it."""

from __future__ import annotations

import base64
import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from nsysfrag.analysis import Analysis, analyze
from nsysfrag.analysis.advice import advise
from nsysfrag.analysis.metrics import (
    format_bytes,
    free_blocks_health,
    global_frag_health,
    local_frag_health,
)
from nsysfrag.analysis.time_base import moment
from nsysfrag.cli import cli
from nsysfrag.events import SourceInfo
from nsysfrag.inputs.nsys import read_export
from nsysfrag.inputs.nsys.spaces import WORDS as NSYS_WORDS
from nsysfrag.reporters import html as html_report
from nsysfrag.reporters.figures import figure_builders
from nsysfrag.reporters.html import render, space_anchor, write
from nsysfrag.reporters.html_page import prose
from nsysfrag.reporters.state_cells import FREE_BLOCKS_ROW, percent
from nsysfrag.testing.browser import find_chromium
from nsysfrag.testing.nsys_export import (
    FREE,
    ApiRow,
    ExportOptions,
    Gpu,
    MemoryRow,
    NvtxRow,
    write_export,
)
from tests.conftest import BASE, SAMPLES, MiB

WHATIF = "`nsysfrag whatif`"  # how the advice quotes the command
EVIL = "<script>alert(1)</script>"
# Elements without an end tag in HTML5 (html.parser does not know them).
VOID = frozenset(
    [
        "area",
        "base",
        "br",
        "col",
        "embed",
        "hr",
        "img",
        "input",
        "link",
        "meta",
        "source",
        "track",
        "wbr",
    ]
)


# ---------------------------------------------------------------- a tiny DOM from html.parser


@dataclass
class Node:
    tag: str
    attrs: dict[str, str | None]
    children: list[Node] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    def iter(self, tag: str | None = None):  # type: ignore[no-untyped-def]
        if tag is None or self.tag == tag:
            yield self
        for child in self.children:
            yield from child.iter(tag)

    def all_text(self) -> str:
        return "".join(self.text) + "".join(c.all_text() for c in self.children)

    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())


class Page(HTMLParser):
    """Builds a tree and fails on any end tag that does not close the open element."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.decls: list[str] = []
        self.root = Node("#document", {})
        self.stack = [self.root]
        self.feed(text)
        self.close()
        unclosed = [n.tag for n in self.stack[1:]]
        assert not unclosed, f"unclosed: {unclosed}"

    def handle_decl(self, decl: str) -> None:
        self.decls.append(decl)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, dict(attrs))
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        assert tag not in VOID, f"end tag for void element {tag}"
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.stack[-1].text.append(data)

    def one(self, tag: str) -> Node:
        found = list(self.root.iter(tag))
        assert len(found) == 1, f"{len(found)} <{tag}>"
        return found[0]

    def sections(self) -> list[Node]:
        return [n for n in self.root.iter("section") if "space" in n.classes()]


@cache
def sample(name: str) -> Analysis:
    return analyze(read_export(SAMPLES / f"{name}.sqlite"))


@cache
def page_text(name: str) -> str:
    return render(sample(name))


@cache
def page(name: str) -> Page:
    return Page(page_text(name))


def cell_texts(node: Node) -> list[str]:
    return [td.all_text() for td in node.iter("td")]


# ---------------------------------------------------------------- structure and numbers


def test_page_is_html5_with_charset_viewport_and_title() -> None:
    p = page("inference_serving")
    assert page_text("inference_serving").startswith("<!doctype html>\n")
    assert [d.lower() for d in p.decls] == ["doctype html"]
    assert p.one("html").attrs["lang"] == "en"
    metas = list(p.root.iter("meta"))
    assert any(m.attrs.get("charset") == "utf-8" for m in metas)
    viewport = [m for m in metas if m.attrs.get("name") == "viewport"]
    assert len(viewport) == 1 and "width=device-width" in (viewport[0].attrs["content"] or "")
    assert p.one("title").all_text() == "nsysfrag — inference_serving.sqlite"
    assert len(list(p.root.iter("style"))) >= 1  # the page's CSS, inline


def test_header_names_trace_version_model_and_granularity() -> None:
    a = sample("inference_serving")
    header = page("inference_serving").one("header").all_text()
    assert a.source.path in header
    assert str(a.source.version) in header
    assert "observed device pages" in header
    assert f"{a.granularity_bytes} B" in header


def test_key_numbers_and_health_are_on_the_page() -> None:
    s = sample("inference_serving").spaces[0]
    (section,) = page("inference_serving").sections()
    assert section.attrs["id"] == space_anchor(s)
    heading = section.children[0]
    assert heading.tag == "h2"
    assert (
        f"pid {s.pid} ({s.process_name}) · device {s.device}: {s.device_name}" in heading.all_text()
    )
    assert format_bytes(s.capacity_bytes) in heading.all_text()
    badge = next(n for n in heading.iter("span") if "badge" in n.classes())
    assert badge.all_text() == s.health.label.upper() == "CRITICAL"
    assert s.health.label in badge.classes()
    cells = cell_texts(section)
    assert percent(s.peak.global_frag) == f"{s.peak.global_frag:.1%}"
    for text in (
        percent(s.peak.global_frag),
        percent(s.peak.local_frag),
        percent(s.final.global_frag),
        percent(s.max_global_frag),
        percent(s.max_local_frag),
        str(s.peak.free_blocks),
        str(s.max_free_blocks),
        str(s.counts.allocations),
        str(s.counts.frees),
        f"{s.counts.failed_allocations} ({s.alloc_failure_rate:.2%})",
        str(s.out_of_order_frees),
        str(s.hole_creating_frees),
        f"{s.growth_per_s * 100:+.3f} points/s",
        f"{s.internal_frag:.2%}",
        format_bytes(s.peak.largest_free_bytes),
    ):
        assert text in cells, text


def test_rated_cells_are_coloured_by_their_health_thresholds() -> None:
    s = sample("inference_serving").spaces[0]
    (section,) = page("inference_serving").sections()
    # The state table: the one with a "global frag" row, a column per moment.
    state = next(
        t for t in section.iter("table")
        if any(tr.children and tr.children[0].all_text() == "global frag" for tr in t.iter("tr"))
    )  # fmt: skip
    rows = {tr.children[0].all_text(): tr for tr in state.iter("tr") if tr.children and tr.children[0].tag == "th"}
    assert s.memory_peak is not None
    moments = [s.memory_peak, s.peak, s.final]
    expected = {
        "global frag": ([m.global_frag for m in moments] + [s.max_global_frag], global_frag_health),
        "local frag": ([m.local_frag for m in moments] + [s.max_local_frag], local_frag_health),
        FREE_BLOCKS_ROW: ([m.free_blocks for m in moments] + [s.max_free_blocks], free_blocks_health),
    }
    # local frag and free blocks rate only where 5 % of the device is free (and a maximum the
    # health does not count, none here): at the peak memory, 38 MiB free, they carry no colour.
    counted = [m.free_bytes >= 0.05 * s.capacity_bytes for m in moments] + [True]
    assert counted[0] is False  # the premise: main coloured its 97.6 % local frag red
    levels = set()
    for label, (values, level_of) in expected.items():
        tds = [c for c in rows[label].children if c.tag == "td"]
        assert len(tds) == 4  # at peak memory, at worst fragmentation, final, max
        for td, value, rated in zip(tds, values, counted, strict=True):
            level = level_of(value)
            if rated or label == "global frag":
                assert level.label in td.classes(), (label, td.all_text(), level)
                levels.add(level.label)
            else:
                assert not {"ok", "warn", "critical"} & set(td.classes()), (label, td.all_text())
    assert {"ok", "critical"} <= levels  # the sample exercises more than one colour


def test_every_figure_is_inlined_once_per_space_as_svg_or_png() -> None:
    (section,) = page("inference_serving").sections()
    figs = list(section.iter("figure"))
    assert [f.attrs["data-figure"] for f in figs] == list(figure_builders)
    for fig in figs:
        svgs, imgs = list(fig.iter("svg")), list(fig.iter("img"))
        assert len(svgs) + len(imgs) == 1
        if imgs:
            assert (imgs[0].attrs["src"] or "").startswith("data:image/png;base64,")
        else:
            assert svgs[0].attrs.get("viewbox")
    assert page_text("inference_serving").count("<svg") == len(figure_builders)


def test_svg_ids_are_unique_and_every_reference_resolves() -> None:
    text = page_text("multi_gpu")
    ids = [n.attrs["id"] for n in page("multi_gpu").root.iter() if n.attrs.get("id")]
    dupes = [i for i, c in Counter(ids).items() if c > 1]
    assert not dupes, dupes[:5]
    refs = set(re.findall(r'(?:href="#|url\(#)([^")]+)', text))
    assert refs and refs <= set(ids)


def test_hotspots_histograms_and_advice_are_tables_and_lines() -> None:
    s = sample("inference_serving").spaces[0]
    (section,) = page("inference_serving").sections()
    tables = list(section.iter("table"))
    heads = [[th.all_text() for th in t.iter("th")][:6] for t in tables]
    hot_head = ["site", "size class", "out-of-order frees", "holes", "hole bytes", "pinned by"]
    hot = tables[heads.index(hot_head)]
    body = [tr for tr in hot.iter("tr") if tr.children[0].tag == "td"]
    assert len(body) == min(len(s.hotspots), html_report.TOP_HOTSPOTS)
    first = [td.all_text() for td in body[0].children]
    h = s.hotspots[0]
    assert first[:5] == [h.site, h.size_class, str(h.out_of_order_frees), str(h.hole_creating_frees),
                         format_bytes(h.hole_bytes)]  # fmt: skip
    assert first[5].startswith(", ".join(h.pinned_by[:2]))
    text = section.all_text()
    for b in s.size_histogram + s.free_block_histogram:
        assert format_bytes(b.bytes) in text
    advice = next(n for n in section.iter("ul") if "advice" in n.classes())
    # The failures have their own section, so the page's advice leaves them out; the command a
    # line names in backticks is code on the page (test_html_code_spans.py).
    lines = advise(s, failures=False)
    assert len(list(advice.iter("li"))) == len(lines) and any(WHATIF in line for line in lines)
    assert all(f"<li>{prose(line)}</li>" in page_text("inference_serving") for line in lines)
    assert [c.all_text() for c in advice.iter("code")] == ["nsysfrag whatif"]


def test_definitions_give_every_rated_metric_its_formula_and_thresholds() -> None:
    sections = page("inference_serving").root.iter("section")
    defs = next(n for n in sections if n.attrs.get("id") == "definitions")
    text = defs.all_text()
    for needle in ("(F − L) / C", "1 − L / F", "< 20 %", "20 – 40 %", "≥ 40 %", "< 30 %", "30 – 60 %",
                   "> 60 %", "< 100", "100 – 500", "> 500", "Σ (footprint − bytes) / Σ footprint",
                   "failed / (failed + allocations)", "least-squares slope", "resident"):  # fmt: skip
        assert needle in text, needle
    # The same formulas as the metric table of the documentation.
    metrics = (SAMPLES.parent / "docs" / "metrics.md").read_text(encoding="utf-8").replace("`", "")
    for metric, formula, *_ in html_report.METRICS[:2]:
        assert f"| {metric} | {formula.split(' — ')[0]}" in metrics, metric


# ---------------------------------------------------------------- offline and deterministic


def assert_offline(text: str, p: Page) -> None:
    for node in p.root.iter():
        for name in ("src", "href", "xlink:href", "action", "srcset", "poster", "data"):
            value = (node.attrs.get(name) or "").strip().lower()
            assert not value.startswith(("http:", "https:", "//", "ftp:")), (node.tag, name, value)
            if name == "src" and value:
                assert value.startswith("data:"), value
            if name in ("href", "xlink:href") and value:
                # Within the page, or the address map's image inlined in its SVG.
                is_image = node.tag == "image" and value.startswith("data:image/png;base64,")
                assert value.startswith("#") or is_image, value
    lowered = text.lower()
    forbidden = (
        "@import",
        "url(http",
        "url(//",
        "http://",
        "https://",
        "<link",
        "<script",
        "<iframe",
    )
    for needle in forbidden:
        assert needle not in lowered, needle


def test_page_references_nothing_on_the_network() -> None:
    for name in ("inference_serving", "multi_gpu"):
        assert_offline(page_text(name), page(name))


def test_output_is_deterministic() -> None:
    assert render(sample("inference_serving")) == page_text("inference_serving")


def test_page_stays_small() -> None:
    assert len(page_text("inference_serving").encode()) < 3_000_000


def test_huge_svg_falls_back_to_a_png_data_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(html_report, "MAX_SVG_BYTES", 1000)
    text = render(sample("caching_allocator"))
    p = Page(text)
    imgs = list(p.root.iter("img"))
    assert len(imgs) == len(figure_builders) and "<svg" not in text
    src = imgs[0].attrs["src"] or ""
    png = base64.b64decode(src.removeprefix("data:image/png;base64,"))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert imgs[0].attrs["alt"]
    assert_offline(text, p)


def test_write_puts_the_page_in_a_file(tmp_path: Path) -> None:
    a = sample("caching_allocator")
    out = tmp_path / "report.html"
    write(a, out)
    assert out.read_text(encoding="utf-8") == render(a)


def test_analysis_without_spaces_says_so() -> None:
    text = render(
        Analysis(
            source=SourceInfo("nsys-export", "/x/empty.sqlite", None, NSYS_WORDS),
            granularity_bytes=512,
            spaces=[],
            model="observed",
        )
    )
    p = Page(text)
    assert p.one("title").all_text() == "nsysfrag — empty.sqlite"
    assert "No device-memory allocations in this trace." in p.root.all_text()
    assert "<svg" not in text


# ---------------------------------------------------------------- several spaces


def test_multi_gpu_page_has_a_section_and_six_figures_per_space() -> None:
    a = sample("multi_gpu")
    assert len(a.spaces) == 3
    p = page("multi_gpu")
    sections = p.sections()
    assert [sec.attrs["id"] for sec in sections] == [space_anchor(s) for s in a.spaces]
    for sec, s in zip(sections, a.spaces, strict=True):
        assert len(list(sec.iter("figure"))) == len(figure_builders)
        assert s.device_name in sec.children[0].all_text()
        assert percent(s.peak.global_frag) in cell_texts(sec)
    links = [n.attrs["href"] for n in p.one("nav").iter("a")]
    assert links == [f"#{space_anchor(s)}" for s in a.spaces]
    assert page_text("multi_gpu").count("<svg") + page_text("multi_gpu").count("<img") == 3 * len(
        figure_builders
    )


# ---------------------------------------------------------------- escaping


S = 1_000_000_000


def evil_trace(tmp_path: Path) -> Path:
    """A|B|C allocated inside an NVTX range named like a script; B freed out of order (a hole),
    so the range becomes a hotspot site and appears in the advice. Process, GPU and file names
    carry markup too."""
    steps = [(1, 0, MiB), (2, MiB, 2 * MiB), (3, 3 * MiB, MiB)]
    memory, api = [], []
    for corr, (sec, offset, size) in enumerate(steps, start=1):
        memory.append(MemoryRow(sec * S, 1, 0, BASE + offset, size, correlation_id=corr))
        api.append(ApiRow(sec * S - 100, sec * S + 100, 1, 7, "cudaMalloc_v3020", corr))
    memory.append(MemoryRow(4 * S, 1, 0, BASE + MiB, 2 * MiB, op=FREE))
    nvtx = [NvtxRow(S - 1000, 3 * S + 1000, 1, 7, EVIL)]
    options = ExportOptions(processes=[(1, '<img src=x onerror="alert(2)">')])
    gpus = [Gpu(0, name="GPU <b>&amp;</b>", total_memory=64 * MiB)]
    return write_export(tmp_path / 'run <em>"x"<em> & y.sqlite', memory, api, nvtx, gpus, options)


def test_trace_text_is_escaped(tmp_path: Path) -> None:
    a = analyze(read_export(evil_trace(tmp_path)))
    (s,) = a.spaces
    assert s.hotspots[0].site == EVIL and s.hole_creating_frees == 1
    text = render(a)
    assert EVIL not in text
    assert escape(EVIL) in text
    for raw in ("<img src=x", "<b>&amp;</b>", "<em>"):
        assert raw not in text
    p = Page(text)
    assert (
        not list(p.root.iter("script"))
        and not list(p.root.iter("b"))
        and not list(p.root.iter("em"))
    )
    assert p.one("title").all_text() == 'nsysfrag — run <em>"x"<em> & y.sqlite'
    hot_sites = [td.all_text() for td in p.root.iter("td") if "site" in td.classes()]
    assert EVIL in hot_sites  # the parsed (unescaped) text is the site name itself
    assert any(EVIL in li.all_text() for li in p.root.iter("li"))  # advice names the site
    assert "GPU <b>&amp;</b>" in p.sections()[0].children[0].all_text()
    assert_offline(text, p)


# ---------------------------------------------------------------- a real browser


CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium/Chrome installed")


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--no-first-run", f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--enable-logging=stderr", "--v=0", *args,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)


def console_problems(stderr: str, url: str) -> list[str]:
    return [
        line
        for line in stderr.splitlines()
        if "Uncaught" in line or "ERROR:CONSOLE" in line or ("CONSOLE" in line and url in line)
    ]


def png_pixels(path: Path) -> np.ndarray:
    from matplotlib.image import imread

    return np.asarray(imread(path))


@needs_chromium
def test_chromium_draws_the_page(tmp_path: Path) -> None:
    page_path = tmp_path / "report.html"
    write(sample("inference_serving"), page_path)
    url = page_path.as_uri()
    shot = tmp_path / "shot.png"
    done = run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,2000", url)
    assert shot.exists(), done.stderr[-2000:]
    pixels = png_pixels(shot)
    assert pixels.shape[:2] == (2000, 1280)
    colours = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)
    assert len(colours) > 50  # text, tables, badges and a figure, not a blank page
    assert not console_problems(done.stderr, url)

    dom = run_chromium(tmp_path, "--dump-dom", url)
    assert "<title>nsysfrag — inference_serving.sqlite</title>" in dom.stdout
    assert dom.stdout.count("<svg") == len(figure_builders)
    assert not console_problems(dom.stderr, url)


@needs_chromium
def test_chromium_shows_a_script_named_range_as_text(tmp_path: Path) -> None:
    page_path = tmp_path / "evil.html"
    write(analyze(read_export(evil_trace(tmp_path))), page_path)
    dom = run_chromium(tmp_path, "--dump-dom", page_path.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<script" not in dom.stdout and '<img src="x"' not in dom.stdout
    assert escape(EVIL, quote=False) in dom.stdout
    assert not console_problems(dom.stderr, page_path.as_uri())


def test_failures_told_alike_are_one_item_under_their_table(tmp_path: Path) -> None:
    # main: the serving sample's 22 failures in the table, then 22 near-identical bullets
    s = sample("inference_serving").spaces[0]
    out = tmp_path / "r.html"
    assert CliRunner().invoke(cli, ["analyze", str(SAMPLES / "inference_serving.sqlite"), "-q",
                                    "--html", str(out)]).exit_code == 0  # fmt: skip
    html = out.read_text()
    block = html[html.index('<div class="failures">') :]
    block = block[: block.index("</div>")]
    assert block.count("<tr>") == len(s.ooms) + 1  # a row per failure, and the heading
    items = block.split('<ul class="oom">', 1)[1].split("</ul>", 1)[0].count("<li>")
    assert items == 1, items
    first, last = (moment(s, f.state.time_ns) for f in (s.ooms[0], s.ooms[-1]))
    assert f"<strong>{len(s.ooms)} failures, at {first} to {last}</strong>" in block

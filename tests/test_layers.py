"""The layers of docs/ARCHITECTURE.md, held to the code's own imports.

Every ``import`` of a module of ``nsysfrag/`` counts — at the top, inside a function, under
``TYPE_CHECKING`` — because each is a dependency someone has to know about. A *room* is a
top-level entry of the package (a subpackage or a module); the floors, drawn in the document,
put every room in order, bottom first. An import may look sideways (its own room) or down,
never up, and no modules may import each other in a circle. ``record/bootstrap`` is a package
of its own that runs inside the user's program on the standard library alone: a room of its
own, ``record.bootstrap``, on the bottom floor (what it holds, such as the record folder's
names, is a contract both sides read); its imports are read like any other (no circle inside
it either), and it may import nothing but itself and the standard library.

A failure names the import to move. ``ALLOWED_UP`` and ``ALLOWED_CIRCLES`` are where an
import against the drawing would be listed while other work finishes; both are empty, and an
entry added there must say why and must go (a test fails on an entry that no longer occurs).
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "nsysfrag"
DOC = REPO / "docs" / "ARCHITECTURE.md"

# (importer, imported) module pairs that still run up: none is left, and a new one fails the
# test. (The last, the segments model reading the snapshot reader's records, ended when those
# types moved down beside the model: models/snapshot_entries.py.)
ALLOWED_UP: set[tuple[str, str]] = set()

# Circles of modules still in the code, each as the sorted tuple of its modules: none is left,
# and a new one fails the test.
ALLOWED_CIRCLES: set[tuple[str, ...]] = set()


BOOTSTRAP = "nsysfrag.record.bootstrap"
# The bootstrap folder is first on a recorded process's sys.path, where its recorder package is
# imported under its own name (sitecustomize: ``import nsysfrag_recorder``); the same modules.
RUNTIME = "nsysfrag_recorder"


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _in_bootstrap(module: str) -> bool:
    return module == BOOTSTRAP or module.startswith(BOOTSTRAP + ".")


def _named(module: str, path: Path) -> list[str]:
    """Every module name ``module``'s imports name, absolute: ``from a.b import c`` names
    ``a.b`` and ``a.b.c`` (which may be a module); a relative import is resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            names += [name] + [f"{name}.{a.name}" for a in node.names]
    if _in_bootstrap(module):
        names = [f"{BOOTSTRAP}.{n}" if n.split(".")[0] == RUNTIME else n for n in names]
    return names


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Importer -> the nsysfrag modules it names (``_named``); the top package ``nsysfrag``
    itself is not counted."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        for target in _named(module, path):
            if target.split(".")[0] == "nsysfrag":
                found = resolve(target)
                if found not in (None, module, "nsysfrag"):
                    edges[module].add(found)  # type: ignore[arg-type]
    return edges


def room(module: str) -> str:
    if _in_bootstrap(module):
        return "record.bootstrap"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "nsysfrag"


def floors() -> list[list[str]]:
    """The floors drawn in docs/ARCHITECTURE.md, bottom first: the block after "## Layers",
    one floor a line, top first, its rooms before the ``│``."""
    section = DOC.read_text(encoding="utf-8").split("## Layers", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.DOTALL)
    assert block is not None, "docs/ARCHITECTURE.md draws no floors under ## Layers"
    lines = [line for line in block.group(1).splitlines() if "│" in line]
    drawn = [line.split("│", 1)[0].split() for line in lines]
    return list(reversed([rooms for rooms in drawn if rooms]))


def _circles(nodes: list[str], edges: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(tuple(sorted(component)))
    return found


MODULES = _modules()
EDGES = _imports(MODULES)


def test_every_room_is_on_one_floor() -> None:
    drawn = [r for floor in floors() for r in floor]
    rooms = {room(m) for m in MODULES}
    assert sorted(set(drawn)) == sorted(drawn), "a room is drawn on two floors"
    missing = sorted(rooms - set(drawn))
    assert not missing, f"rooms on no floor of docs/ARCHITECTURE.md: {missing}"
    assert not set(drawn) - rooms, f"floors name rooms that are gone: {sorted(set(drawn) - rooms)}"


def test_imports_only_look_down() -> None:
    level = {r: i for i, floor in enumerate(floors()) for r in floor}
    up = {
        (a, b)
        for a, targets in EDGES.items()
        for b in targets
        if room(a) != room(b) and level[room(b)] > level[room(a)]
    }
    new = sorted(up - ALLOWED_UP)
    described = "\n".join(f"  {a} ({room(a)}) imports {b} ({room(b)})" for a, b in new)
    hint = "move the definition down, or the importer up"
    assert not new, f"imports that run up a floor ({hint}):\n{described}"
    assert not ALLOWED_UP - up, f"no longer up, drop from ALLOWED_UP: {sorted(ALLOWED_UP - up)}"


def test_no_module_circles() -> None:
    circles = set(_circles(sorted(MODULES), EDGES))
    new = sorted(circles - ALLOWED_CIRCLES)
    described = []
    for circle in new:
        inside = set(circle)
        arrows = [f"    {a} -> {b}" for a in circle for b in sorted(EDGES[a] & inside)]
        described.append(f"  {', '.join(circle)}:\n" + "\n".join(arrows))
    assert not new, "modules that import each other in a circle:\n" + "\n".join(described)
    assert not ALLOWED_CIRCLES - circles, (
        f"no longer a circle, drop from ALLOWED_CIRCLES: {sorted(ALLOWED_CIRCLES - circles)}"
    )


def _outside_bootstrap(modules: dict[str, Path]) -> list[str]:
    """What the bootstrap's modules import from neither the bootstrap nor the standard library."""
    return sorted(
        f"  {m} imports {n}"
        for m, path in modules.items()
        if _in_bootstrap(m)
        for n in _named(m, path)
        if not _in_bootstrap(n) and n.split(".")[0] not in sys.stdlib_module_names | {"__future__"}
    )


def test_the_recorder_bootstrap_imports_only_itself_and_the_standard_library() -> None:
    # The bootstrap folder is put first on the recorded command's PYTHONPATH and loaded into
    # the program's own interpreter, which may be another Python without nsysfrag or its
    # dependencies (torch it is handed, once the program has imported it).
    assert f"{BOOTSTRAP}.{RUNTIME}.recorder" in MODULES, "the bootstrap moved: update BOOTSTRAP"
    outside = _outside_bootstrap(MODULES)
    assert not outside, "the bootstrap imports outside itself and the standard library:\n" + (
        "\n".join(outside)
    )


def test_the_counting_sees_imports_in_functions_and_type_checking(tmp_path: Path) -> None:
    # GIVEN a package whose imports hide in a function, under TYPE_CHECKING and as relative
    # names WHEN its imports are read THEN each counts (else a circle could hide there).
    package = tmp_path / "nsysfrag"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("from . import deep\n")
    (package / "low" / "deep.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nsysfrag.high import X\n"
    )
    (package / "high.py").write_text("def f():\n    from nsysfrag.low.deep import Y\n")
    edges = _imports(_modules(package))
    assert edges == {
        "nsysfrag.low": {"nsysfrag.low.deep"},
        "nsysfrag.low.deep": {"nsysfrag.high"},
        "nsysfrag.high": {"nsysfrag.low.deep"},
    }
    assert _circles(sorted(_modules(package)), edges) == [("nsysfrag.high", "nsysfrag.low.deep")]
    assert _circles(["a", "b", "c"], {"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [("a", "b", "c")]
    assert _circles(["a", "b"], {"a": {"b"}}) == []


def test_the_bootstrap_s_own_name_for_its_package_counts(tmp_path: Path) -> None:
    # GIVEN a bootstrap whose sitecustomize imports the recorder package by the name it has in
    # a recorded process, and a recorder module that imports nsysfrag WHEN read THEN the first
    # is an import of the package inside the bootstrap, the second one from outside it.
    runtime = tmp_path / "nsysfrag" / "record" / "bootstrap" / RUNTIME
    runtime.mkdir(parents=True)
    for folder in (runtime.parent.parent.parent, runtime.parent.parent, runtime.parent, runtime):
        (folder / "__init__.py").write_text("")
    (runtime.parent / "sitecustomize.py").write_text(f"import os\nimport {RUNTIME}\n")
    (runtime / "recorder.py").write_text("from nsysfrag.units import parse_size\n")
    modules = _modules(tmp_path / "nsysfrag")
    assert _imports(modules)[f"{BOOTSTRAP}.sitecustomize"] == {f"{BOOTSTRAP}.{RUNTIME}"}
    assert _outside_bootstrap(modules) == [
        f"  {BOOTSTRAP}.{RUNTIME}.recorder imports nsysfrag.units",
        f"  {BOOTSTRAP}.{RUNTIME}.recorder imports nsysfrag.units.parse_size",
    ]

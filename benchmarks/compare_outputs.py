"""Every report of every sample and real input, saved once and compared later, byte for byte.

A restructuring must not change a single output; a change of numbers must be on purpose. This
script runs the CLI (the code of the checkout it sits in) on every sample in ``sample_traces/``
and every genuine input beside the repository (``../shared/real_snapshots``, ``../shared/
real_memory_traces``, ``../shared/real_traces``, when present) and captures each output: analyze's terminal report at a fixed
width, JSON, CSV and HTML; whatif's terminal report and JSON; whatif --validate's JSON.

    python benchmarks/compare_outputs.py save /tmp/before      # on the old code
    python benchmarks/compare_outputs.py save /tmp/after       # on the new code
    python benchmarks/compare_outputs.py diff /tmp/before /tmp/after [--ignore-key KEY ...]
    python benchmarks/compare_outputs.py save /tmp/before --inputs nsys   # exports only
    python benchmarks/compare_outputs.py save /tmp/before --commands whatif validate

Inputs are linked into a scratch folder under fixed names and every command runs there, so the
paths printed in reports are the same whichever checkout or folder runs the script. ``diff``
exits 1 when anything differs and prints which file and, for JSON, which keys; ``--ignore-key``
drops a JSON key (at any depth) from both sides before comparing, for fields a change adds on
purpose.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
WIDTH = "120"


SUFFIXES = {"all": (".sqlite", ".pickle", ".pkl"), "nsys": (".sqlite",),
            "snapshot": (".pickle", ".pkl")}


def inputs(kind: str = "all") -> list[Path]:
    """The samples and the genuine inputs; ``kind`` keeps only exports or only snapshots (a
    change to one reader need not wait for the other's whatif runs)."""
    suffixes = SUFFIXES[kind]
    found = sorted(p for p in (REPO / "sample_traces").iterdir() if p.suffix in suffixes)
    for folder in ("real_snapshots", "real_memory_traces", "real_traces"):
        if (SHARED / folder).is_dir():
            found += sorted(p for p in (SHARED / folder).iterdir() if p.suffix in suffixes)
    return found


def _name(path: Path) -> str:
    # One flat namespace; the real inputs' names are long but unique.
    return f"{path.parent.name}__{path.name}"


def commands(name: str, is_snapshot: bool) -> list[tuple[str, list[str]]]:
    """(output stem, argv after `nsysfrag`) for one input."""
    out = [
        ("analyze", ["analyze", f"in/{name}", "--json", f"out/{name}.analyze.json",
                     "--csv", f"out/{name}.analyze.csv", "--html", f"out/{name}.analyze.html"]),
        ("whatif", ["whatif", f"in/{name}", "--json", f"out/{name}.whatif.json"]),
    ]
    if is_snapshot:
        out.append(("validate", ["whatif", f"in/{name}", "--validate", "--quiet",
                                 "--json", f"out/{name}.validate.json"]))
    return out


def _run(work: Path, stem: str, argv: list[str]) -> None:
    env = dict(os.environ, COLUMNS=WIDTH, PYTHONPATH=str(REPO),
               NO_COLOR="1", TERM="dumb")
    env.pop("NSYSFRAG_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "nsysfrag", *argv], cwd=work, env=env, capture_output=True,
        text=True, timeout=1800, check=False,
    )
    (work / "out" / f"{stem}.stdout").write_text(proc.stdout)
    (work / "out" / f"{stem}.stderr").write_text(proc.stderr)
    (work / "out" / f"{stem}.rc").write_text(f"{proc.returncode}\n")


STEMS = ("analyze", "whatif", "validate")


def save(target: Path, jobs: int, kind: str = "all", stems: tuple[str, ...] = STEMS) -> None:
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nsysfrag-outputs-") as scratch:
        work = Path(scratch)
        (work / "in").mkdir()
        (work / "out").mkdir()
        runs = []
        for path in inputs(kind):
            name = _name(path)
            (work / "in" / name).symlink_to(path)
            snapshot = path.suffix in (".pickle", ".pkl")
            runs += [
                (f"{name}.{stem}", argv) for stem, argv in commands(name, snapshot) if stem in stems
            ]
        with ThreadPoolExecutor(jobs) as pool:
            for _ in pool.map(lambda r: _run(work, *r), runs):
                pass
        for produced in (work / "out").iterdir():
            shutil.copyfile(produced, target / produced.name)
    print(f"saved {len(list(target.iterdir()))} files from {len(runs)} runs into {target}")


def _drop(value: Any, keys: set[str]) -> Any:
    if isinstance(value, dict):
        return {k: _drop(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_drop(v, keys) for v in value]
    return value


def _json_differences(a: Any, b: Any, where: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a:
                yield f"{where}.{k}: added"
            elif k not in b:
                yield f"{where}.{k}: removed"
            else:
                yield from _json_differences(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _json_differences(x, y, f"{where}[{i}]")
    elif a != b:
        shown = f"{json.dumps(a)[:80]} -> {json.dumps(b)[:80]}"
        yield f"{where or '(root)'}: {shown}"


def diff(before: Path, after: Path, ignore: set[str], limit: int) -> int:
    names = sorted({p.name for p in before.iterdir()} | {p.name for p in after.iterdir()})
    changed = 0
    for name in names:
        a, b = before / name, after / name
        if not a.exists() or not b.exists():
            print(f"{name}: only in {'after' if not a.exists() else 'before'}")
            changed += 1
            continue
        if a.read_bytes() == b.read_bytes():
            continue
        if name.endswith(".json") and ignore:
            try:
                left = _drop(json.loads(a.read_text()), ignore)
                right = _drop(json.loads(b.read_text()), ignore)
            except ValueError:
                left, right = None, True
            if left == right:
                continue
        changed += 1
        print(f"{name}: differs")
        if name.endswith(".json"):
            try:
                found = list(_json_differences(
                    _drop(json.loads(a.read_text()), ignore), _drop(json.loads(b.read_text()), ignore)
                ))
            except ValueError:
                found = ["(not JSON on one side)"]
            for line in found[:limit]:
                print(f"    {line}")
            if len(found) > limit:
                print(f"    … {len(found) - limit} more")
    print(f"{len(names)} files compared, {changed} differ")
    return 1 if changed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_save = sub.add_parser("save", help="run every output into DIR")
    p_save.add_argument("dir", type=Path)
    p_save.add_argument("--jobs", type=int, default=2)
    p_save.add_argument("--inputs", choices=sorted(SUFFIXES), default="all",
                        help="every input, the nsys exports only, or the snapshots only")
    p_save.add_argument("--commands", nargs="+", choices=STEMS, default=list(STEMS),
                        help="only these runs (a what-if change need not wait for analyze's)")
    p_diff = sub.add_parser("diff", help="compare two saved folders")
    p_diff.add_argument("before", type=Path)
    p_diff.add_argument("after", type=Path)
    p_diff.add_argument("--ignore-key", action="append", default=[])
    p_diff.add_argument("--limit", type=int, default=8, help="JSON differences shown per file")
    args = parser.parse_args()
    if args.command == "save":
        save(args.dir, args.jobs, args.inputs, tuple(args.commands))
        return 0
    return diff(args.before, args.after, set(args.ignore_key), args.limit)


if __name__ == "__main__":
    sys.exit(main())

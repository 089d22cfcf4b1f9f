"""What reading a big history costs: ``history --json``, the table, trends and the chart.

    python benchmarks/bench_history.py                     # 2,000 runs: a quick look
    python benchmarks/bench_history.py --runs 200000       # 200k runs, 10 M values (issue 33)
    python benchmarks/bench_history.py --runs 20000 --only json --keep /tmp/h20k.sqlite

A history of ``--runs`` runs is written the way nsysfrag writes one, but in bulk: one real run
is recorded (``analyze --record`` of a sample trace) into a database nsysfrag created, then its
rows are copied inside SQLite, run by run (new ids, times, hashes, values scaled a little), so
every row has the store's own schema and the types nsysfrag stores: one space of ~50 other
values and 44 columns per run, and a tag. Each command then runs in a child process; its wall
time and peak RSS (``wait4``) are printed beside those of a bare ``SELECT`` of the same rows
(sqlite3, every row fetched) in a child of its own, and the ratio of the two.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRACE = HERE.parent / "sample_traces" / "multi_gpu.sqlite"
NSYSFRAG = [sys.executable, "-m", "nsysfrag"]
# A SELECT of every row nsysfrag reads for --json, fetched and dropped: the floor of any read.
BARE = """
import sqlite3, sys
con = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
for table in ("runs", "run_tags", "run_spaces", "run_space_values"):
    for row in con.execute(f"SELECT * FROM {table}"):
        pass
"""
COMMANDS = {
    "json": ["history", "--json", "{out}"],
    "json-stdout": ["history", "--json", "-"],
    "table": ["history"],
    "table-all": ["history", "--limit", "{runs}"],
    "trend": ["history", "--trend", "global_frag"],
    "trend-all": ["history", "--trend", "global_frag", "--limit", "{runs}"],
    "chart-all": ["history", "--trend", "global_frag", "--limit", "{runs}", "--png", "{png}"],
    "check": ["history", "--check"],
}


def template(folder: Path) -> Path:
    """A history nsysfrag wrote itself: one run of the sample trace, one space of it kept."""
    db = folder / "template.sqlite"
    subprocess.run([*NSYSFRAG, "analyze", str(TRACE), "-q", "--record", "--db", str(db),
                    "--label", "nightly", "--tag", "model=llama-8b"], check=True)  # fmt: skip
    con = sqlite3.connect(db)
    with con:
        space = con.execute("SELECT pid, device, model FROM run_spaces ORDER BY pid LIMIT 1").fetchone()
        con.execute("DELETE FROM run_spaces WHERE (pid, device, model) != (?, ?, ?)", space)
        con.execute("DELETE FROM run_space_values WHERE (pid, device, model) != (?, ?, ?)", space)
    con.close()
    return db


def build(db: Path, runs: int, folder: Path) -> None:
    """``runs`` copies of the template's run in ``db`` (ids 1..runs, a minute apart)."""
    db.unlink(missing_ok=True)
    source = template(folder)
    con = sqlite3.connect(source)
    con.execute("PRAGMA journal_mode = DELETE")
    con.close()
    data = source.read_bytes()
    db.write_bytes(data)
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    con.execute("PRAGMA cache_size = -262144")
    count = f"WITH RECURSIVE n(i) AS (SELECT 2 UNION ALL SELECT i + 1 FROM n WHERE i < {runs})"
    # A value scaled by up to ±5 %, the same for a run's every value: trends move, types stay.
    scale = "(1 + ((n.i * 7919) % 101 - 50) / 1000.0)"
    with con:
        runs_cols = [r[1] for r in con.execute("PRAGMA table_info(runs)")]
        made = {
            "id": "n.i",
            "recorded_at": "strftime('%Y-%m-%d %H:%M:%S', '2025-01-01', '+' || n.i || ' minutes') || '.000000'",
            "trace_sha256": "printf('%064x', n.i)",
            "label": "'nightly #' || n.i",
        }
        con.execute(
            f"{count} INSERT INTO runs ({', '.join(runs_cols)}) SELECT "
            + ", ".join(made.get(c, f"r.{c}") for c in runs_cols)
            + " FROM n, runs r WHERE r.id = 1"
        )
        con.execute(f"{count} INSERT INTO run_tags SELECT n.i, t.key, t.value FROM n, run_tags t")
        space_cols = [r[1] for r in con.execute("PRAGMA table_info(run_spaces)")]
        ratios = {"max_global_frag", "max_local_frag", "peak_global_frag", "final_global_frag"}
        con.execute(
            f"{count} INSERT INTO run_spaces SELECT "
            + ", ".join(
                "n.i" if c == "run_id" else f"min(s.{c} * {scale}, 1.0)" if c in ratios else f"s.{c}"
                for c in space_cols
            )
            + " FROM n, run_spaces s"
        )
        con.execute(
            f"{count} INSERT INTO run_space_values SELECT n.i, v.pid, v.device, v.model, v.path,"
            f" v.value * {scale} FROM n, run_space_values v WHERE v.run_id = 1"
        )
    con.execute("PRAGMA journal_mode = WAL")  # as nsysfrag leaves it
    con.close()


def measure(argv: list[str]) -> tuple[float, float, int, str]:
    """Wall seconds, peak RSS in MiB, exit code and the last line of stderr of a child."""
    start = time.monotonic()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - start
        err.seek(0)
        lines = err.read().decode("utf-8", "replace").strip().splitlines()
    return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), (lines or [""])[-1]


def md5(path: Path) -> str:
    digest = hashlib.md5()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--keep", type=Path, help="build the database here and keep it (reused when it exists)")
    parser.add_argument("--only", action="append", choices=sorted(COMMANDS), help="repeatable")
    parser.add_argument("--json-out", type=Path, help="keep --json's document here (default: a temporary file)")
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build is not None:
        with tempfile.TemporaryDirectory() as scratch:
            build(args.build, args.runs, Path(scratch))
        return
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        db = args.keep or folder / "history.sqlite"
        if not db.exists():
            start = time.monotonic()
            # In a child: this process stays small, so its children's peak RSS is their own
            # (a forked child starts with its parent's pages counted).
            subprocess.run([sys.executable, __file__, "--build", str(db), "--runs", str(args.runs)],
                           check=True)  # fmt: skip
            print(f"built {args.runs:,} runs in {time.monotonic() - start:.1f} s:"
                  f" {db.stat().st_size / 2**20:,.0f} MiB at {db}")  # fmt: skip
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        runs, values = (con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                        for t in ("runs", "run_space_values"))  # fmt: skip
        con.close()
        print(f"{runs:,} runs, {values:,} other values; load {os.getloadavg()[0]:.2f}")
        bare_s, bare_mib, _, _ = measure([sys.executable, "-c", BARE, str(db)])
        print(f"{'bare SELECT':<12} {bare_s:7.1f} s {bare_mib:7.0f} MiB")
        out = args.json_out or folder / "history.json"
        for name in args.only or COMMANDS:
            argv = [a.format(out=out, runs=runs, png=folder / "trend.png") for a in COMMANDS[name]]
            wall, mib, code, last = measure([*NSYSFRAG, *argv, "--db", str(db)])
            extra = f"  md5 {md5(out)} {out.stat().st_size / 2**20:,.0f} MiB" if name == "json" and code == 0 else ""
            print(f"{name:<12} {wall:7.1f} s {mib:7.0f} MiB  x{wall / bare_s:5.1f}  exit {code}"
                  f"{extra}{'  ' + last[:100] if code else ''}")  # fmt: skip


if __name__ == "__main__":
    main()

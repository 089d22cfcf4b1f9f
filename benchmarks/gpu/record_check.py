"""The GPU checks of ``nsysfrag record`` (``record_check.sh``), each independent: each runs in
processes of its own under its own time limit and writes ``FINDINGS/<check>.json`` the moment it
ends (passed or not, timed out or not), and ``FINDINGS/record_truth.json`` gathers them after
each. What a check observed is the truth ``tests/test_record_truth.py`` holds ``record`` to once
the files are committed under ``sample_traces/record_truth/``.

Checks (limits in seconds, 300 in all, inside the script's 360):

- ``torchrun_2`` (90): ``record -- torchrun --nproc_per_node=2 record_jobs.py frag`` on one GPU
  (RANK set): both ranks named by RANK, rank 1's OOM snapshot and its verdict, rank 0's final
  snapshot on torchrun's SIGTERM, the capacity and its source, each rank's longest pause;
- ``spawn_2`` (45): two processes by the spawn method on one GPU, no RANK: one named by its
  device, the other by its pid, both in the job;
- ``sigterm`` (30): SIGTERM to ``nsysfrag record``: the command's exit 143, a final snapshot;
- ``fraction`` (30): ``set_per_process_memory_fraction(0.25)`` until the OOM: the capacity is
  the allowed maximum, and the observer was handed it;
- ``entries_100k`` (60): ``--entries 100000``, sampling every second with a state each time,
  over a program whose history fills: no pause over 50 ms; and, without the recorder, what
  ``memory_snapshot()`` costs at 100,000 entries with and without the traces;
- ``monitor_step`` (45): ``monitor().step()`` every step: the budget decides, no pause over
  50 ms.

Environment: ``RECORD_CHECK_LAUNCHER`` replaces ``torchrun --nproc_per_node=2`` (the tests use a
launcher of their own on the fake torch); ``RECORD_CHECK_ONLY`` (comma-separated names) runs
only those; ``RECORD_CHECK_LIMITS`` (``name=seconds,...``) changes limits.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_truth_rules import problems  # noqa: E402  (beside this file: the tests use it too)

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "benchmarks" / "gpu" / "record_jobs.py"
PY = sys.executable
MAX_PAUSE_S = 0.05
Observed = dict[str, Any]


class Check:
    def __init__(self, name: str, limit_s: float, run: Callable[[Path, float], Observed]) -> None:
        self.name, self.limit_s, self.run = name, limit_s, run


def record(out: Path, args: list[str], program: list[str], limit_s: float,
           env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], Observed]:  # fmt: skip
    """``nsysfrag record -o OUT --json OUT.json ARGS -- PROGRAM``; the run and its job document."""
    job = out.with_suffix(".json")
    done = subprocess.run([PY, "-m", "nsysfrag", "record", "-o", str(out), "--json", str(job), *args,
                           "--", *program], capture_output=True, text=True, timeout=limit_s,
                          check=False, env=env)  # fmt: skip
    (out.parent / f"{out.name}.stderr.log").write_text(done.stderr[-100_000:])
    try:
        doc = json.loads(job.read_text())
    except (OSError, ValueError):
        doc = {"ranks": []}
    return done, doc


def rank_facts(out: Path, doc: Observed) -> list[Observed]:
    """What each rank of a record is: its folder, how it was named, its capacity, its pauses."""
    rows = []
    for entry in doc.get("ranks", []):
        a = entry.get("analysis") or {}
        r, spaces = a.get("recorded") or {}, a.get("spaces") or [{}]
        s = spaces[0]
        rows.append({
            "rank": entry.get("rank"), "folder": r.get("folder"), "named_by": r.get("named_by"),
            "snapshot": r.get("snapshot"), "capacity_bytes": s.get("capacity_bytes"),
            "capacity_source": s.get("capacity_source"), "capacity_basis": s.get("capacity_basis"),
            "allocated_bytes_peak": s.get("allocated_bytes_peak"),
            "ooms": [o.get("verdict") for o in s.get("ooms", [])],
            "pause_s": r.get("pause_s"), "states_refused": r.get("states_refused"),
            "state_snapshots": r.get("state_snapshots"),
        })  # fmt: skip
    folders = sorted(p.name for p in out.iterdir() if p.is_dir()) if out.is_dir() else []
    return [{"folders": folders}, *rows]


def _facts_file(path: Path) -> Observed:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def torchrun_2(work: Path, limit: float) -> Observed:
    launcher = shlex.split(os.environ.get("RECORD_CHECK_LAUNCHER", "")) or (
        [shutil.which("torchrun") or "torchrun", "--nproc_per_node=2"]
    )
    out = work / "torchrun_2"
    done, doc = record(out, ["--interval", "1"], [*launcher, str(JOBS), "frag"], limit)
    final0 = _facts_file(out / "rank0" / "final.device.json")
    oom1 = _facts_file(out / "rank1" / "oom-1.device.json")
    return {"exit_code": done.returncode, "ranks": rank_facts(out, doc),
            "rank0_final_reason": final0.get("reason"), "rank1_oom": oom1.get("oom"),
            "device_total_bytes": ((oom1.get("devices") or [{}])[0]).get("total_memory_bytes"),
            "alerts": sum("ALERT rank 1" in ln for ln in done.stderr.splitlines())}  # fmt: skip


def spawn_2(work: Path, limit: float) -> Observed:
    out = work / "spawn_2"
    done, doc = record(out, [], [PY, str(JOBS), "spawn", "2"], limit)
    return {"exit_code": done.returncode, "ranks": rank_facts(out, doc)}


def sigterm(work: Path, limit: float) -> Observed:
    out = work / "sigterm"
    proc = subprocess.Popen([PY, "-m", "nsysfrag", "record", "-o", str(out), "--", PY, str(JOBS), "hold", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + limit / 2
    while time.monotonic() < deadline and not (out / "rank0" / "process.json").exists():
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=limit / 2)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    final = _facts_file(out / "rank0" / "final.device.json")
    return {"exit_code": proc.returncode, "final_reason": final.get("reason"),
            "said": [ln for ln in err.splitlines() if "SIGTERM" in ln][:3]}  # fmt: skip


def fraction(work: Path, limit: float) -> Observed:
    out = work / "fraction"
    done, doc = record(out, [], [PY, str(JOBS), "fraction", "0.25"], limit)
    oom = _facts_file(out / "rank0" / "oom-1.device.json")
    return {"exit_code": done.returncode, "ranks": rank_facts(out, doc), "fraction": 0.25,
            "device_total_bytes": ((oom.get("devices") or [{}])[0]).get("total_memory_bytes"),
            "oom": oom.get("oom"), "blocks_of_256_mib": (done.stdout.split() or ["?"])[0]}  # fmt: skip


PAUSE_COST = """
import json, time, torch
torch.cuda.memory._record_memory_history(max_entries=100000)
held = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
for _ in range(40000):
    x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda"); del x
t = time.perf_counter(); torch.cuda.memory_snapshot(); full = time.perf_counter() - t
try:
    t = time.perf_counter(); torch.cuda.memory_snapshot(include_traces=False); light = time.perf_counter() - t
except TypeError:
    light = None
print(json.dumps({"memory_snapshot_s": full, "without_traces_s": light}))
"""


def entries_100k(work: Path, limit: float) -> Observed:
    out = work / "entries_100k"
    started = time.monotonic()
    done, doc = record(out, ["--entries", "100000", "--interval", "1", "--state-every", "1",
                             "--state-budget", "1"], [PY, str(JOBS), "churn", "40000"], limit * 0.6)  # fmt: skip
    cost = subprocess.run([PY, "-c", PAUSE_COST], capture_output=True, text=True, check=False,
                          timeout=max(5.0, limit - (time.monotonic() - started)))  # fmt: skip
    try:
        costs = json.loads(cost.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        costs = {"error": cost.stderr[-500:]}
    return {"exit_code": done.returncode, "ranks": rank_facts(out, doc), "unrecorded": costs}


def monitor_step(work: Path, limit: float) -> Observed:
    out = work / "monitor_step"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([PY, str(JOBS), "monitor", "200", str(out)], capture_output=True,
                          text=True, timeout=limit, check=False, env=env)  # fmt: skip
    lines = []
    for path in out.glob("rank*/timeline.jsonl"):
        lines += [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    pauses = [ln.get("cost_s", 0.0) + ln.get("state_cost_s", 0.0) for ln in lines]
    return {"exit_code": done.returncode, "steps": 200, "rated": (done.stdout.split() or ["?"])[-1],
            "samples": len(lines), "states": sum("state" in ln for ln in lines),
            "longest_pause_s": max(pauses, default=None), "error": done.stderr[-300:]}  # fmt: skip


CHECKS = [Check("torchrun_2", 90, torchrun_2), Check("spawn_2", 45, spawn_2),
          Check("sigterm", 30, sigterm), Check("fraction", 30, fraction),
          Check("entries_100k", 60, entries_100k), Check("monitor_step", 45, monitor_step)]  # fmt: skip


def main() -> int:
    findings = Path(sys.argv[1])
    findings.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("RECORD_CHECK_WORK", "/tmp/nsysfrag-record-check"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    only = {n for n in os.environ.get("RECORD_CHECK_ONLY", "").split(",") if n}
    limits = dict(kv.split("=") for kv in os.environ.get("RECORD_CHECK_LIMITS", "").split(",") if "=" in kv)
    truth: Observed = {"environment": environment(), "checks": {}}
    for check in CHECKS:
        if only and check.name not in only:
            continue
        limit = float(limits.get(check.name, check.limit_s))
        started = time.monotonic()
        result: Observed = {"check": check.name, "limit_s": limit}
        try:
            result["observed"] = check.run(work, limit)
        except subprocess.TimeoutExpired:
            result["timed_out"] = True
        except Exception as err:  # noqa: BLE001  (one check's failure is its own)
            result["error"] = f"{type(err).__name__}: {err}"
        result["wall_s"] = round(time.monotonic() - started, 2)
        if "observed" in result:
            result["problems"] = problems(check.name, result["observed"])
        result["passed"] = "observed" in result and not result["problems"]
        (findings / f"{check.name}.json").write_text(json.dumps(result, indent=1) + "\n")
        truth["checks"][check.name] = result
        (findings / "record_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
        print(f"{check.name}: {'passed' if result['passed'] else 'FAILED'} in {result['wall_s']} s", flush=True)
    return 0 if all(r["passed"] for r in truth["checks"].values()) else 1


def environment() -> Observed:
    try:
        import torch

        props = torch.cuda.get_device_properties(0)
        return {"torch": torch.__version__, "device": props.name,
                "total_memory_bytes": props.total_memory, "devices": torch.cuda.device_count()}  # fmt: skip
    except Exception as err:  # noqa: BLE001
        return {"error": f"{type(err).__name__}: {err}"}


def verdict(name: str, observed: Observed) -> bool:
    return not problems(name, observed)


if __name__ == "__main__":
    sys.exit(main())

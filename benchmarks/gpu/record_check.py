"""The checks ``record_check.sh`` runs on a GPU; findings to ``FINDINGS/record_check.json``.

1. ``nsysfrag record --interval 1 -- torchrun --nproc_per_node=2 frag_oom.py``: the exit code
   (torchrun's 1: rank 1 failed), rank 1's OOM snapshot and its facts, the verdict of its OOM
   (fragmentation), capacity = ``torch.cuda.get_device_properties(0).total_memory`` with
   source "device" and no capacity warning, alert lines for rank 1, both ranks' final
   snapshots (rank 0's taken on torchrun's SIGTERM), the sampled timeline in the report.
2. Overhead: ``benchmarks/bench_record.py`` (off / history / record / busy, interleaved).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("RECORD_CHECK_WORK", "/tmp/nsysfrag-record-check"))


def main() -> int:
    findings_dir = Path(sys.argv[1])
    findings: dict[str, Any] = {"torch": torch.__version__, "checks": {}}
    checks = findings["checks"]
    props = torch.cuda.get_device_properties(0)
    findings["device"] = {"name": props.name, "total_memory_bytes": props.total_memory,
                          "count": torch.cuda.device_count()}  # fmt: skip
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    out, job = WORK / "rec", WORK / "job.json"
    torchrun = shutil.which("torchrun") or ""
    command = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "nsysfrag", "record", "-o", str(out), "--interval", "1",
         "--json", str(job), "--", *command, "--nproc_per_node=2",
         str(REPO / "benchmarks" / "gpu" / "frag_oom.py")],
        capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    findings["record_wall_s"] = round(time.monotonic() - started, 2)
    (findings_dir / "record_stderr.log").write_text(done.stderr[-200_000:])
    (findings_dir / "record_stdout.log").write_text(done.stdout[-200_000:])
    findings["record_exit_code"] = done.returncode
    checks["exit code is torchrun's (1)"] = done.returncode == 1
    checks["rank 1 has oom-1.pickle"] = (out / "rank1" / "oom-1.pickle").is_file()
    checks["both ranks have final.pickle"] = all((out / f"rank{r}" / "final.pickle").is_file() for r in (0, 1))
    alerts = [ln for ln in done.stderr.splitlines() if "ALERT rank 1" in ln]
    findings["alert_lines"] = alerts[:10]
    checks["alert lines for rank 1"] = bool(alerts)
    try:
        doc = json.loads(job.read_text())
    except (OSError, ValueError) as err:
        findings["job_error"] = str(err)
        doc = {"ranks": []}
    ranks = {e["rank"]: e.get("analysis") for e in doc["ranks"]}
    r1 = ranks.get(1) or {}
    spaces = r1.get("spaces", [])
    if spaces:
        s = spaces[0]
        findings["rank1"] = {
            "capacity_bytes": s["capacity_bytes"], "capacity_source": s["capacity_source"],
            "health": s["health"], "peak_global_frag": s["peak"]["global_frag"],
            "ooms": [{k: o.get(k) for k in ("requested_bytes", "verdict", "device_free_bytes",
                      "recorded_device_free_bytes", "stranded_bytes", "reserved_bytes")}
                     for o in s["ooms"]],
            "warnings": r1["trace"]["warnings"],
        }  # fmt: skip
        checks["verdict is fragmentation"] = bool(s["ooms"]) and s["ooms"][0]["verdict"] == "fragmentation"
        checks["capacity = device total memory"] = s["capacity_bytes"] == props.total_memory
        checks["capacity source is device"] = s["capacity_source"] == "device"
        checks["no capacity warning"] = not any("capacity" in w for w in r1["trace"]["warnings"])
    recorded = r1.get("recorded") or {}
    findings["rank1_recorded"] = {k: recorded.get(k) for k in ("samples", "sample_cost_s", "state_snapshots", "state_cost_s")}
    findings["rank0_recorded"] = {k: (ranks.get(0) or {}).get("recorded", {}).get(k) for k in ("samples", "sample_cost_s", "state_snapshots", "state_cost_s")}
    checks["sampled timeline in the report"] = bool(recorded.get("samples"))
    facts = out / "rank0" / "final.device.json"
    findings["rank0_final_reason"] = json.loads(facts.read_text()).get("reason") if facts.is_file() else None
    bench = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_record.py"), "--seconds", "11", "--runs", "2"],
        capture_output=True, text=True, timeout=170, check=False,
    )  # fmt: skip
    findings["overhead"] = bench.stdout.splitlines() + bench.stderr.splitlines()[-5:]
    findings["all_passed"] = all(checks.values())
    (findings_dir / "record_check.json").write_text(json.dumps(findings, indent=1) + "\n")
    print(json.dumps(findings, indent=1))
    return 0 if findings["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The checks ``record_try_check.sh`` runs on a GPU; findings to
``FINDINGS/record_try_check.json``.

``nsysfrag record --try expandable_segments:True --try garbage_collection_threshold:0.8
--duration 15 -- python try_growing.py``: the exit code (0), a record folder per run with a
final snapshot each (taken on the SIGTERM of --duration), every run ended by --duration, the
figures of the nsysfrag-try/1 document equal to the allocator's own memory_stats() peaks
beside each final snapshot, expandable_segments:True kept, and what-if's prediction beside
each run with its error (reported as found: the point of the check is to measure it).
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
WORK = Path(os.environ.get("RECORD_TRY_CHECK_WORK", "/tmp/nsysfrag-record-try-check"))
SETTINGS = ("expandable_segments:True", "garbage_collection_threshold:0.8")


def final_peak(folder: Path) -> int | None:
    facts = json.loads((folder / "rank0" / "final.device.json").read_text())
    peaks = [d["memory_stats"].get("reserved_bytes.all.peak") for d in facts["devices"] if "memory_stats" in d]
    return max(peaks) if peaks else None


def main() -> int:
    findings_dir = Path(sys.argv[1])
    findings: dict[str, Any] = {"torch": torch.__version__, "checks": {}}
    checks = findings["checks"]
    props = torch.cuda.get_device_properties(0)
    findings["device"] = {"name": props.name, "total_memory_bytes": props.total_memory}
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    out, doc_path = WORK / "round", WORK / "round.json"
    tries = [arg for s in SETTINGS for arg in ("--try", s)]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "nsysfrag", "record", "-o", str(out), *tries, "--duration", "15",
         "--json", str(doc_path), "--html", str(findings_dir / "record_try.html"), "--",
         sys.executable, str(REPO / "benchmarks" / "gpu" / "try_growing.py")],
        capture_output=True, text=True, timeout=240, check=False, env={**os.environ, "COLUMNS": "120"},
    )  # fmt: skip
    findings["round_wall_s"] = round(time.monotonic() - started, 2)
    (findings_dir / "record_try_stdout.log").write_text(done.stdout[-200_000:])
    (findings_dir / "record_try_stderr.log").write_text(done.stderr[-200_000:])
    findings["exit_code"] = done.returncode
    checks["exit code 0"] = done.returncode == 0
    try:
        doc = json.loads(doc_path.read_text())
    except (OSError, ValueError) as err:
        findings["document_error"] = str(err)
        doc = None
    if doc is not None:
        runs = doc["runs"]
        checks["schema nsysfrag-try/1"] = doc["schema"] == "nsysfrag-try/1"
        checks["baseline then each setting"] = [r["setting"] for r in runs] == ["baseline", *SETTINGS]
        checks["every run ended by --duration"] = all(r["ended"] == "duration" for r in runs)
        checks["every run has its final snapshot"] = all((out / r["folder"] / "rank0" / "final.pickle").is_file() for r in runs)
        checks["peak reserved is memory_stats()'s"] = all(
            r["ranks"] and r["ranks"][0]["peak_reserved_bytes"] == final_peak(out / r["folder"]) for r in runs
        )
        checks["a what-if prediction beside every run"] = all(r["ranks"] and r["ranks"][0]["predicted"] for r in runs)
        checks["expandable_segments:True kept"] = doc["verdict"]["keep"] == "expandable_segments:True"
        findings["verdict"] = doc["verdict"]["line"]
        findings["whatif_baseline_error"] = doc["whatif_baseline_error"]
        findings["runs"] = [
            {"setting": r["setting"], "job": r["job"], "ranks": r["ranks"]} for r in runs
        ]
        findings["settings"] = doc["settings"]
    findings["passed"] = all(checks.values()) and bool(checks)
    (findings_dir / "record_try_check.json").write_text(json.dumps(findings, indent=1, default=str) + "\n")
    print(json.dumps({"checks": checks, "verdict": findings.get("verdict")}, indent=1))
    return 0 if findings["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

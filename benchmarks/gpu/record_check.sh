#!/usr/bin/env bash
# The GPU checks of `nsysfrag record` in one command, on a machine with PyTorch and a CUDA
# device (no nsys, nothing installed, no network: nsysfrag runs from this checkout):
#
#     bash benchmarks/gpu/record_check.sh [FINDINGS_DIR]      # default: $OUT, else /tmp
#
# Six independent checks (record_check.py lists them), each in processes of its own under its
# own limit (300 s in all), each writing FINDINGS_DIR/<check>.json the moment it ends and
# FINDINGS_DIR/record_truth.json after it; the whole script stops at 6 minutes whatever
# happens, and what was written stays. To keep the truth, copy record_truth.json to
# sample_traces/record_truth/<device>-torch<version>.json and commit it: tests/test_record_truth.py
# then holds `record` to it. Exit 0 when every check passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
findings=${1:-${OUT:-/tmp}}
mkdir -p "$findings"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1 || true
} > "$findings/record_check.log" 2>&1
timeout -k 5 355 "${PYTHON:-python3}" benchmarks/gpu/record_check.py "$findings" 2>&1 | tee -a "$findings/record_check.log"
exit "${PIPESTATUS[0]}"

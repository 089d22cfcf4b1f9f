#!/usr/bin/env bash
# The GPU check of `nsysfrag record` (issue 27), ready to run as is on a machine with PyTorch
# and a CUDA device (no nsys needed, nothing installed: nsysfrag runs from this checkout):
#
#     bash benchmarks/gpu/record_check.sh [FINDINGS_DIR]      # default: $OUT, else /tmp
#
# About 3 minutes on one H200. It runs `nsysfrag record -- torchrun --nproc_per_node=2
# benchmarks/gpu/frag_oom.py` (a fragmentation OOM on rank 1), checks the record (the OOM
# snapshot, the verdict, capacity = the device's total memory, the alerts, the exit code) and
# times training steps with and without the recorder; the findings go to
# FINDINGS_DIR/record_check.json (and the logs beside it). Exit 0 when every check passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
findings=${1:-${OUT:-/tmp}}
mkdir -p "$findings"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec timeout 290 "${PYTHON:-python3}" benchmarks/gpu/record_check.py "$findings"

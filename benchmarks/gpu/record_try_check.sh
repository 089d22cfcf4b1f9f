#!/usr/bin/env bash
# The GPU check of `nsysfrag record --try` (issue 34), on its own: ready to run as is on a
# machine with PyTorch and a CUDA device (nothing installed: nsysfrag runs from this checkout):
#
#     bash benchmarks/gpu/record_try_check.sh [FINDINGS_DIR]      # default: $OUT, else /tmp
#
# About 2 minutes on one H200: one round of `benchmarks/gpu/try_growing.py` (a step loop whose
# activation grows) under the baseline, expandable_segments:True and
# garbage_collection_threshold:0.8, each run ended by --duration 15; the findings (the table's
# figures, the verdict, what-if's predictions and their errors) go to
# FINDINGS_DIR/record_try_check.json. Exit 0 when every check passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
findings=${1:-${OUT:-/tmp}}
mkdir -p "$findings"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec timeout 290 "${PYTHON:-python3}" benchmarks/gpu/record_try_check.py "$findings"

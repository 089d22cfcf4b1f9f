#!/usr/bin/env bash
# The observed model's ground truth from a real GPU, in one call: run from the repository root
# on a machine with an NVIDIA GPU and CuPy (no nsys, no install of nsysfrag needed).
#
#   bash benchmarks/gpu/driver_truth.sh            # files into $OUT, else ./driver_truth
#
# It records the three runs of sample_traces/make_driver_traces.py (driver_<run>.sqlite and
# driver_<run>_truth.json, a few MB in all), then, where the machine has nsysfrag's
# dependencies, checks the model against them at once (tests/test_driver_truth.py on a copy in
# sample_traces/). Everything, the log included, lands in the output folder: 7 files. To keep
# the truth, copy the six driver_* files into sample_traces/ and commit them; the test then
# holds every later change of the model to them. Extra arguments go to make_driver_traces.py
# (--budget 0 fills the whole card; the exports grow to tens of MB).
set -uo pipefail
out="${OUT:-driver_truth}"
mkdir -p "$out"
log="$out/driver_truth.log"
export PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1
  python3 -c 'import cupy, sys; print("cupy", cupy.__version__, "python", sys.version.split()[0])'
} 2>&1 | tee "$log"

timeout 240 python3 sample_traces/make_driver_traces.py --out "$out" --timeout 100 "$@" 2>&1 | tee -a "$log"
recorded=${PIPESTATUS[0]}
echo "make_driver_traces.py exit $recorded" | tee -a "$log"

if [ "$recorded" -ne 0 ]; then
  echo "no check: the recording failed" | tee -a "$log"
elif python3 -c 'import numba, click, rich, pandas, pytest, hypothesis' 2>/dev/null; then
  # The check reads the truth files where they will be committed (this is the device's copy).
  cp "$out"/driver_*.sqlite "$out"/driver_*_truth.json sample_traces/
  PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_driver_truth.py \
    -k agrees_with_the_recorded_driver 2>&1 | tail -n 40 | tee -a "$log"
else
  echo "nsysfrag's dependencies are missing here: run tests/test_driver_truth.py elsewhere" | tee -a "$log"
fi
ls -l "$out" | tee -a "$log"
exit "$recorded"

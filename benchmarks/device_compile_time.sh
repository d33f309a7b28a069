#!/usr/bin/env bash
# One compile_time.py command on the device tool, with everything its results file is
# checked against kept beside it: the per-scenario logs, the kernel-config table
# (diag_kernel_configs.py) and the sweep's cache database when it fits.
# Usage (in a device call, after `bash .wheelhouse/install`):
#   bash benchmarks/device_compile_time.sh MODEL SCENARIOS TIMEOUT_S [extra compile_time.py args]
set -uo pipefail
model=$1 scenarios=$2 timeout=$3; shift 3
out=${OUT:?OUT is the device tool\'s output folder}/$model
mkdir -p "$out"
date -u +"start %FT%TZ"
python benchmarks/compile_time.py --models "$model" --scenarios "$scenarios" --runs 20 --timeout "$timeout" \
  --kernel-profile --keep-tmp --out "$out" --log-dir "$out/logs" --no-merge "$@" > "$out/run.log" 2>&1
rc=$?
# The newest run's folder: an earlier command on the same warm machine leaves its own.
python benchmarks/diag_kernel_configs.py "$(ls -td /tmp/compile_time_"${model}"_* | head -1)" > "$out/kernel_configs.txt" 2>&1
date -u +"end %FT%TZ"
grep -A40 "^model " "$out/run.log" | head -40
exit $rc

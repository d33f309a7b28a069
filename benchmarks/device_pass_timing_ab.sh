#!/usr/bin/env bash
# The sweep's end-to-end pass timed kernel-bound or not: the same model swept by two code
# trees, side by side on one GPU, each sweep's cache then warm-started on a quiet CPU with
# a kernel profile (compile_time.py). With BUSY=1 the sweeps run beside one spinning
# process per CPU core (other compiles on the host, as when sweeps or pass lanes run side
# by side); the warm starts never do.
# Usage (in a device call, after `bash .wheelhouse/install`; OLD is an earlier checkout,
# e.g. `git archive <commit> | tar -x -C .devrun/old`):
#   OLD=.devrun/old BUSY=1 bash benchmarks/device_pass_timing_ab.sh MODEL [MODEL...]
# MODEL: compile_time.py's names (resnet, gpt) or a model file (a zoo stub:
#   python benchmarks/zoo/__init__.py stub bert infer /root/stub).
set -uo pipefail
out=${OUT:?OUT is the device tool\'s output folder}
old=$(realpath "${OLD:?OLD is the earlier checkout}") new=$PWD work=/root/pass_timing_ab
mkdir -p "$work"
log() { echo "$(date -u +%T) $*" >> "$work/run.log"; }
hogs() { for _ in $(seq "$(nproc)"); do python3 -c 'while True: pass' & done; }
for model in "$@"; do
  name=$(basename "$model" .py)
  for tree in old new; do
    code=$old; [ "$tree" = new ] && code=$new
    [ "${BUSY:-0}" = 1 ] && hogs
    log "$name $tree sweep (busy=${BUSY:-0})"
    (cd /root && PYTHONPATH=$code timeout 240 python "$code/benchmarks/compile_time.py" --models "$model" \
      --scenarios sweep --cache "sqlite:///$work/${name}_$tree.db" --out "$work/${name}_${tree}_sweep" \
      --log-dir "$work/logs/${name}_$tree" >> "$work/run.log" 2>&1)
    pkill -f 'while True: pass'; sleep 1
    log "$name $tree warm start (quiet)"
    (cd /root && PYTHONPATH=$code timeout 120 python "$code/benchmarks/compile_time.py" --models "$model" \
      --scenarios warm-start --cache "sqlite:///$work/${name}_$tree.db" --kernel-profile --runs 30 \
      --out "$work/${name}_${tree}_warm" --log-dir "$work/logs/${name}_$tree" >> "$work/run.log" 2>&1)
    (cd "$work" && tar czf "$out/pass_timing_ab.tgz" .)  # the device tool brings back few files: one archive
  done
done
log done

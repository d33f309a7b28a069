#!/usr/bin/env bash
# conformance.py queues side by side, one per GPU of a multi-GPU host, each with its share of
# the host's cores for compiling. A queue runs its invocations one after another into
# /root/zoo/g<GPU> (kept while the machine stays warm, so the next call resumes there); every
# invocation gets what is left of the call's budget. The results, each queue's log and every
# child's output come back as one archive ($OUT/zoo.tgz): the device tool brings back few files.
# Usage (in a device call, after `bash .wheelhouse/install`):
#   BUDGET=520 bash benchmarks/device_conformance_queues.sh \
#     "0:--models mlp_mixer --modes infer --dynamics static,auto,dynamic --baselines none" \
#     "1:--models swin_t --modes infer --dynamics static --baselines static"
# An argument is GPU:ARGS (conformance.py's arguments); name a GPU twice for two invocations
# on it, run in the order given. Afterwards, here: merge each queue's results into the table
#   python benchmarks/conformance.py --merge <committed json> g0/conformance_<gpu>.json ...
set -uo pipefail
out=${OUT:?OUT is the device tool\'s output folder}
budget=${BUDGET:-520} zoo=${ZOO:-/root/zoo} start=$SECONDS
gpus=$(printf '%s\n' "$@" | cut -d: -f1 | sort -u)
threads=$(( $(nproc) / $(echo "$gpus" | wc -l) ))
mkdir -p "$zoo"
queue() {  # GPU, then its invocations' arguments
  local gpu=$1; shift
  for args in "$@"; do
    local left=$(( budget - (SECONDS - start) ))
    [ "$left" -lt 60 ] && { echo "$(date -u +%T) skipped (${left}s left): $args" >> "$zoo/g$gpu.log"; continue; }
    echo "$(date -u +%T) gpu $gpu: $args --budget $left" >> "$zoo/g$gpu.log"
    # shellcheck disable=SC2086  # ARGS is a list of arguments
    # conformance.py cuts a step at its budget; the margin is for its cleanup (Ray's teardown)
    CUDA_VISIBLE_DEVICES=$gpu TORCHINDUCTOR_COMPILE_THREADS=$threads timeout $(( left + 60 )) \
      python benchmarks/conformance.py $args --budget "$left" --out "$zoo/g$gpu" \
      --log-dir "$zoo/g$gpu/logs" >> "$zoo/g$gpu.log" 2>&1
    local rc=$?  # 124: cut by the margin above, its step's results lost
    echo "$(date -u +%T) gpu $gpu: exit $rc" >> "$zoo/g$gpu.log"
  done
}
for gpu in $gpus; do
  mapfile -t mine < <(printf '%s\n' "$@" | sed -n "s/^$gpu://p")
  queue "$gpu" "${mine[@]}" &
done
wait
(cd "$zoo" && tar czf "$out/zoo.tgz" --exclude='*_work' .)
for gpu in $gpus; do echo "== gpu $gpu"; tail -n 25 "$zoo/g$gpu.log"; done

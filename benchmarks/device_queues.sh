#!/usr/bin/env bash
# Benchmark commands side by side on one multi-GPU host, within one device call.
#   BUDGET=560 bash benchmarks/device_queues.sh \
#     "0,1:python -m benchmarks.distributed --kinds ddp --no-cpu --out \$Q --logs \$Q/logs" \
#     "2:python -m benchmarks.startup --models resnet --out \$Q --log-dir \$Q/logs" \
#     "any:python -m benchmarks.startup --models mlp --out \$Q --log-dir \$Q/logs"
# GPUS:CMD runs on those GPUs (CUDA_VISIBLE_DEVICES), in turn with the other commands of the same
# GPUS. any:CMD is pooled: each GPU whose own commands are done takes the next one and runs it
# alone. Each command runs in its own folder $Q (the spec's order, q1, q2, ...), with $LEFT the
# seconds left of BUDGET, and is stopped at BUDGET. Every queue gets its share of the host's cores
# for Inductor's compile workers. The folders come back as $OUT/queues.tgz (the device tool
# returns few files), their last log lines are printed last.
set -uo pipefail
out=${OUT:?OUT is the device tool\'s output folder}
budget=${BUDGET:-560} root=${QUEUES:-/root/queues} start=$SECONDS
mkdir -p "$root"
pool="$root/pool" lock="$root/pool.lock"
: > "$pool"
n=0
declare -A own
for spec in "$@"; do
  n=$((n + 1)) gpus=${spec%%:*} cmd=${spec#*:}
  if [ "$gpus" = any ]; then printf 'q%s\t%s\n' "$n" "$cmd" >> "$pool"
  else own[$gpus]+="q$n"$'\t'"$cmd"$'\n'; fi
done
sets=("${!own[@]}")
threads=$(( $(nproc) / $(printf '%s\n' "${sets[@]}" | tr ',' '\n' | sort -u | wc -l) ))
run_one() {  # GPUS, "qN<TAB>command"
  local gpus=$1 name=${2%%$'\t'*} cmd=${2#*$'\t'} left=$(( budget - (SECONDS - start) ))
  local dir="$root/$name" began=$SECONDS
  mkdir -p "$dir"
  [ "$left" -lt 30 ] && { echo "$(date -u +%T) skipped (${left}s left): $cmd" > "$dir/queue.log"; return 1; }
  echo "$(date -u +%T) gpus $gpus, ${left}s left: $cmd" > "$dir/queue.log"
  Q=$dir LEFT=$left CUDA_VISIBLE_DEVICES=$gpus TORCHINDUCTOR_COMPILE_THREADS=$threads PYTHONUNBUFFERED=1 \
    timeout "$left" bash -c "$cmd" >> "$dir/queue.log" 2>&1
  echo "$(date -u +%T) exit $? after $(( SECONDS - began ))s" >> "$dir/queue.log"
}
take() {  # the next pooled command, removed from the pool; nothing when it is empty
  ( flock 9; head -n 1 "$pool"; sed -i 1d "$pool" ) 9> "$lock"
}
consume() {  # one GPU takes pooled commands until none is left or time is up
  local job
  while job=$(take) && [ -n "$job" ]; do run_one "$1" "$job" || break; done
}
queue() {  # GPUS: its own commands, then each of its GPUs takes from the pool
  local gpus=$1 job gpu
  while IFS= read -r job; do [ -n "$job" ] && run_one "$gpus" "$job"; done <<< "${own[$gpus]}"
  for gpu in ${gpus//,/ }; do consume "$gpu" & done
  wait
}
for gpus in "${sets[@]}"; do queue "$gpus" & done
wait
(cd "$root" && tar czf "$out/queues.tgz" --exclude='*_work' --exclude='*.db' q*)
for dir in "$root"/q*; do echo "== $(basename "$dir")"; tail -n 12 "$dir/queue.log"; done

#!/usr/bin/env bash
# Conformance queues side by side, one per GPU of a multi-GPU host, each with its share of the
# host's cores. A queue runs its invocations in turn into $ZOO/g<GPU> (kept while the machine
# stays warm, so the next call resumes there), each with what is left of BUDGET seconds.
#   BUDGET=520 bash benchmarks/device_conformance_queues.sh \
#     "0:--models mlp_mixer --dynamics static,auto,dynamic --baselines none" \
#     "any:--models gpt2 --dynamics auto,dynamic --baselines none"
# GPU:ARGS runs on that GPU; any:ARGS is shared: the first queue to run out of its own takes it,
# into $ZOO/s<hash of ARGS>, so the same ARGS resumes there in the next call. Everything comes
# back as $OUT/zoo.tgz; the results files and cache databases also as $OUT/resume.tgz, which a
# call on a fresh machine starts from (RESUME, default .conformance/resume.tgz). SEED=FILE starts
# every folder without results from that table (conformance --seed). Afterwards, here:
#   python -m benchmarks.conformance --merge benchmarks/results/conformance.json g0/conformance.json ...
set -uo pipefail
out=${OUT:?OUT is the device tool\'s output folder}
budget=${BUDGET:-520} zoo=${ZOO:-/root/zoo} start=$SECONDS resume=${RESUME:-.conformance/resume.tgz}
mkdir -p "$zoo"
if [ -s "$resume" ] && [ -z "$(ls -A "$zoo")" ]; then
  tar xzf "$resume" -C "$zoo" && echo "resumed from $resume: $(cd "$zoo" && ls -d g* s* 2>/dev/null | tr '\n' ' ')"
fi
pool="$zoo/pool" lock="$zoo/pool.lock"
printf '%s\n' "$@" | sed -n 's/^any://p' > "$pool"
gpus=$(printf '%s\n' "$@" | grep -v '^any:' | cut -d: -f1)
if [ -s "$pool" ]; then
  gpus="$gpus $(seq 0 $(( ${GPUS:-$(nvidia-smi -L | wc -l)} - 1 )))"
fi
gpus=$(printf '%s\n' $gpus | sort -un)
threads=$(( $(nproc) / $(echo "$gpus" | wc -l) ))
run_one() {  # GPU, its output folder, conformance.py's arguments
  local gpu=$1 dir=$2 args=$3 left=$(( budget - (SECONDS - start) ))
  [ "$left" -lt 60 ] && { echo "$(date -u +%T) skipped (${left}s left): $args" >> "$zoo/g$gpu.log"; return 1; }
  echo "$(date -u +%T) gpu $gpu: $args --budget $left --out $dir" >> "$zoo/g$gpu.log"
  # shellcheck disable=SC2086  # ARGS is a list of arguments
  # conformance.py cuts a step at its budget; the margin is for its cleanup (Ray's teardown)
  CUDA_VISIBLE_DEVICES=$gpu TORCHINDUCTOR_COMPILE_THREADS=$threads timeout $(( left + 60 )) \
    python -m benchmarks.conformance $args ${SEED:+--seed "$SEED"} --budget "$left" --out "$dir" \
    --log-dir "$dir/logs" >> "$zoo/g$gpu.log" 2>&1
  local rc=$?  # 124: cut by the margin above, its step's results lost
  echo "$(date -u +%T) gpu $gpu: exit $rc" >> "$zoo/g$gpu.log"
}
take() {  # the next shared invocation, removed from the pool; nothing when it is empty
  ( flock 9; head -n 1 "$pool"; sed -i 1d "$pool" ) 9> "$lock"
}
queue() {  # GPU, then its own invocations' arguments
  local gpu=$1 args; shift
  for args in "$@"; do run_one "$gpu" "$zoo/g$gpu" "$args"; done
  while args=$(take) && [ -n "$args" ]; do
    run_one "$gpu" "$zoo/s$(printf '%s' "$args" | md5sum | cut -c1-8)" "$args" || break
  done
}
for gpu in $gpus; do
  mapfile -t mine < <(printf '%s\n' "$@" | sed -n "s/^$gpu://p")
  queue "$gpu" "${mine[@]}" &
done
wait
rm -f "$pool" "$lock"
(cd "$zoo" && tar czf "$out/zoo.tgz" --exclude='*_work' . \
  && tar czf "$out/resume.tgz" $(find . -mindepth 2 -maxdepth 2 \( -name 'conformance.json' -o -name '*_work' \)))
for gpu in $gpus; do echo "== gpu $gpu"; tail -n 25 "$zoo/g$gpu.log"; done

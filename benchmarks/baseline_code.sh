#!/usr/bin/env bash
# Another version's code for `python -m benchmarks.startup --baseline DIR`, which times its
# warm-start scenario in turn with this checkout's, in one run (a commit that has startup.py):
#   bash benchmarks/baseline_code.sh COMMIT [DIR]        # DIR defaults to .baseline/COMMIT
# DIR gets the commit's package installed (autotune with its cache, workers and inductor_glue
# subpackages, as a wheel lays them out) and its benchmarks folder; a process started there
# imports them ahead of this checkout's. Pure Python: made on this machine, it runs on the GPU
# host's Python too (carry the folder with the run).
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(git rev-parse --short "${1:?usage: baseline_code.sh COMMIT [DIR]}^{commit}")
dir=${2:-.baseline/$commit}
source=$(mktemp -d -t autotune-baseline.XXXXXX)
trap 'rm -rf "$source"' EXIT
git archive "$commit" | tar -x -C "$source"
rm -rf "$dir.partial"
mkdir -p "$dir.partial"
python -m pip install --quiet --no-deps --no-build-isolation --no-compile --target "$dir.partial" "$source"
rm -rf "$source/benchmarks/results" "$dir.partial/bin"  # its code only: the results are this checkout's
cp -r "$source/benchmarks" "$dir.partial/benchmarks"
echo "$commit" > "$dir.partial/BASELINE_COMMIT"
rm -rf "$dir"
mv "$dir.partial" "$dir"  # whole or not at all
echo "$dir: the code of $commit"

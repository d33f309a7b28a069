#!/usr/bin/env bash
# One commit's code for a device call, apart from this checkout's working tree (which may be
# changing while the call runs): its `git archive` and the stamp naming it, in .devcode/.
#
#   here:       bash benchmarks/device_copy.sh [COMMIT]        # default HEAD
#   device:     carry [".wheelhouse", ".devcode"]; the command starts with
#               source .devcode/unpack && python3 -m benchmarks.startup ... --out $OUT
#
# `unpack` lays the archive out in /root/code with the stamp, installs the wheels and the
# project from there, and leaves the shell in /root/code: each run records COMMIT, checked
# against the files by the harness. A later call on the same warm machine unpacks again.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
commit="$(git rev-parse --verify "${1:-HEAD}^{commit}")"
mkdir -p .devcode
grep -qx '/.devcode/' .git/info/exclude 2>/dev/null || echo '/.devcode/' >> .git/info/exclude
git archive --format=tar.gz -o .devcode/code.tgz "$commit"
python -m benchmarks.harness stamp --commit "$commit" --to .devcode/code_stamp.json
cat > .devcode/unpack <<'UNPACK'
rm -rf /root/code && mkdir -p /root/code && tar xzf .devcode/code.tgz -C /root/code \
  && cp .devcode/code_stamp.json /root/code/benchmarks/code_stamp.json && cp -r .wheelhouse /root/code/ \
  && cd /root/code && bash .wheelhouse/install
UNPACK
echo "wrote .devcode/ for ${commit:0:12} ($(du -h .devcode/code.tgz | cut -f1)); carry .wheelhouse and .devcode"

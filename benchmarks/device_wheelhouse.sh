#!/usr/bin/env bash
# The device tool carries at most 64 MiB: the repository (about 16 MB, growing with every run's
# logs) plus .wheelhouse (about 50 MB, Ray's wheel 40 MB of it) left no room for anything else,
# such as the zoo's cache databases carried from one device call to the next. Ray's wheel is
# deflate-compressed file by file; stored uncompressed and then xz-compressed as a whole it is
# about 20 MB.
# Usage:
#   here, once after ../shared/device/build-wheelhouse:  bash benchmarks/device_wheelhouse.sh pack
#   there, first in a device call (instead of `bash .wheelhouse/install`):
#     bash benchmarks/device_wheelhouse.sh install
set -euo pipefail
house=${WHEELHOUSE:-.wheelhouse}
case "${1:-}" in
  pack)
    for whl in "$house"/*.whl; do
      [ "$(stat -c %s "$whl")" -gt 8000000 ] || continue
      python3 - "$whl" <<'EOF'
import sys, zipfile
path = sys.argv[1]
with zipfile.ZipFile(path) as src, zipfile.ZipFile(path + ".stored", "w", zipfile.ZIP_STORED) as dst:
    for info in src.infolist():
        dst.writestr(info, src.read(info.filename), compress_type=zipfile.ZIP_STORED)
EOF
      xz -9 -T0 -c "$whl.stored" > "$whl.xz.part" && mv "$whl.xz.part" "$whl.xz"
      rm -f "$whl" "$whl.stored"
      echo "packed $(basename "$whl"): $(stat -c %s "$whl.xz") bytes"
    done
    du -sb "$house" ;;
  install)
    for packed in "$house"/*.whl.xz; do
      [ -e "$packed" ] || continue
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[1][:-3], "wb"), 1 << 20)' "$packed"
      rm -f "$packed"
    done
    bash "$house/install" ;;
  *)
    echo "usage: $0 pack|install (pack here after build-wheelhouse; install first on the device)" >&2
    exit 2 ;;
esac

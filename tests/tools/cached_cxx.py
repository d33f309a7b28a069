"""A content-addressed cache of C++ compiles, for the test suite only.

Every tuning job compiles in fresh Inductor cache dirs (so that it really benchmarks), and the
suite's sweeps and jobs compile the same few tiny kernels again and again: g++ was most of a CPU
sweep's CPU time (65 s of compiles in a 51 s sweep of tests/models/tiny_two_widths.py on the
2-core CI machine). tests/conftest.py points ``CXX`` at a ``g++`` shim that runs this file.
g++ still builds every distinct source; an identical command on an identical source gets
the very file g++ made for it, by copy. Anything it cannot key safely (no ``-o``, a source
that includes a file by a relative path, an input it cannot read) goes to g++ unchanged.

    python cached_cxx.py CACHE_DIR REAL_COMPILER ARGS...
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

SOURCES = (".cpp", ".cc", ".cxx", ".c", ".o")


def key(args: list[str], output: str) -> str | None:
    digest = hashlib.sha256()
    for arg in args:
        if arg == output:
            digest.update(b"<output>\0")
        elif arg.endswith(SOURCES) and os.path.isfile(arg):
            try:
                with open(arg, "rb") as source:
                    content = source.read()
            except OSError:
                return None  # g++ says what is wrong with it
            if not arg.endswith(".o") and b'#include "' in content:
                return None  # a header beside the source would not be in the key
            digest.update(b"<input>" + hashlib.sha256(content).digest() + b"\0")
        else:
            digest.update(arg.encode() + b"\0")
    return digest.hexdigest()


def main(cache_dir: str, real: str, args: list[str]) -> int:
    output = args[args.index("-o") + 1] if "-o" in args[:-1] else None
    name = key(args, output) if output and output.endswith((".so", ".o")) else None
    if name is None:
        return subprocess.call([real, *args])
    cached = os.path.join(cache_dir, name[:2], name + os.path.splitext(output)[1])
    if os.path.isfile(cached):
        shutil.copyfile(cached, output)
        shutil.copymode(cached, output)
        return 0
    code = subprocess.call([real, *args])
    if code == 0 and os.path.isfile(output):
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=os.path.dirname(cached))
        os.close(handle)
        shutil.copyfile(output, partial)
        shutil.copymode(output, partial)
        os.replace(partial, cached)  # atomic: a concurrent compile of the same key is harmless
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))

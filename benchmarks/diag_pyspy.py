"""Where a scenario's first call spent its wall time, from AUTOTUNE_BENCH_PYSPY samples.

``compile_time.py`` with ``AUTOTUNE_BENCH_PYSPY=DIR`` runs each scenario under py-spy
(every thread, waits included, collapsed stacks). This reads one such file and prints:

- the main thread's first call (setup, ``torch.compile``, the call itself), grouped by the
  frames below it, and the time spent in a few functions worth naming;
- what every other thread was doing over the whole process (the hook's loader threads,
  compile workers' readers...), waits included.

py-spy's rate is nominal: compare shares within a file, not seconds between files.

    python benchmarks/diag_pyspy.py spy/gpt-warm-start-artifacts.txt --depth 6
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

# _run_scenario's calls that make up the timed first call (compile_time.py)
FIRST_CALL = ("_setup", "_compile_workload", "_run_scenario.<locals>.call")
NAMED = ("triton_hash_with_backend", "triton_key", "compile_module_from_src", "load_by_key_path",
         "_waiting_emit", "Thread.join", "CompilePackage.install", "load_guard_manager", "_audit_fork_safety")
_FRAME = re.compile(r" \(.*?([^/]+):(\d+)\)")


def _short(frame: str) -> str:
    return _FRAME.sub(r"(\1:\2)", frame)


def summarize(path: Path, depth: int, rate: int) -> str:
    ms = 1000 / rate
    first: collections.Counter[str] = collections.Counter()
    named: collections.Counter[str] = collections.Counter()
    others: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, samples = stack.split(";"), int(count)
        start = next((i for i, f in enumerate(frames) if f.startswith("_run_scenario (")), None)
        if "MainThread" in frames[0] and start is not None and len(frames) > start + 1 \
                and frames[start + 1].startswith(FIRST_CALL):
            first[";".join(_short(f) for f in frames[start + 1:start + 1 + depth])] += samples
            for name in NAMED:
                if name in stack:
                    named[name] += samples
        elif "MainThread" not in frames[0]:
            others[" ; ".join(_short(f) for f in frames[3:6]) + " ... " + _short(frames[-1])] += samples
    out = [f"first call: {sum(first.values()) * ms:.0f} ms sampled (main thread)"]
    out += [f"{n * ms:7.0f} ms  {k}" for k, n in first.most_common(25)]
    out += ["", "named functions inside the first call:"]
    out += [f"{n * ms:7.0f} ms  {k}" for k, n in named.most_common()]
    out += ["", "other threads, whole process (waits included):"]
    out += [f"{n * ms:7.0f} ms  {k[:300]}" for k, n in others.most_common(15)]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", type=Path, help="a DIR/<model>-<scenario>.txt from AUTOTUNE_BENCH_PYSPY")
    parser.add_argument("--depth", type=int, default=6, help="frames below _run_scenario to group by")
    parser.add_argument("--rate", type=int, default=200, help="py-spy's sampling rate (compile_time uses 200)")
    args = parser.parse_args()
    print(summarize(args.samples, args.depth, args.rate))


if __name__ == "__main__":
    main()

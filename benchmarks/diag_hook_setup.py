"""Where `autotune.warm_start()` spends its time on this machine (diagnostic).

Runs fresh processes after `import torch` and CUDA init (as compile_time.py's
clock does) and prints: the cost of the imports a compile pays anyway, and a
cProfile of `warm_start()` with a signing key and a trusted key on an empty
SQLite cache.

    python benchmarks/diag_hook_setup.py [--top 40]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap

PRELUDE = """
import time, torch
if torch.cuda.is_available():
    torch.ones(1, device="cuda").sum().item()
t0 = time.perf_counter()
"""

PROBES = {
    "import torch._inductor.select_algorithm": "import torch._inductor.select_algorithm",
    "import torch._inductor.compile_fx": "import torch._inductor.compile_fx",
    "import triton": "import triton",
    "pin_triton_toolchain()": "from autotune.inductor_glue.env import pin_triton_toolchain; pin_triton_toolchain()",
    "import autotune.hook": "import autotune.hook",
}


def _run(body: str) -> str:
    code = PRELUDE + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return done.stdout + (done.stderr[-2000:] if done.returncode else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--after-compile-imports", action="store_true",
                        help="import torch._inductor.compile_fx before the clock starts (every compile "
                             "imports it; compile_time.py times the hook after it the same way) and "
                             "also time the hook's background threads")
    args = parser.parse_args()
    if args.after_compile_imports:
        global PRELUDE
        PRELUDE = PRELUDE.replace("t0 = ", "import torch._inductor.compile_fx\nt0 = ")
    for label, statement in PROBES.items():
        out = _run(f"{statement}\nprint(f'{{time.perf_counter() - t0:.2f}}')")
        print(f"{label:45s} {out.strip()} s")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-c", "import autotune.cli; cli.main()", "keys", "new", f"{tmp}/k"], check=True, capture_output=True)
        out = _run(f"""
            import cProfile, pstats, io
            import autotune
            profile = cProfile.Profile()
            profile.enable()
            handle = autotune.warm_start("sqlite:///{tmp}/c.db", trusted_keys=["{tmp}/k.pub"],
                                         signing_key="{tmp}/k")
            profile.disable()
            print(f"warm_start() with keys: {{time.perf_counter() - t0:.2f}} s")
            import threading
            for thread in threading.enumerate():
                # The one-shot threads only: the cache's executor threads wait for work forever.
                if thread.name in ("autotune-imports", "autotune-kernel-configs"):
                    thread.join(timeout=60)
                    print(f"  thread {{thread.name}} done at {{time.perf_counter() - t0:.2f}} s")
            for order in ("cumulative", "tottime"):
                text = io.StringIO()
                pstats.Stats(profile, stream=text).sort_stats(order).print_stats({args.top})
                print(text.getvalue())
        """)
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

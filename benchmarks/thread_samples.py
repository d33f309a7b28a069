"""What every thread of a process does over time: a sampler for benchmark children, and its report.

A profile follows one thread; a warm start's time goes to several at once (the install, the
prefetch, the script's own thread waiting at the import gate), and a second lost at 0 s of
model building lies in how they wait for each other. So a child started with
``PREFETCH_SAMPLE_DIR`` set (``benchmarks/startup.py``) runs ``Sampler``: every ``INTERVAL_S``
it reads each thread's Python stack (``sys._current_frames``) and the CPU time Linux has given
it (``/proc/self/task/TID/schedstat``) and, at the first call's end, writes them to one JSON
file. A stack alone cannot tell a thread that runs from one that waits for the GIL at the same
line; its CPU time can: a thread waiting for the GIL uses none. Reading them holds the GIL for
well under a millisecond per sample on these processes, so the sampled process runs much as it
would.

    python -m benchmarks.thread_samples FILE.json [...]   # each thread's activity, 100 ms a row
    python -m benchmarks.thread_samples --cpu FILE.json [...]   # each thread's CPU share, and the script's waits
    python -m benchmarks.thread_samples --within cache.py:triton_key FILE.json [...]   # when each thread was in it
    python -m benchmarks.thread_samples B.json [...] --modules-beyond A.json [...]   # imported in B, not A
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

INTERVAL_S = 0.01
MAX_FRAMES = 60  # innermost first; deeper stacks (Dynamo's) keep their innermost frames
MAX_S = 120.0  # a sampler never outlives this, whatever the child does
# Innermost frames that mean a thread is blocked, not running Python.
WAITS = ("threading.py:wait", "threading.py:join", "threading.py:_wait_for_tstate_lock", ":_wait_for_the_gate",
         ":_poll", "queue.py:get", "thread.py:_worker", ":wait_for", "subprocess.py:communicate",
         "subprocess.py:_wait", "selectors.py:select", "_base.py:result")


class Sampler:
    """Samples every thread's stack on a daemon thread until ``stop(path)``."""

    def __init__(self, began: float) -> None:
        self._began = began
        self._stacks: dict[tuple[str, ...], int] = {}
        self._samples: list[tuple[float, list[tuple[str, int, int | None]]]] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()

    def _stack_id(self, frame: FrameType | None) -> int:
        names: list[str] = []
        while frame is not None and len(names) < MAX_FRAMES:
            code = frame.f_code
            names.append(f"{_short(code.co_filename)}:{code.co_name}")
            frame = frame.f_back
        return self._stacks.setdefault(tuple(names), len(self._stacks))

    def _run(self) -> None:
        own = threading.get_ident()
        while not self._stopped.wait(INTERVAL_S):
            now = time.perf_counter() - self._began
            if now > MAX_S:
                return
            threads = {t.ident: t for t in threading.enumerate() if t.ident != own}
            # CPU times first: reading them releases the GIL, and the stacks must be let go of
            # before anything does (``_sample_stacks``).
            cpu = {ident: _cpu_ns(thread) for ident, thread in threads.items()}
            stacks = self._sample_stacks(own)
            self._samples.append((now, [(_name(threads.get(ident), ident), stack, cpu.get(ident))
                                        for ident, stack in stacks.items()]))

    def _sample_stacks(self, own: int) -> dict[int, int]:
        """Each thread's stack, by id. The frames are let go of on return: a frame held past its
        return keeps its locals alive. Held until the next sample, as they were, they failed 9 of the
        training step's 12 sampled max-autotune processes in its CUDA graph trees ("These storage
        data ptrs are not allocated in pool"), and none of its unsampled ones: a tensor that
        outlives its step breaks the trees' accounting of their memory pool."""
        return {ident: self._stack_id(frame) for ident, frame in sys._current_frames().items() if ident != own}

    def stop(self, path: Path) -> None:
        self._stopped.set()
        self._thread.join()
        path.parent.mkdir(parents=True, exist_ok=True)
        stacks = [list(s) for s, _ in sorted(self._stacks.items(), key=lambda item: item[1])]
        # The modules imported by then: what one way of starting imported that another did not.
        path.write_text(json.dumps({"interval_s": INTERVAL_S, "stacks": stacks, "samples": self._samples,
                                    "modules": sorted(sys.modules)}))


def _name(thread: threading.Thread | None, ident: int) -> str:
    return thread.name if thread is not None else str(ident)


def _cpu_ns(thread: threading.Thread | None) -> int | None:
    """The nanoseconds a thread has run on a CPU, as Linux counts them (None: not on Linux, or gone)."""
    native = getattr(thread, "native_id", None)
    if native is None:
        return None
    try:
        with open(f"/proc/self/task/{native}/schedstat", "rb") as stat:
            return int(stat.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _short(filename: str) -> str:
    """A file's path from its package down (``torch/_inductor/...``), or its name."""
    for root in ("/torch/", "/triton/", "/sqlalchemy/", "/autotune/", "/benchmarks/", "/examples/",
                 "/importlib/", "/cryptography/"):
        at = filename.rfind(root)
        if at >= 0:
            return filename[at + 1:]
    return filename.rsplit("/", 1)[-1]


# ------------------------------------------------------------------------------- the report


def activity(stack: list[str]) -> str:
    """One line for a stack: waiting or running, at its innermost frame and the nearest of ours."""
    if not stack:
        return "-"
    inner = stack[0]
    ours = next((f for f in stack if f.startswith(("autotune/", "benchmarks/", "examples/"))), "")
    # The module that the thread's outermost import executes: what that import was for.
    loads = [i for i, f in enumerate(stack) if f.endswith("_find_and_load")]
    imported = next((f for f in reversed(stack[:loads[-1]]) if f.endswith(":<module>")), "") if loads else ""
    state = "wait" if any(w in inner for w in WAITS) else "run"
    return f"{state} {inner} <- {ours or inner}" + (f" [{imported.removesuffix(':<module>')}]" if imported else "")


def _load(path: Path) -> tuple[dict[str, Any], list[list[str]]]:
    """A sampler's file: its data and its stacks, by id."""
    data: dict[str, Any] = json.loads(path.read_text())
    return data, data["stacks"]


def report(path: Path, bucket_s: float = 0.1) -> str:
    data, stacks = _load(path)
    rows: dict[int, dict[str, Counter[str]]] = {}
    running: Counter[str] = Counter()
    for now, threads in data["samples"]:
        row = rows.setdefault(int(now / bucket_s), {})
        for name, stack_id, *_ in threads:
            label = activity(stacks[stack_id])
            row.setdefault(name, Counter())[label] += 1
            if label.startswith("run"):
                running[name] += 1
    lines = [f"# {path.name}: threads' samples that ran Python, x{data['interval_s']} s: "
             + ", ".join(f"{n} {c * data['interval_s']:.2f}" for n, c in running.most_common())]
    for index in sorted(rows):
        parts = [f"{name}: {counts.most_common(1)[0][0]}" for name, counts in sorted(rows[index].items())
                 if not counts.most_common(1)[0][0].startswith("wait threading.py:wait <- -")]
        lines.append(f"{index * bucket_s:6.1f}  " + " | ".join(parts))
    return "\n".join(lines)


def within(path: Path, frame: str) -> str:
    """Each thread's first and last sample with ``frame`` on its stack (seconds from the child's start)."""
    data, stacks = _load(path)
    spans: dict[str, list[float]] = {}
    for now, threads in data["samples"]:
        for name, stack_id, *_ in threads:
            if any(f.endswith(frame) for f in stacks[stack_id]):
                span = spans.setdefault(name, [now, now])
                span[1] = now
    end = data["samples"][-1][0] if data["samples"] else 0.0
    parts = ", ".join(f"{name} {a:.2f}-{b:.2f} s" for name, (a, b) in sorted(spans.items(), key=lambda kv: kv[1][0]))
    return f"| {path.name} | {end:.2f} | {parts or '-'} |"


def _cpu_deltas(samples: list[Any]) -> list[tuple[float, float, dict[str, float]]]:
    """Per interval between two samples: its start, its end and each thread's CPU seconds in it.
    A thread first seen after the first sample started since (Linux counts its time from 0)."""
    last: dict[str, int] = {}
    out: list[tuple[float, float, dict[str, float]]] = []
    previous = 0.0
    for index, (now, threads) in enumerate(samples):
        used: dict[str, float] = {}
        for name, _stack, *cpu in threads:
            ns = cpu[0] if cpu else None
            if ns is None:
                continue
            before = last.get(name, ns if index == 0 else 0)
            used[name] = max(0, ns - before) / 1e9
            last[name] = ns
        if index:
            out.append((previous, now, used))
        previous = now
    return out


def _main_states(samples: list[Any], stacks: list[list[str]]) -> list[str]:
    """The script's thread's activity at each sample (``activity``, without the module imported)."""
    states = []
    for _now, threads in samples:
        main = next((stack for name, stack, *_ in threads if name == "MainThread"), None)
        states.append(activity(stacks[main]).split(" [")[0] if main is not None else "-")
    return states


def _add(into: dict[str, float], more: dict[str, float]) -> None:
    for name, seconds in more.items():
        into[name] = into.get(name, 0.0) + seconds


def cpu_report(path: Path, bucket_s: float = 0.25, top: int = 6) -> str:
    """Each thread's CPU seconds: in all, per ``bucket_s`` (with the script's activity), and while
    the script's thread did each of its ``top`` longest activities (a wait at the import gate:
    what ran meanwhile)."""
    data, stacks = _load(path)
    samples = data["samples"]
    deltas = _cpu_deltas(samples)
    if not deltas or not any(used for _a, _b, used in deltas):
        return f"# {path.name}: no CPU times (sampled before they were recorded, or not on Linux)"
    states = _main_states(samples, stacks)
    total: dict[str, float] = {}
    buckets: dict[int, dict[str, float]] = {}
    bucket_state: dict[int, Counter[str]] = {}
    by_state: dict[str, dict[str, float]] = {}
    state_s: dict[str, float] = {}
    for (began, ended, used), state in zip(deltas, states[1:]):
        index = int(ended / bucket_s)
        _add(buckets.setdefault(index, {}), used)
        bucket_state.setdefault(index, Counter())[state] += 1
        _add(by_state.setdefault(state, {}), used)
        _add(state_s, {state: ended - began})
        _add(total, used)

    def shares(used: dict[str, float]) -> str:
        parts = [f"{name} {seconds:.2f}" for name, seconds in sorted(used.items(), key=lambda kv: -kv[1])
                 if seconds >= 0.005]
        return ", ".join(parts) + f"; all {sum(used.values()):.2f}"

    lines = [f"# {path.name}: CPU s up to the first result ({deltas[-1][1]:.2f} s): {shares(total)}",
             "## while the script's thread ...", ]
    for state, seconds in sorted(state_s.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"- {seconds:5.2f} s {state}: CPU s {shares(by_state[state])}")
    lines.append(f"## every {bucket_s:g} s: the script's thread, then each thread's CPU s")
    for index in sorted(buckets):
        state = bucket_state[index].most_common(1)[0][0]
        lines.append(f"{index * bucket_s:6.2f}  {state[:70]:70}  {shares(buckets[index])}")
    return "\n".join(lines)


def module_difference(first: list[Path], second: list[Path]) -> str:
    """The modules every process of ``second`` had imported by its first result and no process
    of ``first`` had, by top-level package, then each."""
    def imported(paths: list[Path]) -> list[set[str]]:
        return [set(_load(path)[0].get("modules", ())) for path in paths]

    ones, twos = imported(first), imported(second)
    extra = sorted(set.intersection(*twos) - set().union(*ones)) if twos else []
    packages = Counter(name.partition(".")[0] for name in extra)
    lines = [f"# {len(extra)} modules in every one of {len(twos)} processes and in none of {len(ones)}: "
             + ", ".join(f"{package} {count}" for package, count in packages.most_common())]
    lines += extra
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--bucket", type=float, default=0.1, help="seconds a row (default 0.1)")
    parser.add_argument("--within", metavar="FRAME", help="a table instead: when each thread ran FRAME "
                        "(a stack entry's end, as file.py:function)")
    parser.add_argument("--cpu", action="store_true", help="each thread's CPU seconds: in all, while the "
                        "script's thread did each of its longest activities, and per --bucket")
    parser.add_argument("--modules-beyond", metavar="FILE", type=Path, nargs="+",
                        help="list the modules FILES' processes all imported and none of these did")
    args = parser.parse_args(argv)
    if args.modules_beyond:
        print(module_difference(args.modules_beyond, args.files))
        return 0
    if args.cpu:
        print("\n\n".join(cpu_report(path, args.bucket) for path in args.files))
        return 0
    if args.within:
        print(f"| samples | first result at s | threads in {args.within} |\n| --- | --- | --- |")
    for path in args.files:
        print(within(path, args.within) if args.within else report(path, args.bucket))
    return 0


if __name__ == "__main__":
    sys.exit(main())

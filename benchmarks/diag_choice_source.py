"""Why does a reproduced request get other choice hashes? Diff the candidates' kernel sources.

Captures MODEL in dry-run mode, then rebuilds its first N requests as one-op
graphs in this process, and for each Triton candidate present on one side only,
prints a unified diff of the two benchmark-module sources (matched by the
choice's description). A debugging aid for the key-match check in the sweep.

usage: python benchmarks/diag_choice_source.py examples/resnet.py [--requests 2] [--device cuda]
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.inductor_glue.capture import CAPTURE_CONFIG, CapturePolicy, fresh_inductor, _run_once  # noqa: E402
from autotune.inductor_glue.inductor import choice_hash, installed  # noqa: E402
from autotune.inductor_glue.modelfile import load_model_file  # noqa: E402
from autotune.workers.reproduce import one_op_graph  # noqa: E402
from autotune.workers.symbolic import symbol_numbers  # noqa: E402


def _sources(choices: list[Any]) -> dict[str, tuple[str, str]]:
    out = {}
    for c in choices:
        path = getattr(getattr(c, "bmreq", None), "module_path", None)
        text = Path(path).read_text() if path and Path(path).exists() else ""
        out[choice_hash(c)] = (str(getattr(c, "description", "")), text)
    return out


class Recording(CapturePolicy):
    def lookup(self, request, choices, benchmark, default):  # type: ignore[no-untyped-def]
        self.sources = getattr(self, "sources", {})
        self.sources.setdefault(request.to_request().key, {}).update(_sources(choices))
        return super().lookup(request, choices, benchmark, default)


def replay_sources(request_json: dict[str, Any], overrides: dict[str, Any], device: str) -> dict[str, Any]:
    """Replay one request here; return its candidates' sources (run locally or in a Ray actor)."""
    import os

    import torch

    from autotune.cache.records import TuningRequest

    request = TuningRequest.from_json(request_json)
    graph = one_op_graph(request, device)
    replay = Recording(device=device)
    with fresh_inductor({**overrides, **CAPTURE_CONFIG}), installed(replay), symbol_numbers(graph.symbol_ids):
        with torch.no_grad():
            torch.compile(graph.fn, mode="max-autotune", dynamic=graph.dynamic)(*graph.inputs)
    return {"sources": getattr(replay, "sources", {}).get(request.key, {}),
            "keys": [o.inputs_key for o in replay.seen.values()], "environ": dict(os.environ)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--ray", action="store_true", help="replay inside a Ray actor with num_gpus=1")
    args = parser.parse_args()
    model = load_model_file(args.model)
    module, inputs = model.build(None)
    captured = Recording(device=args.device)
    with fresh_inductor({**model.config_overrides, **CAPTURE_CONFIG}), installed(captured):
        _run_once(module, inputs, "max-autotune", False, args.device)

    import os

    replay_fn: Any = replay_sources
    if args.ray:
        import ray

        ray.init(include_dashboard=False)
        remote = ray.remote(num_gpus=1 if args.device == "cuda" else 0)(replay_sources)
        replay_fn = lambda *a: ray.get(remote.remote(*a))  # noqa: E731
    for observed in list(captured.seen.values())[: args.requests]:
        request = observed.to_request()
        replayed = replay_fn(request.to_json(), model.config_overrides, args.device)
        before = captured.sources[request.key]
        after = {h: tuple(v) for h, v in replayed["sources"].items()}
        env_diff = {k: (os.environ.get(k), v) for k, v in replayed["environ"].items() if os.environ.get(k) != v}
        env_diff.update({k: (v, None) for k, v in os.environ.items() if k not in replayed["environ"]})
        print(f"   environment differences (here, replay): {env_diff}")
        print(f"== {request.op} {request.inputs_key}")
        print(f"   replay saw keys: {replayed['keys']}")
        only_before = {d: s for h, (d, s) in before.items() if h not in after}
        only_after = {d: s for h, (d, s) in after.items() if h not in before}
        print(f"   candidates: {len(before)} captured, {len(after)} replayed, "
              f"{len(only_before)} only captured, {len(only_after)} only replayed")
        for desc, source in list(only_before.items())[:1]:
            other = only_after.get(desc) or next(iter(only_after.values()), "")
            diff = difflib.unified_diff(source.splitlines(), other.splitlines(), "captured", "replayed", n=1)
            print("\n".join(list(diff)[:80]))


if __name__ == "__main__":
    main()

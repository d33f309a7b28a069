"""How far the zoo's MoE output moves when only its router's GEMM rounds differently (issue 81).

The served MoE on a GPU deviates from eager far more than cold max-autotune does (issue 81's
table). This asks what a router kernel that is not bit for bit ATen's can do, with no compiler
involved: the full-size MoE (``examples/zoo.py``, seeded as the zoo seeds it) runs in
eager mode with its router's logits computed in other orders, each a result a correct GEMM
kernel may return (fp32 accumulation, then one rounding to the output's dtype):

- ``fp32``: the whole dot product in fp32, one rounding (a Triton template's result);
- ``split-k N``: the reduction in N chunks summed in fp32 (split-K, decompose-k);
- ``reversed-k``: the reduction in the other order;
- ``one tie nudged``: eager's logits with one logit raised by about one unit in the last place,
  that of the expert losing the first exact tie at the k-th place: one token rerouted, no more.

For each: how many logits differ from eager's at all, the tokens whose top-k experts changed,
the tokens whose capacity slot changed (a token routed elsewhere shifts the slots of every later
token of both experts, and one past capacity is dropped), and the output's deviation and moved
rows as ``moe_routing`` measures them. Exact ties in eager's probabilities are counted too: in
bf16 two experts' probabilities are often equal, and ``topk`` then picks by index.

    python -m benchmarks.moe_sensitivity                  # the full-size MoE, bf16, on this CPU
    python -m benchmarks.moe_sensitivity --batch 2 --dtype float32
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import harness

ORDERS = ("eager", "fp32", "split-k 2", "split-k 8", "reversed-k", "one tie nudged")


def _nudge_first_tie(logits: Any, k: int) -> Any:
    """``logits`` with the k-th place's first exact tie broken the other way: the loser's logit
    raised by 2**-7 of itself (one or two units in bf16's last place)."""
    ranked = logits.softmax(-1).sort(-1, descending=True)
    tied = (ranked.values[:, k - 1] == ranked.values[:, k]).nonzero()
    if len(tied) == 0:
        return logits
    token = int(tied[0])
    chosen = set(logits[token].softmax(-1).topk(k).indices.tolist())
    pair = (int(ranked.indices[token, k - 1]), int(ranked.indices[token, k]))
    loser = next(expert for expert in pair if expert not in chosen)  # as topk broke the tie
    nudged = logits.clone()
    value = float(nudged[token, loser])
    nudged[token, loser] = value + abs(value) * 2**-7
    return nudged


def _router_logits(order: str, k: int) -> Callable[[Any, Any], Any]:
    """The router's logits (tokens @ weight.T) summed in ``order``, rounded once to the dtype."""
    import torch
    from torch.nn import functional as F

    def logits(tokens: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if order == "eager":
            return F.linear(tokens, weight)
        if order == "one tie nudged":
            return _nudge_first_tie(F.linear(tokens, weight), k)
        a, b = tokens.float(), weight.float()
        if order == "fp32":
            out = a @ b.t()
        elif order == "reversed-k":
            out = a.flip(-1) @ b.flip(-1).t()
        else:
            chunks = int(order.split()[-1])
            out = sum((x @ y.t() for x, y in zip(a.chunk(chunks, -1), b.chunk(chunks, -1))),
                      torch.zeros(a.shape[0], b.shape[0]))
        return out.to(tokens.dtype)

    return logits


class _Router:
    """Stands in for the MoE's ``nn.Linear`` router on this one instance."""

    def __init__(self, weight: Any, order: str, k: int) -> None:
        self.weight, self.logits = weight, _router_logits(order, k)
        self.seen: Any = None

    def __call__(self, tokens: Any) -> Any:
        self.seen = self.logits(tokens, self.weight)
        return self.seen


def _routing(logits: Any, k: int) -> tuple[Any, Any]:
    """The top-k experts per token as the MoE picks them, first choice first (the order its slots
    follow), and its probabilities."""
    probabilities = logits.softmax(-1)
    return probabilities.topk(k, dim=-1).indices, probabilities


def _slots(experts: Any, n_experts: int, capacity: int) -> Any:
    """Each (token, choice)'s capacity slot as MoE.forward computes it; -1 where dropped."""
    import torch
    from torch.nn import functional as F

    flat = experts.t().reshape(-1)
    onehot = F.one_hot(flat, n_experts)
    position = (onehot.cumsum(0) * onehot).sum(-1) - 1
    return torch.where(position < capacity, flat * capacity + position, torch.full_like(position, -1))


def measure(batch: int, dtype_name: str) -> dict[str, Any]:
    import torch

    from benchmarks.moe_routing import compare
    from examples import zoo

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)  # as zoo.example seeds it: the same weights and inputs
    built = zoo.BUILDERS["moe"](False)
    (x,) = built.inputs(batch)
    net = built.net.to(dtype=dtype).eval()
    x = x.to(dtype)
    numerator, denominator = net.factor
    n = x.shape[0] * x.shape[1]
    capacity = (n * net.k * numerator + net.experts * denominator - 1) // (net.experts * denominator)
    original = net.router
    del net.router  # so that a plain callable may stand in for the submodule on this instance
    results: dict[str, Any] = {"tokens": n, "capacity": capacity, "orders": {}}
    reference: Any = None
    for order in ORDERS:
        router = _Router(original.weight, order, net.k)
        net.router = router
        began = time.perf_counter()
        with torch.no_grad():
            out = net(x)
        experts, probabilities = _routing(router.seen, net.k)
        slots = _slots(experts, net.experts, capacity)
        row: dict[str, Any] = {"seconds": round(time.perf_counter() - began, 2), "dropped": int((slots < 0).sum())}
        if reference is None:
            reference = {"out": out, "logits": router.seen, "experts": experts, "slots": slots}
            top = probabilities.sort(-1, descending=True).values
            row["exact_ties_at_k"] = int((top[:, net.k - 1] == top[:, net.k]).sum())
        else:
            row.update(compare(out, reference["out"]))
            row["logits_differing"] = int((router.seen != reference["logits"]).sum())
            # Rerouted: another set of experts (the same two in the other order route alike).
            row["tokens_rerouted"] = int((experts.sort(-1).values != reference["experts"].sort(-1).values)
                                         .any(-1).sum())
            row["slots_changed"] = int((slots != reference["slots"]).sum())
        results["orders"][order] = row
    net.router = original  # registered as a submodule again
    return results


def render(run: dict[str, Any]) -> list[str]:
    entry = run.get("entry") or {}
    lines = [f"The zoo's MoE at full size, batch {entry.get('batch')}, {entry.get('dtype')}, in eager mode on "
             f"{entry.get('device')}: {entry.get('tokens')} tokens, capacity {entry.get('capacity')} per expert. "
             "Each row recomputes only the router's logits in another summation order, then rounds once.", ""]
    rows = []
    for order, row in (entry.get("orders") or {}).items():
        rows.append([order, row.get("logits_differing", "-"), row.get("tokens_rerouted", "-"),
                     row.get("slots_changed", "-"), row.get("dropped"),
                     harness.fmt(row.get("deviation"), ".4g") if "deviation" in row else "-",
                     row.get("moved_tokens", "-"), row.get("exact_ties_at_k", "-")])
    lines += harness.table(["router's order", "logits differing", "tokens rerouted", "slots changed",
                            "dropped (token, choice)", "deviation", "moved rows", "exact ties at k in eager"], rows)
    return lines + [""]


def results(out: Path) -> harness.Results:
    return harness.Results(out, "moe_sensitivity", "MoE: the output when only the router's GEMM rounds differently",
                           render)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.moe_sensitivity",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--batch", type=int, default=8, help="the zoo's GPU batch (default 8)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--out", default="benchmarks/results", help="folder of moe_sensitivity.json/.md")
    parser.add_argument("--label", default=None)
    args = parser.parse_args(argv)
    harness.log_to_stderr(False)
    info = harness.machine(120)
    store = results(Path(args.out))
    run = store.run(args.label or f"{harness.slug(info.get('gpu') or 'cpu')}: {args.dtype}, batch {args.batch}",
                    info, "python -m benchmarks.moe_sensitivity " + " ".join(argv))
    run["entry"] = {"batch": args.batch, "dtype": args.dtype, "device": "cpu",
                    **measure(args.batch, args.dtype)}
    store.save()
    print(store.path.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

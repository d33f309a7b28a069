"""Epilogue-fusion and padding verdicts (inductor_glue/fusion.py, padding.py): keyed by
graph and nodes (fusion) or Inductor's own key (padding), recorded when Inductor decides,
served instead of a benchmark, stored as data.

Inductor benchmarks a template's fusions only on GPUs (a CPU's C++ templates are never a
MultiTemplateBuffer), so the template and the scheduler nodes here are small stand-ins
with the attributes the glue reads; Inductor's own FusionResult, FX graphs and the store
are real. tests/test_gpu_fusion.py runs the whole path on a GPU.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch._inductor import ir
from torch._inductor.scheduler import FusionResult, Scheduler
from torch._inductor.virtualized import V

from autotune.inductor_glue import fusion, padding, pinning
from autotune.job.hook import warm_start
from autotune.job.serve_policy import ServePolicy
from autotune.settings import Settings


class _Choice:
    def __init__(self, key: str | None) -> None:
        self.autotune_pin = pinning.Pin("cuda", "fam", key) if key else None
        self._render = object()

    def get_make_kernel_render(self) -> object:
        return self._render


class _Template:
    """The attributes of a MultiTemplateBuffer the glue reads and sets."""

    def __init__(self, *keys: str | None) -> None:
        self.choices = [_Choice(key) for key in keys]
        self.make_kernel_render: object = None

    def finalize_as_triton_caller(self, choice: _Choice) -> None:
        self.make_kernel_render = choice.get_make_kernel_render()


def _node(name: str) -> Any:
    return SimpleNamespace(get_name=lambda: name)


def _graph(fn: Any, *inputs: torch.Tensor) -> Any:
    """What the scheduler sees as V.graph: the FX graph being lowered and its inputs."""
    return SimpleNamespace(orig_gm=torch.fx.symbolic_trace(fn), example_inputs=list(inputs))


def _mm_relu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(a @ b)


def _mm_gelu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(a @ b)


def test_a_graph_fingerprint_depends_on_its_nodes_and_input_layouts_only() -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    same = fusion.graph_fingerprint(_graph(_mm_relu, a, b))
    assert fusion.graph_fingerprint(_graph(_mm_relu, a.clone(), b.clone())) == same  # values do not count
    assert fusion.graph_fingerprint(_graph(_mm_gelu, a, b)) != same
    assert fusion.graph_fingerprint(_graph(_mm_relu, torch.randn(16, 16), b)) != same  # another batch
    assert fusion.graph_fingerprint(_graph(_mm_relu, a.t().contiguous().t(), b)) != same  # another layout


def test_a_fusion_key_names_the_graph_the_pair_and_the_side() -> None:
    key = fusion.fusion_key("graph", _node("op1"), _node("op2"), epilogue=True)
    assert key.startswith(fusion.PREFIX)
    assert key == fusion.fusion_key("graph", _node("op1"), _node("op2"), epilogue=True)
    others = [fusion.fusion_key("other", _node("op1"), _node("op2"), epilogue=True),
              fusion.fusion_key("graph", _node("op1"), _node("op3"), epilogue=True),
              fusion.fusion_key("graph", _node("op1"), _node("op2"), epilogue=False)]
    assert key not in others and len(set(others)) == 3


def test_a_pending_fusion_is_recorded_when_inductor_resolves_it() -> None:
    template, kept = _Template(None, "pin-a", "pin-b"), []

    def benchmark() -> bool:  # Inductor's pending benchmark: it fuses with the second config
        template.finalize_as_triton_caller(template.choices[2])
        return True

    outcome = fusion.recording(FusionResult.from_callable(benchmark), template, kept.append)
    assert isinstance(outcome, FusionResult)
    # Until it runs, not fused: a compile whose scheduler never resolves it fuses nothing there.
    assert kept == [{"fuse": False, "choice": None, "pending": True, "future": False, "resolved": False}]
    assert outcome.callable_fn() is True
    assert kept[-1] == {"fuse": True, "choice": "pin-b", "pending": True, "future": False}  # and in which form


def test_a_refused_fusion_is_recorded_and_an_unnamed_config_is_not() -> None:
    kept: list[dict] = []
    assert fusion.recording(FusionResult.fuse(False), _Template("pin-a"), kept.append).should_fuse is False
    assert kept == [{"fuse": False, "choice": None}]
    unnamed = _Template(None)  # finalized with a config that has no pin: no other process could find it
    unnamed.finalize_as_triton_caller(unnamed.choices[0])
    fusion.recording(FusionResult.fuse(True), unnamed, kept.append)
    assert len(kept) == 1


def test_a_stored_verdict_is_served_without_a_benchmark() -> None:
    scheduler = SimpleNamespace(_has_layout_conflict_for_template=lambda multi: False)
    template = _Template(None, "pin-a", "pin-b")
    refused = fusion.serve(scheduler, template, {"fuse": False, "choice": None})
    assert isinstance(refused, FusionResult) and refused.should_fuse is False
    fused = fusion.serve(scheduler, template, {"fuse": True, "choice": "pin-b"})
    assert fused.should_fuse is True
    assert fusion.finalized_choice(template) is template.choices[2]  # finalized as the pass had it


def test_a_verdict_reached_pending_is_served_pending_and_finalizes_when_resolved() -> None:
    scheduler = SimpleNamespace(_has_layout_conflict_for_template=lambda multi: False)
    template = _Template(None, "pin-a", "pin-b")
    served = fusion.serve(scheduler, template, {"fuse": True, "choice": "pin-b", "pending": True, "future": True})
    assert served.callable_fn is not None and served.future.future.done()  # as an async compile's, done
    assert fusion.finalized_choice(template) is None  # nothing decided before the scheduler resolves it
    assert served.callable_fn() is True and fusion.finalized_choice(template) is template.choices[2]
    refused = fusion.serve(scheduler, template, {"fuse": False, "choice": None, "pending": True, "future": False})
    assert refused.future is None and refused.callable_fn() is False


def test_a_verdict_that_cannot_apply_here_falls_back_to_inductor() -> None:
    scheduler = SimpleNamespace(_has_layout_conflict_for_template=lambda multi: False)
    assert fusion.serve(scheduler, _Template(None, "pin-a"), {"fuse": True, "choice": "pin-z"}) is None
    assert fusion.serve(scheduler, _Template("pin-a"), {"fuse": "yes"}) is None  # malformed data
    conflict = SimpleNamespace(_has_layout_conflict_for_template=lambda multi: True)
    assert fusion.serve(conflict, _Template("pin-a"), {"fuse": True, "choice": "pin-a"}) is None


def test_verdicts_go_to_the_store_and_a_later_process_reads_them(sqlite_url: str) -> None:
    # Filed per device type and versions, as pointwise configs are ("cpu" here: no GPU to name).
    key, verdict = fusion.PREFIX + "abc", {"fuse": True, "choice": "pin-b"}
    writer = ServePolicy(Settings(cache=sqlite_url))
    writer.save_decision("cpu", fusion.PREFIX, key, verdict, "fusion_verdicts_saved")
    writer.save_decision("cpu", padding.PREFIX, padding.decision_key("k"), {"pad": True, "key": "k"},
                         "pad_decisions_saved")
    writer.store.flush(10.0)
    assert (writer.stats.fusion_verdicts_saved, writer.stats.pad_decisions_saved) == (1, 1)
    writer.close()
    reader = ServePolicy(Settings(cache=sqlite_url))
    assert reader.decisions("cpu", fusion.PREFIX) == {key: verdict}  # each kind under its own prefix
    assert list(reader.decisions("cpu", padding.PREFIX)) == [padding.decision_key("k")]
    reader.close()
    read_only = ServePolicy(Settings(cache=sqlite_url, read_only=True))
    read_only.save_decision("cpu", fusion.PREFIX, fusion.PREFIX + "def", {"fuse": False, "choice": None},
                            "fusion_verdicts_saved")
    read_only.store.flush(10.0)
    assert read_only.stats.fusion_verdicts_saved == 0
    read_only.close()


class _Book:
    """A book in memory: what the hook's store does, without the store."""

    def __init__(self, stored: dict[str, dict] | None = None) -> None:
        self.values, self.recorded, self.served_keys = dict(stored or {}), {}, []

    def stored(self, key: str) -> dict | None:
        return self.values.get(key)

    def record(self, key: str, value: dict) -> None:
        self.recorded[key] = value

    def served(self, key: str) -> None:
        self.served_keys.append(key)


def test_a_padding_verdict_is_recorded_where_inductor_times_it_and_served_before_its_own_file() -> None:
    from torch._inductor.fx_passes import pad_mm
    from torch._inductor.utils import fresh_cache

    inductor_key = "((torch.Size([8192, 196]), (196, 1), torch.bfloat16), ...)"
    first = _Book()
    with fresh_cache():  # the node that timed it
        padding.push(first)
        try:
            pad_mm.set_cached_should_pad(inductor_key, False)  # Inductor timed it: no padding
        finally:
            padding.pop()
        assert pad_mm.get_cached_should_pad(inductor_key) is False  # Inductor's own file has it too
    assert first.recorded == {padding.decision_key(inductor_key): {"pad": False, "key": inductor_key}}

    job = _Book(first.recorded)
    with fresh_cache():  # another node
        assert pad_mm.get_cached_should_pad(inductor_key) is None  # Inductor would time it again
        padding.push(job)
        try:
            assert pad_mm.get_cached_should_pad(inductor_key) is False
            assert pad_mm.get_cached_should_pad("another matmul") is None  # unknown: Inductor decides
        finally:
            padding.pop()
    assert job.served_keys == [padding.decision_key(inductor_key)]


def test_the_config_a_fusion_verdict_names_is_generated_even_where_aten_won() -> None:
    index = pinning.PinIndex([], also=frozenset({"key-7"}))
    index.allowed["fam"] = set()  # ATen won this family: no config of it is generated
    assert not index.allows(pinning.Pin("cuda", "fam", "key-1"))
    assert index.allows(pinning.Pin("cuda", "fam", "key-7"))


def test_the_scheduler_patch_is_installed_on_gpus_only_and_removed_with_the_last_book(sqlite_url: str) -> None:
    from torch._inductor.fx_passes import pad_mm

    original, get_pad = Scheduler.__dict__["speedup_by_fusion"], pad_mm.get_cached_should_pad
    with warm_start(sqlite_url):  # on a CPU the C++ backend never times a fusion or a padding
        assert Scheduler.__dict__["speedup_by_fusion"] is original
        assert pad_mm.get_cached_should_pad is get_pad
    book = SimpleNamespace(stored=lambda key: None, record=lambda key, verdict: None, served=lambda key: None)
    fusion.push(book)
    fusion.push(book)
    fusion.pop()
    assert Scheduler.__dict__["speedup_by_fusion"] is not original
    fusion.pop()
    assert Scheduler.__dict__["speedup_by_fusion"] is original


def test_a_worker_pads_no_matmul_and_capture_keeps_what_it_timed() -> None:
    from torch._inductor.fx_passes import pad_mm
    from torch._inductor.utils import fresh_cache

    with fresh_cache():
        pad_mm.set_cached_should_pad("timed on this node", True)
        with padding.as_recorded():  # the worker: the recorded sizes are the graph's, padded or not
            assert pad_mm.get_cached_should_pad("timed on this node") is False
            assert pad_mm.get_cached_should_pad("never timed") is False
        assert pad_mm.get_cached_should_pad("timed on this node") is True
    earlier = {padding.decision_key("stored"): {"pad": True, "key": "stored"}}
    capture = padding.MemoryBook(earlier)
    with fresh_cache():
        padding.push(capture)
        try:
            assert pad_mm.get_cached_should_pad("stored") is True  # an earlier sweep's verdict
            pad_mm.set_cached_should_pad("new", False)
        finally:
            padding.pop()
    assert capture.new == {padding.decision_key("new"): {"pad": False, "key": "new"}}  # what the sweep stores


def test_a_book_that_fails_leaves_the_decision_to_inductor() -> None:
    from torch._inductor.fx_passes import pad_mm
    from torch._inductor.utils import fresh_cache

    def broken(key: str) -> dict:
        raise RuntimeError("the store is gone")

    book = SimpleNamespace(stored=broken, record=lambda key, value: None, served=lambda key: None)
    with fresh_cache():
        pad_mm.set_cached_should_pad("timed here", True)
        padding.push(book)
        try:
            assert pad_mm.get_cached_should_pad("timed here") is True  # Inductor's own answer
        finally:
            padding.pop()


# ------------------------------------------------ one round of Inductor's template fusions

class _Multi(ir.MultiTemplateBuffer):
    """A MultiTemplateBuffer with only what the glue and the scheduler's round read."""

    choices = None  # shadows the base class's property
    allow_prologue_fusion = True
    allow_epilogue_fusion = True

    def __init__(self, *keys: str) -> None:  # no IR behind it
        self.choices = [_Choice(key) for key in keys]
        self.make_kernel_render = None

    def finalize_as_triton_caller(self, choice: _Choice) -> None:
        self.make_kernel_render = choice.get_make_kernel_render()


class _SchedulerNode:
    def __init__(self, *parts: Any, template: _Multi | None = None) -> None:
        self.snodes, self.template = [p for part in parts for p in part.snodes] or [self], template
        self.name = "_".join(n.name for n in self.snodes) if parts else ""

    def get_name(self) -> str:
        return self.name

    def get_first_name(self) -> str:
        return self.snodes[0].name

    def get_nodes(self) -> list[Any]:
        return self.snodes

    def is_template(self) -> bool:
        return any(n.template is not None for n in self.snodes)

    def get_template_node(self) -> _Multi | None:
        return next((n.template for n in self.snodes if n.template is not None), None)


def _leaf(name: str, template: _Multi | None = None) -> _SchedulerNode:
    node = _SchedulerNode(template=template)
    node.name = name
    return node


class _Round:
    """Inductor's own round of template fusions (``Scheduler._try_fusion_pairs`` and
    ``_evaluate_pending_template_fusions``, unchanged) over stand-in nodes: a ``bmm`` template
    ``op5`` whose two inputs are pointwise prologues ``op3`` and ``op4``, as in a Llama
    decoder's rotary embedding."""

    _try_fusion_pairs = Scheduler._try_fusion_pairs
    _evaluate_pending_template_fusions = Scheduler._evaluate_pending_template_fusions
    fuse_if_speedup = Scheduler.fuse_if_speedup
    if hasattr(Scheduler, "_apply_fusion_memory_update"):  # torch 2.15: nothing to do without a memory state
        _apply_fusion_memory_update = Scheduler._apply_fusion_memory_update

    def __init__(self, book: Any) -> None:
        self.template = _Multi("pin-a", "pin-b")
        self.nodes = [_leaf("op3"), _leaf("op4"), _leaf("op5", self.template)]
        self.name_to_fused_node = {n.name: n for n in self.nodes}
        self.seen_template_fusions: set[Any] = set()
        self._fusion_memory_state = None  # torch 2.15's round reads it: None, no memory-aware fusion
        self.benchmarks = 0
        patch = SimpleNamespace(top=book)
        self.speedup_by_fusion = fusion._patched_speedup(type(self)._inductor_benchmark, patch).__get__(self)

    def _inductor_benchmark(self, node1: Any, node2: Any) -> Any:
        """Inductor's answer for a template fusion: pending on an async compile, fused with pin-b."""
        def benchmark() -> bool:
            self.benchmarks += 1
            self.template.finalize_as_triton_caller(self.template.choices[1])
            return True
        return FusionResult.from_callable(benchmark, fusion._pending(lambda: True, True).future)

    def get_fused_node(self, node: Any) -> Any:
        return self.name_to_fused_node[node.get_first_name()]

    def can_fuse(self, node1: Any, node2: Any, is_reorder_round: bool = False, can_reorder: bool = False) -> bool:
        return True

    def will_fusion_create_cycle(self, node1: Any, node2: Any) -> bool:
        return False

    def _has_layout_conflict_for_template(self, multi: Any) -> bool:
        return False

    def fuse_two_nodes(self, node1: Any, node2: Any, fused_nodes: Any) -> Any:
        fused = _SchedulerNode(node1, node2)
        for node in fused.snodes:
            self.name_to_fused_node[node.name] = fused
        fused_nodes.discard(node1)
        fused_nodes.discard(node2)
        fused_nodes.add(fused)
        return fused

    def run(self) -> set[str]:
        """The pairs in Inductor's order; what was fused, by node names."""
        op3, op4, op5 = self.nodes
        fused_nodes, template_fusions = set(self.nodes), {}
        with V.set_graph_handler(_graph(_mm_relu, torch.randn(8, 16), torch.randn(16, 4))):
            self._try_fusion_pairs([(op4, op5), (op3, op5)], {}, template_fusions, fused_nodes, False)
            self._evaluate_pending_template_fusions(template_fusions, fused_nodes)
        return {"+".join(sorted(n.name for n in node.snodes)) for node in fused_nodes}


needs_the_round = pytest.mark.skipif(
    not hasattr(Scheduler, "_evaluate_pending_template_fusions"),
    reason="this torch's scheduler has no round of pending template fusions to replay")


@needs_the_round
def test_a_job_served_the_verdicts_fuses_what_the_pass_fused_without_a_benchmark() -> None:
    sweep = _Book()
    timed = _Round(sweep)
    assert timed.run() == {"op3+op4+op5"} and timed.benchmarks == 2  # both prologues fused
    assert all(v["pending"] is True and v["future"] is True for v in sweep.recorded.values())

    job = _Book(sweep.recorded)
    served = _Round(job)
    assert served.run() == {"op3+op4+op5"}
    assert served.benchmarks == 0 and len(job.served_keys) == 2
    assert fusion.finalized_choice(served.template) is served.template.choices[1]


@needs_the_round
def test_verdicts_served_at_once_would_change_the_round() -> None:
    # Why the form is kept: answered at once, the first prologue fuses inside the loop over
    # pairs, the second pair then names the fused node, misses, and is benchmarked again.
    sweep = _Book()
    _Round(sweep).run()
    at_once = {key: {k: v for k, v in verdict.items() if k not in ("pending", "future")}
               for key, verdict in sweep.recorded.items()}
    job = _Book(at_once)
    served = _Round(job)
    served.run()
    assert served.benchmarks == 1 and len(job.served_keys) == 1


def test_a_pair_recorded_pending_then_resolved_is_stored_once_as_resolved(sqlite_url: str) -> None:
    from autotune.job.hook import _DecisionBook

    key, writer = fusion.PREFIX + "pair", ServePolicy(Settings(cache=sqlite_url))
    book = _DecisionBook(writer, "cpu", fusion.PREFIX, "fusion_verdicts")
    book.record(key, {"fuse": False, "choice": None, "pending": True, "future": True, "resolved": False})
    book.record(key, {"fuse": True, "choice": "pin-b", "pending": True, "future": True})
    writer.store.flush(10.0)
    assert writer.stats.fusion_verdicts_saved == 1  # one decision
    writer.close()
    reader = ServePolicy(Settings(cache=sqlite_url))
    assert reader.decisions("cpu", fusion.PREFIX)[key] == {"fuse": True, "choice": "pin-b", "pending": True,
                                                            "future": True}
    reader.close()

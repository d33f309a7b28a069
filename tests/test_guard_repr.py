"""Identity guards name the tensors they guard without printing them (inductor_glue/guard_repr.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.inductor_glue import guard_repr, seams
from autotune.job.hook import warm_start

pytestmark = pytest.mark.torch_subset


@pytest.fixture
def printed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every tensor torch's printer formats, values and all (the printer itself still runs)."""
    seen: list[Any] = []
    original = torch._tensor_str._str

    def spy(tensor: Any, *args: Any, **kwargs: Any) -> str:
        seen.append(tensor)
        return original(tensor, *args, **kwargs)

    monkeypatch.setattr(torch._tensor_str, "_str", spy)
    yield seen


def _compiled_optimizer_step() -> None:
    """A compiled AdamW step, whose Dynamo guards every parameter and state tensor by identity."""
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()  # its state exists, as after a first eager step

    @torch.compile(backend="eager")
    def step() -> None:
        optimizer.step()

    step()


def test_a_compiled_optimizer_steps_identity_guards_print_no_tensor_under_the_warm_start(
        sqlite_url: str, printed: list[Any]) -> None:
    with warm_start(sqlite_url):
        _compiled_optimizer_step()
    assert printed == []


def test_without_the_warm_start_this_torch_prints_what_its_identity_guards_guard(printed: list[Any]) -> None:
    _compiled_optimizer_step()
    # torch 2.11 prints every guarded tensor; torch 2.13 names its type only.
    assert bool(printed) == guard_repr._needed()


@pytest.mark.parametrize(("version", "needed"), [("2.9.1", False), ("2.10.0", True), ("2.11.0+cu130", True),
                                                 ("2.12.1", True), ("2.13.0+cpu", False), ("2.15.0", False)])
def test_the_guard_seams_are_gated_on_the_releases_whose_identity_guards_print(
        monkeypatch: pytest.MonkeyPatch, version: str, needed: bool) -> None:
    # Read from each release's torch/_dynamo/guards.py: 2.9 annotates nothing, 2.10-2.12 call
    # repr() on the value, 2.13 and later name its type.
    monkeypatch.setattr(torch, "__version__", version)
    assert seams.ID_MATCH_GUARD.needed() is needed and seams.TENSOR_REPR.needed() is needed


def test_the_warm_start_patches_the_guard_and_repr_only_where_the_gate_says_so(sqlite_url: str) -> None:
    from torch._dynamo.guards import GuardBuilder

    original_repr, original_guard = torch.Tensor.__repr__, vars(GuardBuilder)["id_match_unchecked"]
    with warm_start(sqlite_url):
        patched = (torch.Tensor.__repr__ is not original_repr, vars(GuardBuilder)["id_match_unchecked"] is not original_guard)
    assert patched == (guard_repr._needed(), guard_repr._needed())
    assert guard_repr._needed() is seams.ID_MATCH_GUARD.needed()  # 2.11 prints, 2.13 does not: the gate alone decides
    assert (torch.Tensor.__repr__, vars(GuardBuilder)["id_match_unchecked"]) == (original_repr, original_guard)


def test_a_tensor_printed_outside_a_guard_keeps_its_values_while_the_warm_start_is_installed(
        sqlite_url: str, tmp_path: Path) -> None:
    original_repr = torch.Tensor.__repr__
    with warm_start(sqlite_url):
        assert repr(torch.tensor([1.5, 2.5])) == "tensor([1.5000, 2.5000])"
    assert torch.Tensor.__repr__ is original_repr  # uninstalled: torch's own again


def test_a_tensor_is_summarized_without_reading_its_values() -> None:
    assert guard_repr.summary(torch.zeros(2, 3)) == "Tensor(shape=(2, 3), dtype=torch.float32, device=cpu)"
    parameter = torch.nn.Parameter(torch.zeros(4))
    assert guard_repr.summary(parameter) == "Parameter(shape=(4,), dtype=torch.float32, device=cpu)"

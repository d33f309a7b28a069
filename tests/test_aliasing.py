"""GEMMs whose inputs view one buffer: recorded with that aliasing, reproduced with it, served.

A recommender's pairwise interaction, ``bmm(t, t.transpose(1, 2))``, and ``bmm(x, x)`` hand
Inductor one buffer twice; its kernels then take that buffer once, so their source (and on a
GPU their choice hashes) differ from those of two tensors of the same layouts. A worker that
made two tensors reported key_mismatch on an H200. One in-process sweep of
tests/models/tiny_alias.py (capture, then each request tuned as a worker tunes it) is shared
by the end-to-end tests; the store tests write records directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from factories import in_process_sweep, make_env, make_result, serve_in_process

from autotune.cache import Store
from autotune.cache.records import InputLayout, TuningRequest, digest
from autotune.cache.validation import check_request

ALIAS_MODEL = str(Path(__file__).parent / "models" / "tiny_alias.py")

pytestmark = pytest.mark.xdist_group("tiny_alias")


@pytest.fixture(scope="module")
def aliased_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return in_process_sweep(ALIAS_MODEL, tmp_path_factory.mktemp("alias"))


def _strides(request: TuningRequest) -> tuple[tuple[int, ...], ...]:
    return tuple(layout.strides for layout in request.inputs)


def test_capture_records_which_inputs_view_one_buffer(aliased_sweep: dict[str, Any]) -> None:
    requests = aliased_sweep["requests"]
    assert {r.op for r in requests} == {"bmm"}
    by_strides = {_strides(r): r for r in requests}
    transposed = by_strides[((64, 8, 1), (64, 1, 8))]  # t and t.transpose(1, 2)
    same = by_strides[((64, 8, 1), (64, 8, 1))]  # x and x
    assert transposed.aliases == same.aliases == (None, 0)
    assert len(requests) == 2


def test_each_aliased_request_is_reproduced_with_its_aliasing(aliased_sweep: dict[str, Any]) -> None:
    """The worker's one-op graph reads one buffer twice: the same key (aliasing included) and
    every recorded candidate come out, and the winner passes the numerical check."""
    for result in aliased_sweep["results"]:
        assert result.status == "ok", result.error
        assert result.request.aliases == (None, 0)
        assert len(result.candidates) == 2 and all(c.ok for c in result.candidates)  # ATen and the C++ template
        assert result.validation is not None and result.validation["passed"]


def test_warm_start_serves_aliased_requests_without_benchmarking(aliased_sweep: dict[str, Any]) -> None:
    stats, benchmarks, output, expected = serve_in_process(ALIAS_MODEL, aliased_sweep["url"])
    assert benchmarks == 0
    assert (stats["hits"], stats["misses"], stats["errors"]) == (2, 0, 0), stats
    torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-4)


def _layout(strides: tuple[int, ...], alias: int | None = None) -> InputLayout:
    return InputLayout((4, 8, 8), strides, 0, "torch.float32", "cpu", alias=alias)


def _pairwise(alias: int | None) -> TuningRequest:
    return TuningRequest(op="bmm", inputs_key="pairwise", precision="highest",
                         inputs=(_layout((64, 8, 1)), _layout((64, 1, 8), alias)), choice_hashes=("a", "b"))


def test_the_aliasing_round_trips_through_the_store_and_old_rows_still_read(store: Store) -> None:
    env = make_env(device_kind="cpu", device_name="cpu", cuda_version=None, triton_version=None)
    aliased, separate = _pairwise(0), _pairwise(None)
    assert aliased.key != separate.key  # one buffer read twice is another request (another kernel source)
    # A request without aliasing keeps the key and the JSON of rows written before aliasing was recorded.
    assert separate.key == digest("bmm", "pairwise", "highest")
    assert all("alias" not in layout for layout in separate.to_json()["inputs"])
    store.put_results([make_result(env=env, request=aliased), make_result(env=env, request=separate)])
    read = store.lookup(env, aliased.key)
    assert read is not None and read.request == aliased and read.request.inputs[1].alias == 0
    old = store.lookup(env, digest("bmm", "pairwise", "highest"))
    assert old is not None and old.request.aliases == () and old.request == separate
    assert TuningRequest.from_json(aliased.to_json()) == aliased


def test_a_transpose_is_rebuilt_as_one_and_a_slice_as_a_view_of_a_flat_buffer() -> None:
    """workers/aliasing.py: a member that permutes its buffer's first input is that input
    permuted (any sizes, symbolic too); another view is ``as_strided`` on one flat buffer."""
    from autotune.workers.aliasing import groups
    from autotune.workers.reproduce import one_op_graph

    (transposed,) = groups(_pairwise(0))
    assert transposed.perms == ((0, 1, 2), (0, 2, 1))
    left = InputLayout((8, 4), (8, 1), 0, "torch.float32", "cpu")
    right = InputLayout((4, 4), (8, 1), 4, "torch.float32", "cpu", alias=0)  # x[:4, 4:] of the same x
    halves = TuningRequest(op="mm", inputs_key="halves", precision="highest", inputs=(left, right))
    (sliced,) = groups(halves)
    assert sliced.perms is None
    graph = one_op_graph(halves, "cpu")
    assert len(graph.inputs) == 1 and graph.inputs[0].dim() == 1  # one flat buffer holds both
    torch.testing.assert_close(graph.fn(*graph.inputs), graph.reference())
    base = graph.inputs[0]
    rows, halves_of_rows = (torch.stack([base[8 * r + start:8 * r + start + 4] for r in range(count)])
                            for start, count in ((0, 8), (4, 4)))
    torch.testing.assert_close(graph.fn(base), rows @ halves_of_rows)  # x[:, :4] @ x[:4, 4:] of x = (8, 8)


def test_an_alias_that_names_no_earlier_input_is_refused() -> None:
    """A worker indexes the request's inputs with it: a row pointing forward never reaches one."""
    data = _pairwise(0).to_json()
    check_request(data)
    data["inputs"][1]["alias"] = 1
    with pytest.raises(ValueError, match=r"inputs\[1\]\.alias must name an earlier input"):
        check_request(data)
    data["inputs"][1]["alias"] = True
    with pytest.raises(ValueError, match="alias must be an integer or null"):
        check_request(data)

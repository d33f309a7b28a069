"""GEMMs on a frozen weight: recorded as graph constants, reproduced as constants, served.

Under ``freezing`` a weight is a constant of the graph, and Inductor's C++ bmm template packs
a constant into blocks as it compiles: its source, so its choice hash, differs from the same
bmm's on an input of the same layout. A worker that rebuilt the weight as an input reported
key_mismatch on the zoo's mixture-of-experts (CPU, inference). One in-process sweep of
tests/models/tiny_experts.py (capture, then its request tuned as a worker tunes it) is shared by
the end-to-end tests; the store test writes records directly.
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

EXPERTS_MODEL = str(Path(__file__).parent / "models" / "tiny_experts.py")

pytestmark = pytest.mark.xdist_group("tiny_experts")


@pytest.fixture(scope="module")
def frozen_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return in_process_sweep(EXPERTS_MODEL, tmp_path_factory.mktemp("experts"))


def test_capture_records_the_frozen_weight_as_a_constant(frozen_sweep: dict[str, Any]) -> None:
    (request,) = frozen_sweep["requests"]
    assert request.op == "bmm"
    assert [layout.constant for layout in request.inputs] == [False, True]


def test_the_worker_reproduces_the_constant_and_every_recorded_candidate(frozen_sweep: dict[str, Any]) -> None:
    (result,) = frozen_sweep["results"]
    assert result.status == "ok", result.error  # was key_mismatch: the packed template's source differs
    assert len(result.candidates) == 2 and all(c.ok for c in result.candidates)  # ATen and the C++ template
    assert result.validation is not None and result.validation["passed"]


def test_warm_start_serves_the_frozen_gemm_without_benchmarking(frozen_sweep: dict[str, Any]) -> None:
    stats, benchmarks, output, expected = serve_in_process(EXPERTS_MODEL, frozen_sweep["url"])
    assert benchmarks == 0
    assert (stats["hits"], stats["misses"], stats["errors"], stats["malformed_rows"]) == (1, 0, 0, 0), stats
    torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-4)


def _experts(constant: bool) -> TuningRequest:
    return TuningRequest(op="bmm", inputs_key="experts", precision="highest",
                         inputs=(InputLayout((4, 10, 24), (240, 24, 1), 0, "torch.float32", "cpu"),
                                 InputLayout((4, 24, 16), (384, 16, 1), 0, "torch.float32", "cpu", constant=constant)),
                         choice_hashes=("a", "b"))


def test_the_constant_round_trips_through_the_store_and_old_rows_keep_their_keys(store: Store) -> None:
    env = make_env(device_kind="cpu", device_name="cpu", cuda_version=None, triton_version=None)
    frozen, plain = _experts(True), _experts(False)
    assert frozen.key != plain.key  # a packed weight is another kernel source
    assert plain.key == digest("bmm", "experts", "highest")  # rows written before constants were recorded
    assert all("constant" not in layout for layout in plain.to_json()["inputs"])
    check_request(frozen.to_json())  # a stored constant is a boolean the validation accepts
    with pytest.raises(ValueError, match="constant must be"):
        check_request({**frozen.to_json(), "inputs": [frozen.to_json()["inputs"][0],
                                                       {**frozen.to_json()["inputs"][1], "constant": 1}]})
    store.put_results([make_result(env=env, request=frozen), make_result(env=env, request=plain)])
    read = store.lookup(env, frozen.key)
    assert read is not None and read.request.inputs[1].constant

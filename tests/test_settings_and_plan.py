"""Pure parts: settings from flags and AUTOTUNE_* variables, planning, shape summaries."""

from __future__ import annotations

import pytest

from autotune.plan import dedupe, make_plan, shape_summary
from autotune.settings import Settings, SettingsError
from cache.records import InputLayout, TuningRequest


def _request(op: str = "mm", m: int = 64, hashes: tuple[str, ...] = ("a", "b")) -> TuningRequest:
    layouts = (
        InputLayout((m, 128), (128, 1), 0, "torch.bfloat16", "cuda"),
        InputLayout((128, 256), (256, 1), 0, "torch.bfloat16", "cuda"),
    )
    key = repr([(l.device, l.dtype, *l.sizes, *l.strides, l.offset) for l in layouts])
    return TuningRequest(op, key, "highest", layouts, {}, hashes)


def test_settings_read_environment_and_flags_win() -> None:
    env = {"AUTOTUNE_CACHE": "sqlite:///x.db", "AUTOTUNE_WORKERS": "3", "AUTOTUNE_WRITE_BACK": "no"}
    settings = Settings.from_env(env)
    assert (settings.cache, settings.workers, settings.write_back) == ("sqlite:///x.db", 3, False)
    assert Settings.from_env(env, workers=5, cache="postgresql://h/db").workers == 5
    assert Settings.from_env(env, cache=None).cache == "sqlite:///x.db"  # None means "not given"


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [("AUTOTUNE_WORKERS", "many", "AUTOTUNE_WORKERS"), ("AUTOTUNE_READ_ONLY", "maybe", "boolean"),
     ("AUTOTUNE_ON_MISS", "panic", "on_miss"), ("AUTOTUNE_DEVICE", "tpu", "device")],
)
def test_settings_fail_loudly_on_bad_environment(name: str, value: str, needle: str) -> None:
    with pytest.raises(SettingsError, match=needle):
        Settings.from_env({name: value})


def test_dedupe_merges_identical_requests_and_their_candidates() -> None:
    merged = dedupe([_request(hashes=("a",)), _request(m=32), _request(hashes=("b", "c"))])
    assert len(merged) == 2
    assert merged[0].choice_hashes == ("a", "b", "c")


def test_plan_skips_cached_unless_forced() -> None:
    requests = [_request(m=32), _request(m=64)]
    plan = make_plan(requests, {requests[0].key})
    assert [r.key for r in plan.cached] == [requests[0].key]
    assert [r.key for r in plan.to_tune] == [requests[1].key]
    assert len(make_plan(requests, {requests[0].key}, force=True).to_tune) == 2


def test_shape_summary_reads_like_the_op() -> None:
    assert shape_summary(_request()) == "mm 64x128 @ 128x256 bf16"

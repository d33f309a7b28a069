"""Timings' noise in the cache (migration 0005): spread and rounds per candidate, the noise the
winner was chosen under, why ATen was stored and the search, on SQLite and PostgreSQL; a
hostile spread is refused wherever it comes from."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import sqlalchemy as sa
from factories import make_result

from autotune.cache import Store
from autotune.cache.jsonl import parse_result
from autotune.cache.records import FALLBACK_WITHIN_NOISE, SEARCH_DEFAULT, TuningResult
from autotune.listing import result_summary, status_label


def _noisy(result: TuningResult, busy: bool = False) -> TuningResult:
    """``result`` with ATen stored within the noise: each candidate timed in 3 rounds."""
    cands = tuple(dataclasses.replace(c, spread=0.1 * (i + 1), repeats=3) if c.ok else c
                  for i, c in enumerate(result.candidates))
    aten = next(c for c in cands if c.kind == "aten" and c.ok)
    validation = {**(result.validation or {}), "timing": {"rounds": 3, "others_per_core": 2.0, "busy": busy}}
    return dataclasses.replace(result, candidates=cands, winner_hash=aten.choice_hash, validation=validation,
                               fallback_reason=FALLBACK_WITHIN_NOISE)


def _sql(url: str, statement: str, **params: object) -> None:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"), poolclass=sa.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement), params)
    finally:
        engine.dispose()


def test_spread_rounds_fallback_and_search_round_trip(store: Store) -> None:
    plain, noisy = make_result(m=64), _noisy(make_result(m=128))
    exhaustive = dataclasses.replace(make_result(m=256), provenance=dataclasses.replace(
        make_result().provenance, search="exhaustive"))
    store.put_results([plain, noisy, exhaustive])
    env = plain.env
    assert store.lookup(env, plain.request.key) == plain  # rows without the new columns read as before
    got = store.lookup(env, noisy.request.key)
    assert got == noisy and got is not None
    assert got.fallback_reason == FALLBACK_WITHIN_NOISE and got.winner is not None and got.winner.kind == "aten"
    assert [c.repeats for c in got.candidates if c.ok] == [3] * len([c for c in got.candidates if c.ok])
    assert got.winner_spread is not None and got.winner_spread > 0
    assert got.provenance.search == SEARCH_DEFAULT
    assert store.lookup(env, exhaustive.request.key).provenance.search == "exhaustive"  # type: ignore[union-attr]


def test_a_results_json_line_round_trips_and_stays_as_it_was_without_noise() -> None:
    plain, noisy = make_result(m=64), _noisy(make_result(m=128))
    line = plain.to_json()
    assert "fallback_reason" not in line and "search" not in line["provenance"]
    assert all("spread" not in c for c in line["candidates"])  # older readers take it
    assert parse_result(json.loads(json.dumps(noisy.to_json()))) == noisy


@pytest.mark.parametrize("bad", [-0.5, "wide", True])
def test_an_import_line_with_a_hostile_spread_is_refused(bad: object) -> None:
    line = _noisy(make_result()).to_json()
    line["candidates"][0]["spread"] = bad
    with pytest.raises(ValueError, match="spread"):
        parse_result(line)
    line["candidates"][0]["spread"] = math.nan
    with pytest.raises(ValueError, match="spread"):
        parse_result(line)


@pytest.mark.parametrize("column, value", [("spread", -1.0), ("spread", "'NaN'"), ("repeats", 0)])
def test_a_stored_row_with_a_hostile_spread_is_set_aside(store: Store, store_url: str, column: str,
                                                         value: object) -> None:
    store.put_results([make_result(m=64), _noisy(make_result(m=128))])
    ids = {r.request.inputs[0].sizes[0]: i for i, r in store.list_results()}
    if store_url.startswith("sqlite") and value == "'NaN'":
        value = "'not a number'"  # SQLite has no NaN: text in a REAL column, as a hostile writer may leave
    _sql(store_url, f"UPDATE candidates SET {column} = {value} WHERE request_id = :id", id=ids[128])
    listing = store.list_results()
    assert [i for i, _ in listing] == [ids[64]]
    assert [(e.table, e.row_id) for e in listing.malformed] == [("requests", ids[128])]
    assert column in str(listing.malformed[0])


def test_a_non_finite_spread_is_stored_as_null(store: Store) -> None:
    result = make_result()
    cands = tuple(dataclasses.replace(c, spread=math.inf, repeats=3) for c in result.candidates)
    store.put_result(dataclasses.replace(result, candidates=cands))
    got = store.lookup(result.env, result.request.key)
    assert got is not None and all(c.spread is None for c in got.candidates)


def test_results_timed_on_a_busy_host_are_found_for_retiming(store: Store) -> None:
    quiet, busy, old = _noisy(make_result(m=64)), _noisy(make_result(m=128), busy=True), make_result(m=256)
    store.put_results([quiet, busy, old])
    assert store.busy_timed_request_keys(quiet.env) == {busy.request.key}
    assert store.cached_request_keys(quiet.env) == {quiet.request.key, busy.request.key, old.request.key}


def test_cache_ls_shows_the_noise_and_the_aten_fallback() -> None:
    noisy = _noisy(make_result())
    assert status_label(make_result()) == "ok"
    label = status_label(noisy)
    assert label.startswith("ok ±") and label.endswith(", aten: within noise")
    summary = result_summary(1, noisy)
    assert summary["fallback_reason"] == FALLBACK_WITHIN_NOISE and summary["winner_spread"] == noisy.winner_spread
    assert summary["search"] == SEARCH_DEFAULT


def test_a_job_is_served_the_stored_aten_not_the_candidate_that_timed_faster() -> None:
    """The hook hands Inductor the stored timings and Inductor takes the fastest: ATen stored
    for the noise must come out fastest, the others' times as they were otherwise."""
    noisy = _noisy(make_result(times=[1.0, None, 0.5, 0.9]))
    served = noisy.timings()
    assert min(served, key=served.__getitem__) == noisy.winner_hash
    assert math.isinf(served[noisy.candidates[1].choice_hash])
    plain = make_result(times=[1.0, None, 0.5, 0.9])
    assert plain.timings() == {c.choice_hash: c.time_ms if c.ok else math.inf for c in plain.candidates}

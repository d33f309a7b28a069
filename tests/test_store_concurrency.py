"""Many processes writing the same and different keys at once, on both backends.

Nothing is created before the workers start, so they also race to create the
database file or schema and the shared environment rows.
"""

from __future__ import annotations

import multiprocessing
import random
from collections import Counter

import sqlalchemy as sa
from factories import make_env, make_request, make_result

from autotune.cache import Store, TuningResult
from autotune.cache.models import candidates, requests

WORKERS = 8
SHARED = 12  # request keys every worker writes
PRIVATE = 6  # request keys only one worker writes
MISS_KEYS = 4
MISSES_PER_WORKER = 40

ENVS = (make_env(), make_env(device_name="NVIDIA A100-SXM4-80GB"))


def _shared_result(env_index: int, m: int, worker: int) -> TuningResult:
    """Every worker writes the same key; odd workers offer one candidate fewer.

    The host says which worker wrote it, so the final row tells us which
    candidate set must be there (a re-put replaces the whole set atomically).
    """
    result = make_result(
        env=ENVS[env_index], m=m, host=f"worker-{worker}", times=[1.0, 0.8 + worker / 100, 0.7, 0.9]
    )
    if worker % 2:
        result = TuningResult(**{**result.__dict__, "candidates": result.candidates[:3]})
    return result


def _write_results(url: str, worker: int, barrier: multiprocessing.synchronize.Barrier) -> None:
    store = Store(url)
    rng = random.Random(worker)
    shared = [_shared_result(e, 100 + i, worker) for e in (0, 1) for i in range(SHARED)]
    private = [make_result(env=ENVS[worker % 2], m=1000 + worker * 100 + i) for i in range(PRIVATE)]
    rng.shuffle(shared)
    barrier.wait()
    for result in shared[: len(shared) // 2]:
        store.put_result(result)
    store.put_results(private + shared[len(shared) // 2 :])  # one batch, overlapping others
    for result in shared[:3]:
        store.put_result(result)  # and some again
    store.close()


def _record_misses(url: str, worker: int, barrier: multiprocessing.synchronize.Barrier) -> None:
    store = Store(url)
    barrier.wait()
    for i in range(MISSES_PER_WORKER):
        env = ENVS[(i // MISS_KEYS) % 2]
        store.record_miss(env, make_request(m=i % MISS_KEYS), host=f"train-{worker}")
    store.close()


def _run(target, url: str) -> None:  # type: ignore[no-untyped-def]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    procs = [ctx.Process(target=target, args=(url, w, barrier)) for w in range(WORKERS)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * WORKERS, "a writer process failed (see its stderr)"


def test_concurrent_overlapping_writes(store_url: str) -> None:
    _run(_write_results, store_url)
    with Store(store_url) as store:
        stored = store.list_results()
        stats = store.stats()
        engine = sa.create_engine(store_url)
        with engine.connect() as conn:
            per_request = dict(
                conn.execute(
                    sa.select(candidates.c.request_id, sa.func.count()).group_by(candidates.c.request_id)
                ).all()
            )
            keys = conn.execute(sa.select(requests.c.env_id, requests.c.key)).all()
        engine.dispose()

    assert stats["environments"] == 2
    assert stats["requests"] == 2 * SHARED + WORKERS * PRIVATE == len(stored)
    assert len(set(keys)) == len(keys)  # no duplicate (env, key)
    assert stats["candidates"] == sum(per_request.values())
    for row_id, result in stored:
        worker = int(result.provenance.host.split("-")[1])
        shared = result.request.key in _shared_keys()
        # The whole candidate set of whichever worker wrote last: never a mix.
        expected = 3 if shared and worker % 2 else 4
        assert per_request[row_id] == expected == len(result.candidates)
        assert result.winner is not None
        if shared:
            assert result == _shared_result(_env_index(result), _m(result), worker)


def _shared_keys() -> set[str]:
    return {make_request(m=100 + i).key for i in range(SHARED)}


def _env_index(result: TuningResult) -> int:
    return ENVS.index(result.env)


def _m(result: TuningResult) -> int:
    return result.request.inputs[0].sizes[0]


def test_concurrent_misses_add_up(store_url: str) -> None:
    _run(_record_misses, store_url)
    with Store(store_url) as store:
        misses = store.misses()
    assert len(misses) == 2 * MISS_KEYS
    counts = Counter((m.env.key, m.request.key) for m in misses)
    assert set(counts.values()) == {1}  # one row per (env, key)
    assert sum(m.count for m in misses) == WORKERS * MISSES_PER_WORKER
    assert {m.count for m in misses} == {WORKERS * MISSES_PER_WORKER // (2 * MISS_KEYS)}


"""The writer process of tests/test_artifacts_store.py's race for one artifact key.

Spawned, a writer imports the module its target lives in: this one is small (the store and
the records), where the test module would bring pytest, the CLI and its module-level data into
each of the race's writers, which then took seconds to start on a 2-core host."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from autotune.cache import Artifact, Store
from autotune.cache.records import ARTIFACT_FX_GRAPH

KEY = "contended"


def payload(worker: int) -> bytes:
    """What writer ``worker`` stores under the contended key."""
    return f"worker {worker}".encode() * 1000


def put_same_key(url: str, worker: int, barrier: Any, results: Any) -> None:
    """Open the store, wait for every writer, then put this writer's artifact under ``KEY``;
    whether it was stored goes to ``results``."""
    store = Store(url)
    artifact = Artifact(kind=ARTIFACT_FX_GRAPH, key=KEY, payload=payload(worker), signature=None, public_key=None,
                        torch_version="2.13.0+cu128", device="NVIDIA H100 80GB HBM3", host="sweeper-0",
                        created_at=datetime.now(timezone.utc))
    barrier.wait()
    results.put((worker, store.put_artifact(artifact)))
    store.close()

"""Planning: which captured requests still need tuning. Pure: no database, GPU or Ray."""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.cache.records import TuningRequest


@dataclass
class Plan:
    to_tune: list[TuningRequest] = field(default_factory=list)
    cached: list[TuningRequest] = field(default_factory=list)

    @property
    def found(self) -> int:
        return len(self.to_tune) + len(self.cached)


def dedupe(requests: list[TuningRequest]) -> list[TuningRequest]:
    """Merge identical requests (same op, inputs_key, precision), keeping first-seen order."""
    merged: dict[str, TuningRequest] = {}
    for request in requests:
        seen = merged.get(request.key)
        if seen is None:
            merged[request.key] = request
        elif set(request.choice_hashes) - set(seen.choice_hashes):
            hashes = tuple(sorted(set(seen.choice_hashes) | set(request.choice_hashes)))
            merged[request.key] = TuningRequest(seen.op, seen.inputs_key, seen.precision,
                                                seen.inputs, seen.params, hashes)
    return list(merged.values())


def make_plan(requests: list[TuningRequest], cached_keys: set[str], force: bool = False) -> Plan:
    """Split requests into those to tune and those the cache already answers."""
    plan = Plan()
    for request in dedupe(requests):
        if not force and request.key in cached_keys:
            plan.cached.append(request)
        else:
            plan.to_tune.append(request)
    return plan


TUNE = "tune"
CACHED = "cached"


@dataclass
class PlanStream:
    """The plan made one request at a time, as capture finds them, across models.

    Requests are the same when their environment (device, versions, Inductor config)
    and their key (op, inputs, precision) are: the union of several models' requests
    is tuned once.
    """

    force: bool = False
    seen: dict[tuple[str, str], TuningRequest] = field(default_factory=dict)

    def add(self, request: TuningRequest, env_key: str, cached_keys: set[str]) -> str | None:
        """TUNE, CACHED, or None for a request seen before."""
        key = (env_key, request.key)
        if key in self.seen:
            return None
        self.seen[key] = request
        return CACHED if request.key in cached_keys and not self.force else TUNE

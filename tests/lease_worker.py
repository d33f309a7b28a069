"""A process that works through a list of keys under leases, as a sweep does.

Usage: python lease_worker.py URL NAME LOG N_KEYS SECONDS SINCE [--hold]
Each key it claims is "tuned" (a short sleep), appended to LOG as "NAME KEY",
and released. SINCE (a UNIX time) is when the sweeps began: a sweep plans
against the cache after it starts, so a release before then would show up as a
cached result, and one after it reads as "done elsewhere". With --hold it claims every key it can, prints "held", and waits
to be killed (a crashed sweep).
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone

from autotune.cache import Store
from autotune.cache.leases import CLAIMED, DONE, Heartbeat


def main(url: str, name: str, log: str, n_keys: int, seconds: float, since: float, hold: bool) -> None:
    store = Store(url)
    leases = store.leases(f"{name}:{time.time()}", seconds=seconds)
    leases.since = datetime.fromtimestamp(since, timezone.utc)
    keys = [("e" * 64, f"{i:064d}") for i in range(n_keys)]
    heartbeat = Heartbeat(leases)
    if hold:
        got = [k for k in keys if leases.claim(k) == CLAIMED]
        print("held", len(got), flush=True)
        time.sleep(3600)
    waiting = list(keys)
    while waiting:
        key = waiting.pop(0)
        state = leases.claim(key)
        if state == CLAIMED:
            time.sleep(0.02)
            with open(log, "a") as out:
                out.write(f"{name} {key[1]}\n")
            leases.release(key, "ok")
        elif state != DONE:
            waiting.append(key)
            time.sleep(0.01)
    heartbeat.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]),
         "--hold" in sys.argv)

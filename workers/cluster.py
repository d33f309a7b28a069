"""Joining a Ray cluster: check the address in seconds, and say what is wrong in one line.

``ray.init(address=...)`` on a wrong address (one where nothing listens) retries
for minutes and prints dozens of log lines; on a cluster with token
authentication (``RAY_AUTH_MODE=token``) and no token here it keeps retrying
before a bare ``ConnectionError``. So before joining, the sweep opens a TCP
connection to the address, then asks the GCS for one key from a short-lived
subprocess (Ray's C++ client logs to the process's stderr, and its token cache
is process-wide), and turns each failure into one line naming the fix.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from .errors import WorkerError

TCP_TIMEOUT_S = 3.0
PROBE_TIMEOUT_S = 15.0

_START_HINT = ("start one with `ray start --head --port 6379` and pass the address it prints (HOST:6379), "
               "or drop --address to start Ray on this machine")
_TOKEN_HINT = ("the cluster uses token authentication: set RAY_AUTH_MODE=token and give this host the "
               "cluster's token (~/.ray/auth_token, RAY_AUTH_TOKEN_PATH=FILE or RAY_AUTH_TOKEN)")

# Run in a fresh interpreter: prints one JSON line.
_PROBE = """
import json, sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1]).internal_kv_get(b"session_name", namespace=None, timeout=5)
    print(json.dumps({"ok": True}))
except Exception as exc:
    print(json.dumps({"ok": False, "type": type(exc).__name__, "message": str(exc)}))
"""


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a GCS or Ray Client address; None for "auto" and the like."""
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def check_address(address: str | None) -> None:
    """Raise WorkerError, in one line with the fix, unless a Ray cluster we may join answers there."""
    if not address or address in ("local", "auto"):
        return  # Ray finds (or starts) the cluster itself, and fails fast when "auto" finds none
    parts = split_address(address)
    if parts is None:
        raise WorkerError(f"--address {address!r} is not HOST:PORT (or ray://HOST:PORT); {_START_HINT}")
    _check_tcp(address, *parts)
    if not address.startswith("ray://"):  # Ray Client speaks its own protocol; ray.init checks it
        _check_gcs(address)


def _check_tcp(address: str, host: str, port: int) -> None:
    try:
        with socket.create_connection((host, port), timeout=TCP_TIMEOUT_S):
            return
    except TimeoutError:
        why = f"no answer within {TCP_TIMEOUT_S:.0f} s"
    except OSError as exc:
        why = exc.strerror or str(exc)
    raise WorkerError(f"no Ray cluster at {address} ({why.lower()}); {_START_HINT}")


def _check_gcs(address: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, address], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise WorkerError(f"{address} accepts connections but does not answer as a Ray cluster within "
                          f"{PROBE_TIMEOUT_S:.0f} s (is it the GCS port that `ray start --head` printed?)") from None
    lines = done.stdout.strip().splitlines()
    answer = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    if answer is None:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise WorkerError(f"could not probe the Ray cluster at {address}: {tail}")
    if answer["ok"]:
        return
    message = answer["message"]
    if answer["type"] == "AuthenticationError" or "InvalidAuthToken" in message:
        raise WorkerError(f"the Ray cluster at {address} refused this host's token; {_TOKEN_HINT}")
    first = message.split(". ")[0].strip().rstrip(".")
    raise WorkerError(f"{address} does not answer as a Ray cluster ({first}); {_START_HINT}")

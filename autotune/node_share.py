"""One reader of the cache per node: the ranks of a ``torchrun`` job share its answers.

Every rank of a distributed job compiles the same graphs and asks the cache the same
questions. Asked by each rank, an 8-rank job would make 8 times the database requests of
one process, on every node, at the same moment. Instead local rank 0 serves the others
over a Unix socket in a private node-local folder: it reads the database (through the
job's own store, its own timeouts) and remembers each answer, and every other rank of
the node asks it. Identical reads, however many ranks make them and in whatever order,
reach the database once. Writes (a job's misses, its write-back) go through local rank 0
too, so a node holds one database connection.

Payloads are verified where they are used: the artifact tier checks each signature in
the rank that loads it, so what travels between ranks on a node is trusted no more than
what the database holds.

A rank that cannot reach local rank 0 within the lookup timeout (it died, or the socket
cannot be made) reads the database itself: the sharing saves requests, it never fails a job.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Store methods whose answer depends only on their arguments while a job runs: answered
# once per node. The rest (writes, leases) are passed on each time.
READS = frozenset({"lookup", "results_for_env", "cached_request_keys", "kernel_configs", "get_artifact", "misses",
                   "list_results", "artifacts"})
_HEADER = struct.Struct("!I")


@dataclass(frozen=True)
class NodeRole:
    """Where this process sits on its node, as torchrun's environment says."""

    local_rank: int
    local_world_size: int
    job: str  # the same in every rank of one job on this node, different between jobs

    @property
    def serves(self) -> bool:
        return self.local_rank == 0

    @property
    def socket_path(self) -> Path:
        digest = hashlib.sha256(self.job.encode()).hexdigest()[:16]
        return _private_folder() / f"{digest}.sock"


def node_role(environ: dict[str, str] | None = None) -> NodeRole | None:
    """This rank's place on the node, or None outside a job of several local ranks.

    Read from the variables torchrun (torchelastic) sets in each rank; they are
    torch's, not autotune's settings."""
    env = os.environ if environ is None else environ
    try:
        local_rank, local_world = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    if local_world < 2:
        return None
    # The rendezvous address and the restart count tell two jobs (or two attempts of one)
    # on one node apart; the run id alone is "none" unless the job names one.
    parts = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT")
    job = "|".join(env.get(name, "") for name in parts)
    return NodeRole(local_rank, local_world, job)


def _private_folder() -> Path:
    """A folder of this user's only: nobody else may connect to a rank's socket."""
    folder = Path(tempfile.gettempdir()) / f"autotune-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_uid != os.getuid() or folder.stat().st_mode & 0o077:
        raise PermissionError(f"{folder} is not this user's private folder")
    return folder


# ------------------------------------------------------------------ framing


def _send(sock: socket.socket, value: Any) -> None:
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def _receive(sock: socket.socket) -> Any:
    (size,) = _HEADER.unpack(_read_exactly(sock, _HEADER.size))
    return pickle.loads(_read_exactly(sock, size))


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the other rank closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# ------------------------------------------------------------------ local rank 0


class SharedReads:
    """A store whose reads are made once each: concurrent identical reads wait for the first."""

    def __init__(self, open_store: Callable[[], Any]) -> None:
        self._open_store = open_store
        self._answers: dict[bytes, Future[Any]] = {}
        self._lock = threading.Lock()

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if method not in READS:
            return getattr(self._open_store(), method)(*args, **kwargs)
        key = pickle.dumps((method, args, sorted(kwargs.items())), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            answer, first = self._answers.get(key), False
            if answer is None:
                answer = self._answers[key] = Future()
                first = True
        if first:
            try:
                answer.set_result(getattr(self._open_store(), method)(*args, **kwargs))
            except BaseException as exc:  # the caller sees it; the next asker tries again
                with self._lock:
                    self._answers.pop(key, None)
                answer.set_exception(exc)
        return answer.result()

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self.call(method, args, kwargs)


class NodeServer:
    """Local rank 0's side: answers the node's other ranks from ``SharedReads``."""

    def __init__(self, path: Path, reads: SharedReads) -> None:
        self.path, self.reads = path, reads
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path.unlink(missing_ok=True)  # a socket a dead attempt left
        self._listener.bind(str(path))
        os.chmod(path, 0o600)
        self._listener.listen(64)
        self._thread = threading.Thread(target=self._accept, name="autotune-node-share", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                peer, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(peer,), name="autotune-node-peer", daemon=True).start()

    def _serve(self, peer: socket.socket) -> None:
        with peer:
            while True:
                try:
                    method, args, kwargs = _receive(peer)
                except (ConnectionError, OSError, EOFError):
                    return
                try:
                    reply: tuple[str, Any] = ("ok", self.reads.call(method, args, kwargs))
                except Exception as exc:  # noqa: BLE001 - the asking rank raises it, as its own store would
                    reply = ("error", exc)
                try:
                    _send(peer, reply)
                except (pickle.PicklingError, TypeError, AttributeError):
                    _send(peer, ("error", RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}")))
                except OSError:
                    return

    def close(self) -> None:
        self._listener.close()
        self.path.unlink(missing_ok=True)


# ------------------------------------------------------------------ the other ranks


class NodeClient:
    """Another rank's store: each call is asked of local rank 0, one at a time."""

    def __init__(self, path: Path, timeout: float) -> None:
        self._sock = _connect(path, timeout)
        self._lock = threading.Lock()

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self._lock:
            _send(self._sock, (method, args, kwargs))
            status, value = _receive(self._sock)
        if status == "error":
            raise value
        return value

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self.call(method, args, kwargs)

    def close(self) -> None:
        self._sock.close()


def _connect(path: Path, timeout: float) -> socket.socket:
    """Connected to local rank 0's socket, waiting up to ``timeout`` for it to appear."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            return sock
        except OSError:
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)

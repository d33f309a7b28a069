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
cannot be made), or whose connection local rank 0 closed, reads the database itself: the
sharing saves requests, it never fails a job. Local rank 0's server ends once every other local
rank has connected and closed its connection (its uninstall or its exit): they are served.
"""

from __future__ import annotations

import hashlib
import logging
import os
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

from . import node_wire as wire

log = logging.getLogger(__name__)

# Reads whose answer holds a payload: dropped once every local rank has had it, so that local
# rank 0 does not keep every artifact the node asked for (junk ones included) for the whole job.
_PAYLOAD_READS = frozenset({"get_artifact"})
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


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


# ------------------------------------------------------------------ who is at the other end


def check_peer(sock: socket.socket) -> None:
    """PermissionError unless the process at the other end of ``sock`` is this process or one
    of its siblings (same user, same parent: the torchrun agent that started the local ranks)."""
    pid, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    if uid != os.getuid():
        raise PermissionError(f"the process at the other end (pid {pid}) is another user's")
    if pid == os.getpid():
        return
    parent = _parent_of(pid)
    if parent != os.getppid():
        raise PermissionError(f"the process at the other end (pid {pid}, parent {parent}) is not a rank "
                              f"of this job (their parent is {os.getppid()})")


def _parent_of(pid: int) -> int | None:
    """The parent's pid, from /proc (None where the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[1])  # the name, in parentheses, may hold anything
    except (OSError, ValueError, IndexError):
        return None


def _require_peer_checks() -> None:
    if not hasattr(socket, "SO_PEERCRED") or not Path("/proc/self/stat").exists():
        raise OSError("this system cannot tell which process is at the other end of a socket")


# ------------------------------------------------------------------ local rank 0


class SharedReads:
    """A store whose reads are made once each: concurrent identical reads wait for the first.
    A read whose answer holds a payload is kept until ``askers`` calls have had it."""

    def __init__(self, open_store: Callable[[], Any], askers: int = 0) -> None:
        self._open_store = open_store
        self._askers = askers
        self._answers: dict[str, tuple[Future[Any], list[int]]] = {}  # read -> answer, calls that had it
        self._lock = threading.Lock()

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        key = wire.read_key(method, args, kwargs)
        if key is None:  # a write, or a call of local rank 0's own the node share does not serve
            return getattr(self._open_store(), method)(*args, **kwargs)
        with self._lock:
            entry, first = self._answers.get(key), False
            if entry is None:
                entry = self._answers[key] = (Future(), [0])
                first = True
            answer, had = entry
            had[0] += 1
            if method in _PAYLOAD_READS and self._askers and had[0] >= self._askers:
                self._answers.pop(key, None)  # every local rank has it: not kept for a later one
        if first:
            try:
                answer.set_result(getattr(self._open_store(), method)(*args, **kwargs))
            except BaseException as exc:  # the caller sees it; the next asker tries again
                with self._lock:
                    if self._answers.get(key, (None,))[0] is answer:
                        self._answers.pop(key)
                answer.set_exception(exc)
        return answer.result()

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self.call(method, args, kwargs)


class NodeServer:
    """Local rank 0's side: answers the node's other ranks from ``SharedReads``.

    It serves until its ``peers`` (the node's other ranks, ``local_world_size - 1``) have each
    connected and every connection has closed (a rank's uninstall, or its exit): then they are
    served, and its threads end (issue 79: no thread of ours outlives what it is for). A rank that
    installs the hook again later finds no socket and reads the database itself. ``peers=0``
    serves until ``close()``."""

    def __init__(self, path: Path, reads: SharedReads, peers: int = 0) -> None:
        _require_peer_checks()
        self.path, self.reads = path, reads
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path.unlink(missing_ok=True)  # a socket a dead attempt left, or one another process bound first
        self._listener.bind(str(path))
        os.chmod(path, 0o600)
        self._listener.listen(64)
        self._refused = False
        self._peers = peers
        self._lock = threading.Lock()
        self._connected = 0  # connections from ranks of this job, ever
        self._open: set[socket.socket] = set()  # those not closed yet
        self._closing = False
        self._done = threading.Event()  # closed: not listening, no connection left open
        self._thread = threading.Thread(target=self._accept, name="autotune-node-share", daemon=True)
        self._thread.start()

    @property
    def served(self) -> bool:
        """Every peer connected and has closed its connection (or ``close()`` was called)."""
        return self._done.is_set()

    def wait_served(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for ``served``; its threads end with it."""
        if not self._done.wait(timeout):
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _accept(self) -> None:
        while True:
            try:
                peer, _ = self._listener.accept()
            except OSError:  # closed
                return
            try:
                check_peer(peer)
            except OSError as exc:  # PermissionError among them
                peer.close()
                self._refuse(exc)
                continue
            with self._lock:
                if self._closing:
                    peer.close()
                    return
                self._connected += 1
                self._open.add(peer)
            threading.Thread(target=self._serve, args=(peer,), name="autotune-node-peer", daemon=True).start()

    def _serve(self, peer: socket.socket) -> None:
        try:
            self._answer_all(peer)
        finally:
            with self._lock:
                self._open.discard(peer)
                ended = bool(self._peers) and self._connected >= self._peers and not self._open
            peer.close()
            if ended:
                log.debug("autotune: the node's %d other rank(s) are served; the node share ends", self._peers)
                self.close()

    def _answer_all(self, peer: socket.socket) -> None:
        while True:
            try:
                message, blobs = wire.receive(peer)
            except (ConnectionError, OSError, struct.error):
                return
            except wire.WireError as exc:  # not a call: answered as an error, never acted on
                reply, blobs = wire.encode_error(exc), []
            else:
                reply, blobs = self._answer(message, blobs)
            try:
                wire.send(peer, reply, blobs)
            except OSError:
                return

    def _answer(self, message: Any, blobs: wire.Blobs) -> tuple[dict[str, Any], wire.Blobs]:
        try:
            method, kwargs = wire.decode_call(message, blobs)
            return wire.encode_reply(method, self.reads.call(method, (), kwargs))
        except Exception as exc:  # noqa: BLE001 - the asking rank raises it, as its own store would
            return wire.encode_error(exc), []

    def _refuse(self, exc: BaseException) -> None:
        """A connection from a process that is not a rank of this job: closed unanswered, one warning."""
        warn, self._refused = not self._refused, True
        (log.warning if warn else log.debug)("autotune: refused a connection to the node's cache share: %s", exc)

    def close(self) -> None:
        """Stop listening and end every connection: a rank asking later reads the database itself."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            peers = list(self._open)
        # shutdown() wakes the threads blocked in accept() and in a peer's receive; close() alone may not.
        for sock in (self._listener, *peers):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._listener.close()
        self.path.unlink(missing_ok=True)
        self._done.set()


# ------------------------------------------------------------------ the other ranks


class NodeClient:
    """Another rank's store: each call is asked of local rank 0, one at a time. Only the calls
    the node share serves exist (``node_wire.METHODS``); what comes back is checked as a
    database row is. Once local rank 0 has closed the connection (its uninstall or its exit),
    each call goes to ``fallback()`` (the rank's own database), after one log line."""

    def __init__(self, path: Path, timeout: float, fallback: Callable[[], Any] | None = None) -> None:
        _require_peer_checks()
        self._sock = _connect(path, timeout)
        self._lock = threading.Lock()
        self._fallback = fallback
        self._closed = False  # by local rank 0: calls go to the fallback
        self._shut = False  # by this rank (its uninstall): a call still queued fails, as a closed store's

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        message, blobs = wire.encode_call(method, args, kwargs)
        context = {"row": message["args"].get("request_key") or message["args"].get("key", "?"),
                   "max_bytes": message["args"].get("max_bytes", 0)}
        with self._lock:
            if not self._closed:
                try:
                    wire.send(self._sock, message, blobs)
                    reply, blobs = wire.receive(self._sock)
                except OSError as exc:  # ConnectionError among them: local rank 0 ended the share
                    if self._fallback is None or self._shut:
                        raise
                    self._closed = True
                    self._sock.close()
                    log.info("autotune: local rank 0 closed the node's cache share (%s); this rank reads "
                             "the cache itself", type(exc).__name__)
                else:
                    return wire.decode_reply(method, reply, blobs, **context)
        assert self._fallback is not None
        return getattr(self._fallback(), method)(*args, **kwargs)

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method not in wire.METHODS:
            raise AttributeError(f"the node share serves no {method!r}")
        return lambda *args, **kwargs: self.call(method, args, kwargs)

    def close(self) -> None:
        self._shut = True
        self._sock.close()


def _connect(path: Path, timeout: float) -> socket.socket:
    """Connected to local rank 0's socket, waiting up to ``timeout`` for it to appear;
    PermissionError at once where a process that is not local rank 0 listens there."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
        except OSError:
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
            continue
        try:
            check_peer(sock)
        except PermissionError as exc:
            sock.close()
            raise PermissionError(f"{path} is not local rank 0's: {exc}") from None
        return sock

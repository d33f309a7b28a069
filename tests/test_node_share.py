"""The ranks of a node exchange data, not code (autotune/job/node_share.py, autotune/job/node_wire.py).

What a rank receives from local rank 0 is checked as a database row is; local rank 0 serves
only the store calls a job makes; each side serves or asks only a process of this job (the same
parent: the torchrun agent). Everything here is real: SQLite stores, Unix sockets, and other
processes where the test needs a process that is not a rank of the job.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from factories import make_env, make_result

from autotune.cache.errors import MalformedRow
from autotune.cache.records import Artifact
from autotune.cache.store import Store
from autotune.job import node_wire
from autotune.job.node_share import NodeClient, NodeServer, SharedReads, node_role

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the node share checks its peer with SO_PEERCRED and /proc: Linux only")


def _role(tmp_path: Path, rank: int) -> Any:
    role = node_role({"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "1",
                      "TORCHELASTIC_RUN_ID": str(tmp_path)})
    assert role is not None
    return role


def _as_local_rank(rank: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "1",
                        "TORCHELASTIC_RUN_ID": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)


def _nan_result() -> dict[str, Any]:
    """A stored result as JSON with every time NaN: a row the database path refuses."""
    data = make_result(env=make_env(device_kind="cpu", device_name="a cpu")).to_json()
    for cand in data["candidates"]:
        cand["time_ms"] = float("nan")
    return data


def _frame(message: Any) -> bytes:
    """One message as node_wire.send frames it, NaN written as JSON's NaN literal (Python's json does)."""
    text = json.dumps(message).encode()
    return struct.pack("!II", len(text), 0) + text


# A process that is not a rank of the job: it binds the socket's path before local rank 0 does
# and answers every call with rows whose times are NaN, in the node share's own framing.
_IMPOSTOR = textwrap.dedent("""
    import json, socket, struct, sys, threading
    path, answer = sys.argv[1], sys.argv[2].encode()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    print("listening", flush=True)
    def serve(peer):
        try:
            while True:
                size, count = struct.unpack("!II", peer.recv(8, socket.MSG_WAITALL))
                peer.recv(size, socket.MSG_WAITALL)
                peer.sendall(struct.pack("!II", len(answer), 0) + answer)
        except Exception:
            pass
    while True:
        peer, _ = server.accept()
        threading.Thread(target=serve, args=(peer,), daemon=True).start()
""")


def test_a_fake_local_rank_0_that_binds_first_is_refused_and_the_rank_reads_the_database(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from autotune.job.serve_policy import ServePolicy
    from autotune.settings import Settings

    url = f"sqlite:///{tmp_path / 'cache.db'}"
    stored = make_result(env=make_env(device_kind="cpu", device_name="a cpu"))
    with Store(url) as store:
        store.put_result(stored)
    path = _role(tmp_path, 1).socket_path
    fake = subprocess.Popen([sys.executable, "-c", _IMPOSTOR, str(path), json.dumps({"ok": _nan_result()})],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == "listening"
        _as_local_rank(1, monkeypatch, tmp_path)
        caplog.set_level(logging.WARNING, logger="autotune")
        policy = ServePolicy(Settings(cache=url, lookup_timeout=4.0))
        try:
            found = policy.store.call(lambda store: store.lookup(stored.env, stored.request.key))
            assert found == stored  # the database's row, timed as stored
            assert policy.stats.database_calls == 1 and policy.stats.errors == 0
        finally:
            policy.close()
    finally:
        fake.kill()
        fake.wait()
        path.unlink(missing_ok=True)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "is not a rank of this job" in warned[0], warned


def test_rows_with_nan_times_from_local_rank_0_are_malformed_as_in_the_database(tmp_path: Path) -> None:
    """Even from a process the checks let through (here: this one), a NaN time is refused."""
    path = _role(tmp_path, 0).socket_path
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    client = NodeClient(path, timeout=5)
    peer, _ = listener.accept()
    try:
        env = make_env(device_kind="cpu", device_name="a cpu")
        for call, answer in ((lambda: client.lookup(env, "a request"), {"ok": _nan_result()}),
                             (lambda: client.results_for_env(env),
                              {"ok": {"rows": [_nan_result()], "malformed": []}})):
            peer.sendall(_frame(answer))
            if isinstance(answer["ok"], dict) and "rows" in answer["ok"]:
                listing = call()
                assert list(listing) == [] and len(listing.malformed) == 1
                assert "time_ms" in listing.malformed[0].problem
            else:
                with pytest.raises(MalformedRow, match="time_ms"):
                    call()
            node_wire.receive(peer)  # the call it made
    finally:
        client.close()
        peer.close()
        listener.close()
        path.unlink()


class _Marker:
    """Unpickled, it would create ``path``: a pickle that runs code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (Path.touch, (self.path,))


def _server(tmp_path: Path, url: str) -> tuple[NodeServer, Store]:
    store = Store(url)
    return NodeServer(_role(tmp_path, 0).socket_path, SharedReads(lambda: store, 2)), store


def _ask(path: Path, frame: bytes) -> Any:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(frame)
        return node_wire.receive(sock)[0]


def test_a_pickle_sent_to_local_rank_0_executes_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = pickle.dumps(("lookup", (_Marker(marker),), {}))
    server, store = _server(tmp_path, f"sqlite:///{tmp_path / 'cache.db'}")
    try:
        reply = _ask(server.path, struct.pack("!I", len(payload)) + payload)  # the old framing
        assert "error" in reply
        time.sleep(0.2)
        assert not marker.exists()
        env = make_env(device_kind="cpu", device_name="a cpu")
        client = NodeClient(server.path, timeout=5)  # and it still serves the job
        try:
            assert client.lookup(env, "absent") is None
        finally:
            client.close()
    finally:
        server.close()
        store.close()
    assert not marker.exists()


def test_prune_through_the_socket_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    with Store(url) as store:
        store.put_result(make_result())
    server, store = _server(tmp_path, url)
    try:
        for name in ("prune", "prune_artifacts", "leases", "_write", "__class__"):
            reply = _ask(server.path, _frame({"call": name, "args": {}}))
            assert "not a call the node share serves" in reply["error"]["message"], reply
        client = NodeClient(server.path, timeout=5)
        try:
            with pytest.raises(AttributeError):
                client.prune  # noqa: B018 - not even offered to the job
        finally:
            client.close()
        assert len(store.list_results()) == 1
    finally:
        server.close()
        store.close()


_STRANGER = textwrap.dedent("""
    import json, socket, struct, sys
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(sys.argv[1])
    text = json.dumps({"call": "list_results", "args": {"op": None, "device": None, "limit": None,
                                                       "status": None}}).encode()
    try:  # local rank 0 may have closed it already, before the call was sent
        sock.sendall(struct.pack("!II", len(text), 0) + text)
        print("answered" if sock.recv(8) else "closed")
    except (BrokenPipeError, ConnectionResetError):
        print("closed")
""")


def test_local_rank_0_answers_no_process_but_the_jobs_ranks(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A process of the same user that is not a sibling (here: this test's child) gets nothing."""
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    with Store(url) as store:
        store.put_result(make_result())
    caplog.set_level(logging.WARNING, logger="autotune")
    server, store = _server(tmp_path, url)
    try:
        proc = subprocess.run([sys.executable, "-c", _STRANGER, str(server.path)], capture_output=True, text=True,
                              timeout=60)
    finally:
        server.close()
        store.close()
    assert proc.stdout.strip() == "closed", proc.stderr[-2000:]
    assert any("refused a connection" in r.getMessage() for r in caplog.records)


def test_what_crosses_is_what_the_database_holds_and_writes_pass_through(tmp_path: Path) -> None:
    """Every call the node share serves, through the socket: the same records as the store's own."""
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    env = make_env(device_kind="cpu", device_name="a cpu")
    result = make_result(env=env, times=[1.0, None, 0.5, 0.7])
    artifact = Artifact("fx_graph", "a graph", b"\x00payload\xff" * 1000, b"s" * 64, b"k" * 32, "2.x", "cpu", "here")
    server, store = _server(tmp_path, url)
    client = NodeClient(server.path, timeout=5)
    try:
        client.put_result(result)
        client.record_miss(env, make_result(env=env, m=64).request, host="rank-1")
        assert client.put_kernel_configs(env, {"a/b.py": {"XBLOCK": 64}}) == 1
        assert client.put_artifact(artifact) is True
        assert client.lookup(env, result.request.key) == store.lookup(env, result.request.key) == result
        assert list(client.results_for_env(env)) == list(store.results_for_env(env))
        assert list(client.list_results(device="cpu")) == list(store.list_results(device="cpu"))
        assert dict(client.kernel_configs(env)) == dict(store.kernel_configs(env)) == {"a/b.py": {"XBLOCK": 64}}
        fetched = client.get_artifact("fx_graph", "a graph")
        assert fetched is not None and fetched.payload == artifact.payload
        assert (fetched.signature, fetched.public_key) == (artifact.signature, artifact.public_key)
        with pytest.raises(MalformedRow, match="over the cap"):  # the store's own refusal, as its row error
            client.get_artifact("fx_graph", "a graph", 10)
        assert list(client.artifacts(limit=None)) == list(store.artifacts(limit=None))
        assert [m.host for m in store.misses()] == ["rank-1"]
    finally:
        client.close()
        server.close()
        store.close()


def test_local_rank_0_keeps_a_payload_until_every_rank_had_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    with Store(url) as store:
        store.put_artifact(Artifact("fx_graph", "a graph", b"x" * 1000, None, None, "2.x", "cpu", "here"))
    reads = SharedReads(lambda: Store(url), askers=2)
    odd = make_env(device_kind="cpu", config={"a choice": object()})  # Inductor's config holds more than JSON
    assert reads.lookup(odd, "absent") is None and reads.lookup(odd, "absent") is None
    assert len(reads._answers) == 1  # one read, asked twice
    assert reads.get_artifact("fx_graph", "a graph") is not None
    assert len(reads._answers) == 2  # asked by one of the node's two ranks: kept for the other
    assert reads.get_artifact("fx_graph", "a graph") is not None
    assert len(reads._answers) == 1


def test_local_rank_0s_server_ends_once_the_nodes_other_ranks_are_served(tmp_path: Path) -> None:
    """Issue 79: no thread of ours outlives what it is for. Local rank 0 serves until each of the
    node's other ranks (here two: this process's clients) has connected and closed its connection;
    then its threads end and its socket is gone."""
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    env = make_env(device_kind="cpu", device_name="a cpu")
    result = make_result(env=env)
    with Store(url) as seeded:
        seeded.put_result(result)
    store = Store(url)
    server = NodeServer(_role(tmp_path, 0).socket_path, SharedReads(lambda: store, 3), peers=2)
    try:
        first, second = NodeClient(server.path, timeout=5), NodeClient(server.path, timeout=5)
        assert first.lookup(env, result.request.key) == second.lookup(env, result.request.key) == result
        first.close()
        assert not server.wait_served(0.5)  # one rank still asks: a later compile of its may
        assert server._thread.is_alive() and server.path.exists()
        assert second.lookup(env, result.request.key) == result
        second.close()
        assert server.wait_served(10)
        assert not server._thread.is_alive() and not server.path.exists()
        peers = [t for t in threading.enumerate() if t.name == "autotune-node-peer" and t.is_alive()]
        for thread in peers:  # each ends as its connection closes: at most still returning
            thread.join(5)
        assert not [t for t in peers if t.is_alive()]
        assert store.lookup(env, result.request.key) == result  # local rank 0's own reads go on
    finally:
        server.close()
        store.close()


def test_a_rank_whose_share_was_closed_reads_the_database_itself_with_one_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    env = make_env(device_kind="cpu", device_name="a cpu")
    result = make_result(env=env)
    with Store(url) as seeded:
        seeded.put_result(result)
    store, own = Store(url), Store(url)
    opened: list[int] = []
    server = NodeServer(_role(tmp_path, 0).socket_path, SharedReads(lambda: store, 2))
    client = NodeClient(server.path, timeout=5, fallback=lambda: (opened.append(1), own)[1])
    caplog.set_level(logging.INFO, logger="autotune")
    try:
        assert client.lookup(env, result.request.key) == result and not opened
        server.close()  # local rank 0 uninstalled, or ended: the connection is closed
        assert client.lookup(env, result.request.key) == result
        assert client.lookup(env, "absent") is None
        assert len(opened) == 2  # both calls read this rank's own database
        lines = [r.getMessage() for r in caplog.records if "closed the node's cache share" in r.getMessage()]
        assert len(lines) == 1, lines
    finally:
        client.close()
        store.close()
        own.close()


_BUILD_THE_SHARE = """
import sys
from autotune.job.serve_policy import ServePolicy
from autotune.settings import Settings
policy = ServePolicy(Settings(cache=sys.argv[1]))
print(policy.store._node._server is not None, "sqlalchemy" in sys.modules)
policy.close()
"""


def test_building_local_rank_0s_share_imports_no_sqlalchemy(tmp_path: Path) -> None:
    """The install builds the node share on the caller's thread: SQLAlchemy's import (0.3 s of
    CPU) is left to the thread that first reads the store (autotune/job/store_imports.py)."""
    env = {**os.environ, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "1",
           "TORCHELASTIC_RUN_ID": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _BUILD_THE_SHARE, f"sqlite:///{tmp_path / 'cache.db'}"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False"]  # serving, and nothing of SQLAlchemy imported


# Two ranks of one node as torchrun starts them: sibling processes (this test is their agent),
# each with the hook's own policy. Local rank 0 reports when its share ends and what is left of it.
# The lookup timeout is long: on a loaded CI host rank 0's first answer (its store's imports) took
# over the default 2 s, and rank 1 then rightly gave up on it, which is not what this test is about.
_RANK_0 = """
import sys, threading, time
from autotune.job.serve_policy import ServePolicy
from autotune.settings import Settings
policy = ServePolicy(Settings(cache=sys.argv[1], lookup_timeout=30.0))
server = policy.store._node._server
print("serving", flush=True)
print("served" if server.wait_served(120) else "not served", flush=True)
for thread in threading.enumerate():
    if thread.name == "autotune-node-peer":
        thread.join(5)
print(sorted(t.name for t in threading.enumerate() if t.name.startswith("autotune-node")), server.path.exists())
policy.close()
"""
_RANK_1 = """
import sys
sys.path.insert(0, sys.argv[2])
from factories import make_env
from autotune.job.serve_policy import ServePolicy
from autotune.settings import Settings
policy = ServePolicy(Settings(cache=sys.argv[1], lookup_timeout=30.0))
env = make_env(device_kind="cpu", device_name="a cpu")
print(policy.store.call(lambda store: (type(store).__name__, store.lookup(env, "absent"))), policy.stats.database_calls)
policy.close()
"""


def test_local_rank_0_of_a_real_node_share_ends_once_rank_1_uninstalled(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    env = {**os.environ, "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "1", "TORCHELASTIC_RUN_ID": str(tmp_path)}
    rank_0 = subprocess.Popen([sys.executable, "-c", _RANK_0, url], env={**env, "LOCAL_RANK": "0"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert rank_0.stdout is not None and rank_0.stdout.readline().strip() == "serving"
        rank_1 = subprocess.run([sys.executable, "-c", _RANK_1, url, str(Path(__file__).parent)],
                                env={**env, "LOCAL_RANK": "1"}, capture_output=True, text=True, timeout=120)
        assert rank_1.returncode == 0, rank_1.stderr[-2000:]
        assert rank_1.stdout.split("\n")[0] == "('NodeClient', None) 0"  # asked local rank 0, not the database
        out, err = rank_0.communicate(timeout=120)
    finally:
        rank_0.kill()
    assert rank_0.returncode == 0, err[-2000:]
    assert out.splitlines() == ["served", "[] False"]  # no thread of the share left, and no socket

"""A PostgreSQL cluster of the test's own: ``initdb`` in a temporary folder with the installed
binaries, started on a free port, stopped and removed at the end.

A test that stops or restarts a server (tests/fault_scenarios.py: the restart mid-sweep) uses
one of these, never the machine's shared server, which other programs and the other tests use.
PostgreSQL refuses to run as root: under root the cluster runs as the ``postgres`` system user
(``runuser``), which owns the temporary folder; any other user runs it as itself.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

# Enough for the first start of a fresh cluster on a loaded 2-core machine.
START_TIMEOUT_S = 60


def _binaries() -> Path | None:
    """The newest installed PostgreSQL's bin folder that has initdb and pg_ctl."""
    found = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")
             if (Path(p) / "initdb").exists() and (Path(p) / "pg_ctl").exists()]
    if not found:
        on_path = shutil.which("initdb")
        return Path(on_path).parent if on_path and shutil.which("pg_ctl") else None
    return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)


def unavailable() -> str | None:
    """Why no private cluster can start here (None: it can)."""
    if _binaries() is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin or on PATH"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and no 'postgres' system user to run the server as"
        if shutil.which("runuser") is None:
            return "running as root and no runuser to run the server as 'postgres'"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivatePostgres:
    """One cluster: ``url`` (user postgres, trust auth, database postgres), ``stop()``, ``start()``,
    ``remove()``. A context manager: the cluster is stopped and its folder removed on exit."""

    def __init__(self) -> None:
        why = unavailable()
        if why is not None:
            raise RuntimeError(why)
        self.bin = _binaries()
        assert self.bin is not None
        self.root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
        self.data, self.log = self.root / "data", self.root / "server.log"
        self._as_user = os.geteuid() == 0
        if self._as_user:
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self.port = _free_port()
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str, timeout: float = 120) -> None:
        argv = [str(self.bin / tool), *args]
        if self._as_user:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args[:2])} failed ({done.returncode}): "
                               f"{(done.stderr or done.stdout)[-2000:]}\n{log}")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
                   "-c fsync=off -c full_page_writes=off -c max_connections=100")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", str(START_TIMEOUT_S),
                  "-o", options, "start", timeout=START_TIMEOUT_S + 30)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the private PostgreSQL on port {self.port} never accepted a connection")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: sessions are disconnected, as a restart does)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", str(START_TIMEOUT_S), "stop",
                  timeout=START_TIMEOUT_S + 30)

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def remove(self) -> None:
        """Stop the server if it runs, and delete its folder."""
        try:
            if self.running():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

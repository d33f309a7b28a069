"""Leases in SQL: one sweep at a time tunes a request, and a dead sweep's requests are taken over.

No extra server: a row per (environment key, request key) in the cache database.

- **claim**: ``INSERT ... ON CONFLICT DO NOTHING``; if the row exists, a conditional
  ``UPDATE`` takes it over only when it has expired (its holder stopped renewing) or
  was released before this sweep began. The UPDATE names the old holder and
  acquisition time, so of two sweeps taking over one row exactly one wins, on
  PostgreSQL (row lock, re-checked WHERE) and SQLite (one writer at a time) alike.
- **heartbeat**: one UPDATE renews every lease of a holder; a lease that was taken
  over meanwhile (the holder stalled past expiry) shows up as lost.
- **release**: stamps ``released_at`` and the result's status, after the result is
  stored. A sweep that waited on that request and sees it released after its own
  start knows it was done meanwhile and skips it; a later sweep may take the row
  (e.g. to retry a failure).

Times are the sweeps' own UTC clocks: hosts must agree to well within the lease
time (60 s by default; NTP gives milliseconds).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, and_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from autotune.cache.errors import CacheError, one_line
from autotune.cache.models import leases as L
from autotune.cache.protocols import TransactionalStore
from autotune.cache.records import utcnow

log = logging.getLogger(__name__)


CLAIMED = "claimed"  # this holder has it now: tune it
TAKEN = "taken"  # a live holder has it: wait, then ask again
DONE = "done"  # released by another holder since ``since``: skip it

LeaseKey = tuple[str, str]  # (environment key, request key)


def new_holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class Leases:
    """The leases one holder (one sweep) takes in one cache database."""

    store: TransactionalStore
    holder: str
    seconds: float = 60.0  # how long a lease lives without a heartbeat
    since: datetime | None = None  # this holder's start: releases after it mean "done"

    def __post_init__(self) -> None:
        self.since = self.since or utcnow()
        self._held: set[LeaseKey] = set()
        self._lock = threading.Lock()

    @property
    def held(self) -> set[LeaseKey]:
        with self._lock:
            return set(self._held)

    def claim(self, key: LeaseKey) -> str:
        """CLAIMED, TAKEN or DONE (see the module's docstring)."""
        state = self._run(lambda conn: self._claim(conn, key))
        if state == CLAIMED:
            with self._lock:
                self._held.add(key)
        return state

    def release(self, key: LeaseKey, outcome: str | None) -> None:
        """After the result is stored. A lease lost meanwhile is only logged."""
        with self._lock:
            self._held.discard(key)
        now = utcnow()
        query = (update(L).where(*_is(key), L.c.holder == self.holder, L.c.released_at.is_(None))
                 .values(released_at=now, expires_at=now, outcome=(outcome or "")[:32]))
        if self._run(lambda conn: conn.execute(query).rowcount) == 0:
            log.warning("lease on request %s was taken over before its result was stored", key[1][:12])

    def heartbeat(self) -> set[LeaseKey]:
        """Renew every lease held; returns those lost (taken over after expiring)."""
        held = self.held
        if not held:
            return set()
        expires = utcnow() + timedelta(seconds=self.seconds)
        renew = (update(L).where(L.c.holder == self.holder, L.c.released_at.is_(None))
                 .values(expires_at=expires))
        mine = select(L.c.env_key, L.c.request_key).where(L.c.holder == self.holder, L.c.released_at.is_(None))

        def work(conn: Connection) -> set[LeaseKey]:
            conn.execute(renew)
            return {(row.env_key, row.request_key) for row in conn.execute(mine)}

        lost = held - self._run(work)
        if lost:
            with self._lock:
                self._held -= lost
            log.warning("%d lease(s) expired and were taken over by another sweep", len(lost))
        return lost

    def release_all(self) -> None:
        """Give back what is still held (a sweep that stops early), so others need not wait."""
        now = utcnow()
        query = (update(L).where(L.c.holder == self.holder, L.c.released_at.is_(None))
                 .values(expires_at=now))  # expired, not released: nobody reads it as done
        with self._lock:
            self._held.clear()
        self._run(lambda conn: conn.execute(query))

    # ------------------------------------------------------------------ internals

    def _claim(self, conn: Connection, key: LeaseKey) -> str:
        now = utcnow()
        values = {"env_key": key[0], "request_key": key[1], "holder": self.holder, "acquired_at": now,
                  "expires_at": now + timedelta(seconds=self.seconds), "released_at": None, "outcome": None}
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        if conn.execute(dialect.insert(L).values(**values).on_conflict_do_nothing()).rowcount == 1:
            return CLAIMED
        row = conn.execute(select(L).where(*_is(key))).one_or_none()
        if row is None:  # released rows are never deleted; a prune may have removed it: try again later
            return TAKEN
        if row.holder == self.holder and row.released_at is None:
            return CLAIMED
        assert self.since is not None
        if row.released_at is not None and row.released_at >= self.since and row.outcome:
            return DONE
        if row.released_at is None and row.expires_at > now:
            return TAKEN
        take = (update(L).where(*_is(key), L.c.holder == row.holder, L.c.acquired_at == row.acquired_at)
                .values(**{k: v for k, v in values.items() if k not in ("env_key", "request_key")}))
        if conn.execute(take).rowcount != 1:
            return TAKEN  # another sweep took it over first
        if row.released_at is None:
            log.info("took over the expired lease of %s on request %s", row.holder, key[1][:12])
        return CLAIMED

    def _run(self, work: Any) -> Any:
        try:
            return self.store._write(work)
        except sa.exc.SQLAlchemyError as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise CacheError(f"cache database error on a lease ({self.store.masked_url}): {first}") from error


def _is(key: LeaseKey) -> tuple[Any, ...]:
    return (and_(L.c.env_key == key[0], L.c.request_key == key[1]),)


class Heartbeat:
    """Renews a holder's leases every ``seconds / 3`` in a daemon thread until stopped."""

    def __init__(self, leases: Leases) -> None:
        self.leases = leases
        self.lost: set[LeaseKey] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autotune-lease-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.leases.seconds / 3):
            try:
                self.lost |= self.leases.heartbeat()
            except Exception as exc:  # a blip: the next beat retries well before expiry
                # One line (a full disk says why in the sweep's own Error line); the trace at debug.
                log.warning("could not renew the sweep's leases (%s); the next beat retries", one_line(exc))
                log.debug("lease heartbeat failed", exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

"""The work-queue engine of one gateway process: the committer and the pumps.

Consumers and HTTP views talk to the engine only. It submits operations to the
group committer and, when a batch commits something that may make messages
visible (an enqueue, a nack, a release), wakes those queues' pumps, so waiting
workers are fed without polling. On PostgreSQL the same wake-ups reach the
other gateway processes through ``NOTIFY`` (``gateway.engine.notify``).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import socket
import sqlite3
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.db import connections

from gateway.conf import gateway_settings
from gateway.core.errors import Backpressure, ProtocolError, QueueFull
from gateway.engine.cancels import CancelNotices
from gateway.engine.committer import Callback, Committer
from gateway.engine.pump import QueuePump, WorkerSink
from gateway.engine.wal import NO_AUTOCHECKPOINT, WalCheckpointer
from gateway.store import (
    POSTGRESQL,
    SQLITE,
    Ack,
    CommitTxn,
    Enqueue,
    Op,
    Result,
    Returns,
    Store,
)
from gateway.store.dialects import check_sqlite

__all__ = ["PROCESS_NAME", "Engine", "django_store"]

T = TypeVar("T")


#: How often an enqueue blocked on a full ``block`` queue tries again, at
#: most: room made by this process wakes it at once, room made by another
#: process (or by expiry) is found by this poll.
ROOM_POLL = 0.1
#: The poll of one waiting enqueue doubles up to this, so many of them cost little.
ROOM_POLL_MAX = 1.0

#: Ops that enqueue, so may meet a full ``block`` queue and wait for room on
#: landing; a tuple, which isinstance() checks faster than a union, once per op.
_ENQUEUING_OPS = (Enqueue, Ack, CommitTxn)

#: This process's name: host and pid (labels it in stats; signs its NOTIFYs).
PROCESS_NAME = f"{socket.gethostname()}:{os.getpid()}"

#: Server-side settings of the store's PostgreSQL sessions: how soon the
#: database gives up on a gateway it cannot hear from. A partition between a
#: gateway and the database (tests/cluster/test_partitions.py) left the
#: gateway's session "idle in transaction" on the server for as long as the
#: cut lasted (the server's keepalives start after two hours by default),
#: holding the row locks of the batch it was running, so other processes
#: skipped those messages (``SKIP LOCKED``) until the network healed. With
#: these the server drops the session, and so its transaction, within
#: seconds. The gateway's own side has the same bounds (DATABASE_URL's
#: libpq parameters, gateway.site.database_url).
SERVER_NETWORK_SETTINGS = (
    ("tcp_keepalives_idle", "2"),
    ("tcp_keepalives_interval", "1"),
    ("tcp_keepalives_count", "3"),
    ("tcp_user_timeout", "5000"),  # milliseconds; PostgreSQL 12 and later
)

#: The run of a statement from which the store's PostgreSQL connection
#: prepares it (psycopg's ``prepare_threshold``; see :func:`_bind_on_server`).
STORE_PREPARE_THRESHOLD = 2

log = logging.getLogger("leasecast.store")


def django_store() -> Store:
    """A :class:`Store` on a connection of its own to Django's default database."""
    conf = gateway_settings()
    wrapper: Any = None

    def connect() -> Any:
        nonlocal wrapper
        if wrapper is not None:
            wrapper.close()
        # A wrapper of our own, not the thread-local one: this connection
        # belongs to the store thread alone, and Django's init (SQLite PRAGMAs,
        # foreign keys) still runs.
        wrapper = connections.create_connection("default")
        wrapper.ensure_connection()
        raw = wrapper.connection
        if isinstance(raw, sqlite3.Connection):
            check_sqlite(raw)
            raw.isolation_level = None  # we issue BEGIN IMMEDIATE / COMMIT ourselves
            # The process's WalCheckpointer checkpoints, not this connection's
            # commits (gateway.engine.wal).
            raw.execute(NO_AUTOCHECKPOINT)
        else:
            raw.autocommit = True
            _bind_on_server(raw, wrapper.settings_dict.get("OPTIONS") or {})
            _bound_server_waits(raw)
        return raw

    vendor = connections["default"].vendor
    dialect = SQLITE if vendor == "sqlite" else POSTGRESQL
    if vendor not in ("sqlite", "postgresql"):
        raise RuntimeError(f"Leasecast supports SQLite and PostgreSQL, not {vendor}")
    return Store(
        connect,
        dialect,
        clock=time.time,
        defaults=conf.default_queue,
        settings_ttl=conf.queue_settings_ttl,
        announce_as=PROCESS_NAME,
    )


def _bind_on_server(conn: Any, options: dict[str, Any]) -> None:
    """Make the store's PostgreSQL statements cheap to run again and again.

    Django gives a psycopg connection client-side binding (every parameter,
    arrays of a batch's rows included, quoted into the statement's text in
    Python, and the text parsed and planned again by the server) and no
    prepared statements. The store runs the same few statements thousands of
    times a second, so its own connection binds parameters on the server and
    prepares a statement from its :data:`STORE_PREPARE_THRESHOLD`-th run on:
    about half the server's CPU per batch, and less Python on the store
    thread. A ``prepare_threshold`` in ``DATABASES["default"]["OPTIONS"]``
    wins: ``None`` there turns preparing off, for a pooler in transaction
    mode that does not track prepared statements (PgBouncer before 1.21, or
    without ``max_prepared_statements``). Binding on the server needs no
    session state, so it stays on behind any pooler.
    """
    import psycopg

    if not isinstance(conn, psycopg.Connection):
        return  # another driver: left as Django made it
    conn.cursor_factory = psycopg.Cursor
    if "prepare_threshold" not in options:
        conn.prepare_threshold = STORE_PREPARE_THRESHOLD


def _bound_server_waits(conn: Any) -> None:
    """Apply :data:`SERVER_NETWORK_SETTINGS` to a new PostgreSQL session (autocommit);
    one the server does not know (an older version) is skipped, and said so."""
    for name, value in SERVER_NETWORK_SETTINGS:
        try:
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        except Exception as exc:
            log.warning("the database refused %s = %s (%s); going on without it", name, value, exc)


class Engine:
    """One process's work-queue engine.

    Args:
        committer: runs store operations.
        block_wait: seconds an enqueue waits for room in a full ``block``
            queue before it is refused with ``backpressure``.
    """

    def __init__(self, committer: Committer, *, block_wait: float = 10.0) -> None:
        self.committer = committer
        self.block_wait = block_wait
        # Retries of enqueues waiting for room, per queue, oldest first.
        self._room_waiters: dict[str, list[_RoomWaiter]] = {}
        self.pumps: dict[str, QueuePump] = {}
        #: every open socket of this process (each has ``describe()``)
        self.sockets: set[Any] = set()
        #: per-queue running totals since the process started (the dashboard's rates)
        self.started_at = time.time()
        self.process = PROCESS_NAME
        self.listener: Any = None
        self.local_listener: Any = None
        #: on SQLite, the thread that checkpoints the store's log (gateway.engine.wal)
        self.checkpointer: WalCheckpointer | None = None
        #: cancelled leases told to this process's sockets (protocol 1.2: Cancel)
        self.cancels = CancelNotices(self.pumps)
        committer.fold = self._fold

    def _fold(self, ops: list[Op]) -> list[tuple[Op, Callback]]:
        """Lease rounds to run in the transaction of a batch that enqueues
        (:meth:`QueuePump.fold`): one per queue enqueued to whose pump is idle
        with sockets that want work."""
        folded: list[tuple[Op, Callback]] = []
        queues: set[str] = set()
        for op in ops:
            if type(op) is Enqueue and op.queue not in queues:
                queues.add(op.queue)
                pump = self.pumps.get(op.queue)
                round_ = pump.fold() if pump is not None else None
                if round_ is not None:
                    folded.append(round_)
        return folded

    def close(self) -> None:
        """Stop the store thread and the wake-up listeners."""
        if self.listener is not None:
            self.listener.stop()
        if self.local_listener is not None:
            self.local_listener.cancel()
        if self.checkpointer is not None:
            self.checkpointer.stop()
        self.committer.close()

    def describe(self) -> dict[str, Any]:
        """This process's figures for ``/api/stats``."""
        return {
            "name": self.process,
            "started_at": self.started_at,
            "store_batches": self.committer.batches,
            "store_ops": self.committer.ops,
            "store_backlog": self.committer.backlog,
            "store_refused": self.committer.refused,
        }

    # -- operations

    def submit(self, op: Op, callback: Callback) -> None:
        """Submit ``op``; ``callback`` gets its result on the loop after the commit.

        An op that enqueues into a full ``block`` queue is tried again as room
        appears, for up to ``block_wait`` seconds, then answered
        ``backpressure`` (protocol 1.1: bounded queues).
        """
        if not isinstance(op, _ENQUEUING_OPS) or (type(op) is Ack and not op.follow_ups):
            # No room to wait for (a plain ack is most of a worker's traffic):
            # the result goes straight back.
            self.committer.submit(op, callback)
        else:
            self.committer.submit(op, lambda result: self._landed(op, result, callback, None))

    def _landed(
        self,
        op: Enqueue | Ack | CommitTxn,
        result: Result,
        callback: Callback,
        deadline: float | None,
        poll: float = ROOM_POLL,
    ) -> None:
        if isinstance(result, QueueFull) and result.may_wait:
            now = time.monotonic()
            deadline = now + self.block_wait if deadline is None else deadline
            if now < deadline:
                first = deadline - self.block_wait  # when it was first refused: its place
                again = min(poll * 2, ROOM_POLL_MAX)
                self._wait_for_room(
                    result.queue,
                    lambda: self.committer.submit(
                        op, lambda res: self._landed(op, res, callback, deadline, again)
                    ),
                    min(deadline - now, poll),
                    first,
                )
                return
            result = Backpressure(
                f"queue {result.queue!r} stayed full for {self.block_wait:g} s (overflow block)"
            )
        callback(result)

    def _wait_for_room(
        self, queue: str, retry: Callable[[], None], wait: float, since: float
    ) -> None:
        """Run ``retry`` once: when this process makes room in ``queue``, or after
        ``wait`` seconds. Waiters keep the order in which they were first refused."""
        waiters = self._room_waiters.setdefault(queue, [])
        waiter = _RoomWaiter(retry, waiters, since)
        waiter.timer = asyncio.get_running_loop().call_later(wait, waiter.fire)
        bisect.insort(waiters, waiter, key=lambda w: w.since)

    def room_made(self, queue: str, n: int) -> None:
        """``n`` messages left ``queue``'s counted states here: retry as many of the
        enqueues waiting for room, the longest waiting first."""
        waiters = self._room_waiters.get(queue)
        if not waiters:
            return
        for waiter in waiters[:n]:
            waiter.fire()
        if not waiters:
            del self._room_waiters[queue]

    def leased(self, queue: str, n: int) -> None:
        """``n`` messages of ``queue`` were leased: enqueues waiting for room in
        a full ``block`` queue may try again. (The queues' counters are the
        store's: each batch reports what it counted to the metrics.)"""
        if n and queue in self._room_waiters:
            self.room_made(queue, n)

    async def call(self, op: Returns[T]) -> T:
        """:meth:`submit` ``op`` and wait for its result (raises its ProtocolError).

        Through :meth:`submit`, so an HTTP enqueue into a full ``block`` queue
        waits for room as a socket's does, and is counted the same way.
        """
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()

        def resolve(result: Result) -> None:
            if not future.done():
                future.set_result(result)

        self.submit(op, resolve)  # type: ignore[arg-type]
        result = await future
        if isinstance(result, ProtocolError):
            raise result
        return result  # type: ignore[return-value]

    # -- pumps

    def pump(self, queue: str) -> QueuePump:
        """The pump of ``queue``, made on first use."""
        pump = self.pumps.get(queue)
        if pump is None:
            pump = self.pumps[queue] = QueuePump(queue, self.committer.submit, self.leased)
        return pump

    def attach(self, queue: str, sink: WorkerSink) -> QueuePump:
        """Feed ``sink`` from ``queue``."""
        pump = self.pump(queue)
        pump.attach(sink)
        return pump

    def detach(self, queue: str, sink: WorkerSink) -> None:
        """Stop feeding ``sink``."""
        pump = self.pumps.get(queue)
        if pump is not None:
            pump.detach(sink)

    def wake(self, queue: str) -> None:
        """Messages of ``queue`` may have become visible."""
        pump = self.pumps.get(queue)
        if pump is not None:
            pump.wake()

    def wake_all(self, queues: Iterable[str] | None = None) -> None:
        """Wake the pumps of ``queues`` (None: every pump, after missed notifications)."""
        for queue in self.pumps if queues is None else queues:
            self.wake(queue)


class _RoomWaiter:
    """One enqueue waiting for room in a ``block`` queue: retried once, by
    whichever comes first, the poll timer or :meth:`Engine.room_made`."""

    def __init__(self, retry: Callable[[], None], waiters: list[_RoomWaiter], since: float) -> None:
        self._retry: Callable[[], None] | None = retry
        self._waiters = waiters
        self.since = since
        self.timer: asyncio.TimerHandle | None = None

    def fire(self) -> None:
        retry, self._retry = self._retry, None
        if retry is None:
            return
        if self.timer is not None:
            self.timer.cancel()
        if self in self._waiters:
            self._waiters.remove(self)
        retry()

"""Store transactions on Django's own connection, for code outside the gateway's loop.

The admin's actions (``gateway.host.operations``) and the transactional enqueue
API (``gateway.host.producer``) apply the store's functions through the caller's
connection, inside the caller's ``transaction.atomic()``: what they write
commits or rolls back with the caller's own rows (design decision 12).

Waking the gateways follows the commit, never a poll: on PostgreSQL a
``pg_notify`` inside the transaction (delivered on commit to every gateway
process, ``gateway.engine.notify``); on SQLite, after the commit, this process's
pumps directly and the other processes' through datagrams.

:func:`enqueue_on_django` is the enqueue both of them share: on PostgreSQL a
single message without a key or group goes as one statement
(``gateway.store.enqueue_statement``), everything else as a store transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, closing, contextmanager
from typing import Any

from django.db import connections, transaction

from gateway.core.protocol import EnqueueSpec
from gateway.engine.notify import announce_local, listening
from gateway.engine.wal import leave_checkpoints_to_gateways
from gateway.runtime import count_from_thread
from gateway.store.dialects import (
    POSTGRESQL,
    SQLITE,
    SQLITE_THROUGH_DJANGO,
    Dialect,
    take_write_lock,
)
from gateway.store.enqueue import enqueue as store_enqueue
from gateway.store.enqueue_statement import enqueue_in_one_statement, fits_one_statement
from gateway.store.groups import settle
from gateway.store.ops import EnqueueResult
from gateway.store.runner import NOTIFY_CHANNEL
from gateway.store.tasks import NewTask
from gateway.store.tasks import create as create_task
from gateway.store.txn import QueueCache, Txn, django_shard

__all__ = ["django_transaction", "enqueue_on_django"]


@contextmanager
def django_transaction(using: str = "default") -> Iterator[Txn]:
    """A store transaction on Django connection ``using``, nested in the caller's.

    Groups are settled before it ends and the gateways are woken once the
    outermost transaction commits.
    """
    from gateway.conf import gateway_settings

    connection = connections[using]
    with _atomic(connection, using), _store_cursor(connection) as (cursor, dialect):
        # SQLite: the gateway processes on the file, read once for the
        # checkpoints and the wake-up after the commit.
        peers = None
        if connection.vendor == "sqlite":
            peers = listening(using)
            leave_checkpoints_to_gateways(connection, cursor, gateways=bool(peers))
        # No cache across calls: settings edited elsewhere apply at once here.
        queues = QueueCache(gateway_settings().default_queue, ttl=0.0)
        txn = Txn(cursor, dialect, time.time(), queues)
        yield txn
        settle(txn)
        counted = txn.write_counts(django_shard())
        if counted:
            # This process's runtime, if it serves the gateway: its dashboard's rates.
            transaction.on_commit(lambda: count_from_thread(counted), using=using)
        _announce(cursor, connection.vendor, using, txn.woken, peers)


@contextmanager
def _store_cursor(connection: Any) -> Iterator[tuple[Any, Dialect]]:
    """A cursor of Django connection ``connection`` for the store's statements,
    and the dialect that writes them for it.

    Django's own cursor takes ``%s`` placeholders; on SQLite it turns them
    into ``?`` with a regular expression on every statement (about a tenth
    of an enqueue's CPU). Unless Django logs the queries (``DEBUG``: its
    debug wrapper renders each statement with ``%``, which needs ``%s``),
    the statements go with ``?`` to Django's wrapper around the driver's
    plain cursor instead: execute wrappers and Django's error classes see
    them as before.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            yield cursor, POSTGRESQL
        return
    if connection.queries_logged:
        with connection.cursor() as cursor:
            yield cursor, SQLITE_THROUGH_DJANGO
        return
    with _wrapped(connection, lambda raw: raw.cursor()) as cursor:
        yield cursor, SQLITE


@contextmanager
def _atomic(connection: Any, using: str) -> Iterator[None]:
    """``transaction.atomic(using)``; an outermost one on SQLite whose ``BEGIN``
    takes the write lock (``transaction_mode`` IMMEDIATE or EXCLUSIVE, as the
    docs ask) takes it in short steps, as the gateway's store does
    (``gateway.store.dialects.take_write_lock``): with SQLite's own busy
    handler an enqueue that met a gateway's commit slept 1 ms or more."""
    atomic = transaction.atomic(using=using)
    takes_lock = getattr(connection, "transaction_mode", None) in ("IMMEDIATE", "EXCLUSIVE")
    if connection.vendor != "sqlite" or connection.in_atomic_block or not takes_lock:
        with atomic:
            yield
        return
    connection.ensure_connection()
    # A BEGIN refused as busy leaves Django's state as it was: it may be tried again.
    with closing(connection.connection.cursor()) as raw:
        take_write_lock(raw, atomic.__enter__)
    with ExitStack() as entered:
        entered.push(atomic)  # its __exit__: commit, or roll back on an exception
        yield


def enqueue_on_django(
    using: str, queue: str, specs: list[EnqueueSpec], task: NewTask | None = None
) -> list[EnqueueResult]:
    """Enqueue ``specs`` to ``queue`` (and write ``task``'s result row with the
    first) through Django connection ``using``, in the caller's transaction if
    there is one; all or nothing.

    Raises:
        QueueFull: ``queue`` is bounded and the messages do not fit; nothing
            was written.
    """
    connection = connections[using]
    if connection.vendor == "postgresql" and fits_one_statement(specs):
        msg_id = _enqueue_in_one_statement(connection, using, queue, specs[0], task)
        if msg_id is not None:
            return [EnqueueResult(str(msg_id), False)]
    with django_transaction(using) as txn:
        results = store_enqueue(txn, queue, specs)
        if task is not None:
            create_task(txn, task, int(results[0].id))
    return results


def _enqueue_in_one_statement(
    connection: Any, using: str, queue: str, spec: EnqueueSpec, task: NewTask | None
) -> int | None:
    def run(cursor: Any) -> int | None:
        return enqueue_in_one_statement(
            cursor, queue, spec, now=time.time(), shard=django_shard(), task=task
        )

    if connection.in_atomic_block or not connection.get_autocommit():
        # In the caller's transaction: a savepoint, so that a failure is the
        # caller's to handle, as on the general path.
        with transaction.atomic(using=using), _binding_cursor(connection) as cursor:
            msg_id = run(cursor)
    else:
        # Not in a transaction: the statement is one, its own BEGIN and COMMIT.
        with _binding_cursor(connection) as cursor:
            msg_id = run(cursor)
    if msg_id is not None:
        # What django_transaction does after a commit: this process's
        # dashboard counts and pumps (the statement's NOTIFY told the others).
        transaction.on_commit(lambda: _after_one_statement(queue, using), using=using)
    return msg_id


def _after_one_statement(queue: str, using: str) -> None:
    count_from_thread({(queue, "enqueued", ""): 1})
    _wake_after_commit("postgresql", [queue], using)


def _binding_cursor(connection: Any) -> Any:
    """A cursor on Django connection ``connection`` that sends its parameters
    apart from the statement (server-side binding), wrapped as Django wraps
    its own: ``connection.queries`` and execute wrappers see what it runs.

    Django's psycopg cursor writes the values into the statement's text
    unless the database's ``OPTIONS`` ask for ``server_side_binding``; for
    the one-statement enqueue PostgreSQL then spent about 180 us more CPU
    per statement (a text full of literals to parse and plan) than with
    parameters.
    """
    if connection.vendor != "postgresql":
        return connection.cursor()
    # Imported here, not at the top: a project on SQLite never loads the driver.
    import psycopg

    connection.close_if_health_check_failed()  # before connecting, as cursor() does
    connection.ensure_connection()
    if not isinstance(connection.connection, psycopg.Connection):
        return connection.cursor()  # another driver: Django's own cursor
    return _wrapped(connection, psycopg.Cursor)


def _wrapped(connection: Any, make: Callable[[Any], Any]) -> Any:
    """``make(driver_connection)``, a cursor of the driver's, wrapped as
    Django's ``connection.cursor()`` wraps its own: health check, thread
    check, Django's error classes, and its debug wrapper while it logs the
    queries (``connection.queries``) or its plain one (execute wrappers)."""
    connection.close_if_health_check_failed()  # CONN_HEALTH_CHECKS
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        raw = make(connection.connection)
    if connection.queries_logged:
        return connection.make_debug_cursor(raw)
    return connection.make_cursor(raw)


def _announce(
    cursor: Any, vendor: str, using: str, queues: Iterable[str], peers: list[str] | None = None
) -> None:
    names = sorted(set(queues))
    if not names:
        return
    if vendor == "postgresql":
        for name in names:
            # Signed "admin": every gateway's listener takes it (each skips
            # only its own store's notifications).
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, f"admin {name}"])
    transaction.on_commit(lambda: _wake_after_commit(vendor, names, using, peers), using=using)


def _wake_after_commit(
    vendor: str, names: list[str], using: str, peers: list[str] | None = None
) -> None:
    from gateway.runtime import wake_from_thread

    wake_from_thread(names)  # this process's pumps, if it serves the gateway
    if vendor != "postgresql":
        # The gateways of the file this transaction wrote to, which is not
        # always the "default" database's (``peers``: as read when it began).
        announce_local(names, using, peers)

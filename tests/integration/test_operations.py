"""Operator actions against a live store: requeue, purge and redrive under leasing."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.db import connection

from dashboard import operations
from gateway.errors import StaleReceipt
from gateway.leases import StoredState
from gateway.models import Message, Queue
from gateway.protocol import EnqueueSpec
from gateway.store import SQLITE, Ack, AckResult, Enqueue, Lease, Stats, Store


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    """A store on the same SQLite file as this process's Django connection."""
    call_command("migrate", verbosity=0)
    path = connection.settings_dict["NAME"]
    s = Store(
        lambda: sqlite3.connect(path, isolation_level=None, timeout=30), SQLITE, clock=time.time
    )
    yield s
    s.close()


def enqueue(store: Store, queue: str, n: int) -> None:
    (result,) = store.run([Enqueue(queue, [EnqueueSpec(str(i).encode()) for i in range(n)])])
    assert not isinstance(result, Exception)


def test_requeued_in_flight_message_makes_the_old_receipt_stale(store: Store) -> None:
    enqueue(store, "ops-requeue", 1)
    ((lease,),) = [r.delivered for r in store.run([Lease("ops-requeue", 1)])]
    assert operations.requeue(Message.objects.filter(pk=int(lease.id))) == 1
    (stale,) = store.run([Ack(lease.receipt)])
    assert isinstance(stale, StaleReceipt)
    ((again,),) = [r.delivered for r in store.run([Lease("ops-requeue", 1)])]
    assert again.id == lease.id and again.deliveries == 2
    assert isinstance(store.run([Ack(again.receipt)])[0], AckResult)


def test_redrive_resets_dead_messages(store: Store) -> None:
    enqueue(store, "ops-redrive", 2)
    Message.objects.filter(queue__name="ops-redrive").update(state=StoredState.DEAD, deliveries=5)
    assert operations.redrive(Queue.objects.get(name="ops-redrive")) == 2
    (stats,) = store.run([Stats("ops-redrive")])
    assert (stats["visible"], stats["dead"]) == (2, 0)


def test_purge_while_workers_lease_loses_nothing_it_did_not_purge(store: Store) -> None:
    queue, total = "ops-purge", 2000
    enqueue(store, queue, total)
    acked: list[str] = []
    stop = threading.Event()

    def worker() -> None:
        # A worker on its own store and thread, leasing 20 every 10 ms.
        own = Store(store._connect, SQLITE, clock=time.time)
        while not stop.is_set():
            time.sleep(0.01)
            (result,) = own.run([Lease(queue, 20)])
            if not result.delivered:
                time.sleep(0.005)
                continue
            for delivery, outcome in zip(
                result.delivered, own.run([Ack(d.receipt) for d in result.delivered]), strict=True
            ):
                if isinstance(outcome, AckResult):
                    acked.append(delivery.id)
        own.close()

    thread = threading.Thread(target=worker)
    thread.start()
    time.sleep(0.2)
    purged = operations.purge(Queue.objects.get(name=queue))
    time.sleep(0.3)
    stop.set()
    thread.join(10)
    remaining = Message.objects.filter(queue__name=queue).count()
    assert len(acked) == len(set(acked))  # no message acked twice
    assert len(acked) + purged + remaining == total  # each one acked, purged or still there
    assert purged > 0

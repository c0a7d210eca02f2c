"""Operator actions against a live store: requeue, purge and redrive under leasing."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import DELETION
from django.core.management import call_command
from django.db import connection

from gateway.core.errors import StaleReceipt
from gateway.core.leases import StoredState
from gateway.core.protocol import EnqueueSpec
from gateway.host import operations
from gateway.models import Message, Queue
from gateway.store import SQLITE, Ack, AckResult, Enqueue, Lease, Nack, Stats, Store
from tests.support.clients import Socket, ahttp, unique
from tests.support.gateways import GatewayProcess
from tests.support.sessions import PASSWORD, StaffSession, admin_log, logged, notices
from tests.support.waiting import wait_until


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
    # A new lease with a new receipt; the count started again at the requeue.
    assert again.id == lease.id and again.receipt != lease.receipt and again.deliveries == 1
    assert isinstance(store.run([Ack(again.receipt)])[0], AckResult)


def test_requeued_poison_message_is_delivered_not_dead_lettered_again(store: Store) -> None:
    queue = "ops-poison"
    Queue.objects.create(name=queue, max_deliveries=1)
    enqueue(store, queue, 1)
    ((first,),) = [r.delivered for r in store.run([Lease(queue, 1)])]
    assert first.deliveries == 1
    assert not isinstance(store.run([Nack(queue, first.receipt)])[0], Exception)
    (again,) = store.run([Lease(queue, 1)])
    assert again.delivered == [] and again.dead_lettered == 1  # a second delivery: too many
    poison = Message.objects.get(pk=int(first.id))
    assert (poison.state, poison.deliveries) == (StoredState.DEAD, 1)

    assert operations.requeue([poison]) == 1
    (leased,) = store.run([Lease(queue, 1)])
    assert leased.dead_lettered == 0
    (delivery,) = leased.delivered
    assert (delivery.id, delivery.deliveries) == (first.id, 1)
    assert isinstance(store.run([Ack(delivery.receipt)])[0], AckResult)


def test_requeue_leaves_visible_and_delayed_messages_alone(store: Store) -> None:
    queue = "ops-waiting"
    (result,) = store.run([Enqueue(queue, [EnqueueSpec(b"1"), EnqueueSpec(b"2", delay=3600)])])
    assert not isinstance(result, Exception)
    before = list(Message.objects.filter(queue__name=queue).values_list("state", "visible_at"))
    assert operations.requeue(Message.objects.filter(queue__name=queue)) == 0
    after = list(Message.objects.filter(queue__name=queue).values_list("state", "visible_at"))
    assert after == before
    (stats,) = store.run([Stats(queue)])
    assert (stats.visible, stats.delayed) == (1, 1)


def test_redrive_resets_dead_messages(store: Store) -> None:
    enqueue(store, "ops-redrive", 2)
    Message.objects.filter(queue__name="ops-redrive").update(state=StoredState.DEAD, deliveries=5)
    assert operations.redrive(Queue.objects.get(name="ops-redrive")) == 2
    (stats,) = store.run([Stats("ops-redrive")])
    assert (stats.visible, stats.dead) == (2, 0)


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


# -- the admin of a live gateway, as a staff user's browser session uses it

STAFF = "ops"


@pytest.fixture(scope="module")
def staff(gateway: GatewayProcess) -> StaffSession:
    gateway.manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User;"
        f"User.objects.create_superuser({STAFF!r}, 'ops@example.com', {PASSWORD!r})",
    )
    session = StaffSession(gateway.http)
    session.login(STAFF, PASSWORD)
    return session


async def queue_stats(gateway: GatewayProcess, token: str, queue: str) -> dict[str, Any]:
    status, stats = await ahttp("GET", f"{gateway.http}/api/queues/{queue}", token)
    assert status == 200, stats
    return dict(stats)


async def test_requeued_poison_message_reaches_a_worker(
    gateway: GatewayProcess, admin_token: str, staff: StaffSession
) -> None:
    queue = unique("poison")
    gateway.manage("configure_queue", queue, "--max-deliveries", "1")
    url = f"{gateway.ws}/ws/queues/{queue}/?prefetch=1"
    async with await Socket.open(url, admin_token) as worker:
        assert (await worker.request({"op": "enqueue", "body": "poison"}))["op"] == "enqueued"
        (first,) = await worker.deliveries(1)
        assert first["deliveries"] == 1
        assert (await worker.request({"op": "nack", "receipt": first["receipt"]}))["op"] == "nacked"

        async def dead() -> bool:
            return (await queue_stats(gateway, admin_token, queue))["dead"] == 1

        await wait_until(dead, "the nacked message dead-lettered at its next lease", timeout=120)

        # The operator requeues it from the admin: it reaches the worker, counted afresh.
        page = await asyncio.to_thread(staff.action, "message", "requeue_messages", [first["id"]])
        assert "Requeued 1 messages." in notices(page)
        (again,) = await worker.deliveries(1)
        assert (again["id"], again["deliveries"]) == (first["id"], 1)
        assert (await worker.request({"op": "ack", "receipt": again["receipt"]}))["op"] == "acked"
    stats = await queue_stats(gateway, admin_token, queue)
    assert (stats["visible"], stats["in_flight"], stats["dead"]) == (0, 0, 0)
    (entry,) = logged(admin_log(gateway), "message", first["id"])
    assert entry["user"] == STAFF and entry["message"].startswith("Requeued")


async def test_requeue_and_purge_from_the_admin_while_workers_lease(
    gateway: GatewayProcess, admin_token: str, staff: StaffSession
) -> None:
    queue, total, delayed, held_n = unique("busy"), 300, 20, 5
    base = f"{gateway.http}/api/queues/{queue}/messages"
    status, body = await ahttp(
        "POST", base, admin_token, {"messages": [{"body": i} for i in range(total)]}
    )
    assert status == 200, body
    ready_ids = [r["id"] for r in body["results"]]
    # Delayed an hour: no worker can lease them, so the purge always has some to take.
    status, body = await ahttp(
        "POST", base, admin_token, {"messages": [{"body": "later", "delay": 3600}] * delayed}
    )
    assert status == 200, body
    delayed_ids = {r["id"] for r in body["results"]}
    everything = set(ready_ids) | delayed_ids
    assert len(everything) == total + delayed

    acks: Counter[str] = Counter()  # successful acks per message id
    stale: list[str] = []  # ids whose ack came back stale_receipt (requeued under a worker)
    holding: dict[str, str] = {}  # receipt -> id, leases the busy workers hold right now
    delivered: set[str] = set()  # ids delivered to the busy workers

    async def work(sock: Socket) -> None:
        while True:
            frame = await sock.next(timeout=3600)
            assert frame["op"] == "deliver", frame
            holding[frame["receipt"]] = frame["id"]
            delivered.add(frame["id"])
            await asyncio.sleep(0.005)  # the work
            reply = await sock.request({"op": "ack", "receipt": frame["receipt"]})
            holding.pop(frame["receipt"], None)
            if reply["op"] == "acked":
                acks[frame["id"]] += 1
            else:
                assert reply["code"] == "stale_receipt", reply
                stale.append(frame["id"])

    worker_url = f"{gateway.ws}/ws/queues/{queue}/"
    # A worker that takes the head of the queue and sits on it, with leases long
    # enough that only the operator can end them.
    holder = await Socket.open(
        f"{worker_url}?prefetch={held_n}&visibility_timeout=3600", admin_token
    )
    held = await holder.deliveries(held_n)
    assert [h["id"] for h in held] == ready_ids[:held_n]
    workers = [await Socket.open(f"{worker_url}?prefetch=10", admin_token) for _ in range(2)]
    tasks = [asyncio.create_task(work(w)) for w in workers]
    try:

        def workers_ok() -> None:
            for task in tasks:
                if task.done():
                    task.result()  # a worker that failed fails the test here

        async def some_acked() -> bool:
            workers_ok()
            return sum(acks.values()) >= 30

        await wait_until(some_acked, "the workers acking", timeout=120)
        # The operator requeues the held messages and a few the busy workers
        # hold at this moment (they may ack them first: then there is nothing
        # to requeue), while the workers keep leasing.
        busy = list(holding.values())[:5]
        chosen = [h["id"] for h in held] + busy
        page = await asyncio.to_thread(staff.action, "message", "requeue_messages", chosen)
        (requeued,) = [n for n in notices(page) if n.startswith("Requeued")]
        assert held_n <= int(requeued.split()[1]) <= len(chosen)

        # The holder's receipts went stale with the requeue: its acks change nothing.
        for h in held:
            reply = await holder.request({"op": "ack", "receipt": h["receipt"]})
            assert (reply["op"], reply.get("code")) == ("error", "stale_receipt"), reply
        tasks.append(asyncio.create_task(work(holder)))  # and now it works like the others

        # Purge while they lease: in-flight messages stay with their workers.
        page = await asyncio.to_thread(
            staff.action, "queue", "purge_queues", [staff.pk("queue", queue)]
        )
        (line,) = [n for n in notices(page) if n.lower().startswith(f"{queue}: purged")]
        purged = int(line.split()[2])
        assert purged >= delayed

        async def drained() -> bool:
            workers_ok()
            stats = await queue_stats(gateway, admin_token, queue)
            empty = not any(stats[k] for k in ("visible", "delayed", "in_flight", "dead"))
            return empty and not holding  # and every ack's reply is in

        await wait_until(drained, "every message acked or purged", timeout=120)
    finally:
        for task in tasks:
            task.cancel()
        for sock in [holder, *workers]:
            await sock.close()

    assert all(n == 1 for n in acks.values()), [i for i, n in acks.items() if n > 1]
    assert set(acks) <= set(ready_ids)  # the delayed ones were never due
    # Nothing vanished: each message was acked exactly once or purged, never both.
    assert len(acks) + purged == len(everything)
    # Only the operator's requeue took a lease from a worker: every other
    # delivered message was acked, none purged from under its worker.
    assert set(stale) <= set(chosen)
    assert delivered - set(acks) <= set(chosen)

    entries = admin_log(gateway)
    for message_id in [h["id"] for h in held]:
        (entry,) = logged(entries, "message", message_id)
        assert entry["user"] == STAFF and entry["message"].startswith("Requeued")
    (entry,) = logged(entries, "queue", staff.pk("queue", queue))
    assert entry["message"] == f"Purged {purged} messages (in-flight ones kept)."


async def test_redrive_delete_and_revoke_from_the_admin_are_in_the_admin_log(
    gateway: GatewayProcess, admin_token: str, staff: StaffSession
) -> None:
    queue = unique("audited")
    async with await Socket.open(f"{gateway.ws}/ws/queues/{queue}/?prefetch=1", admin_token) as w:
        assert (await w.request({"op": "enqueue", "body": "doomed"}))["op"] == "enqueued"
        (lease,) = await w.deliveries(1)
        assert (await w.request({"op": "reject", "receipt": lease["receipt"]}))["op"] == "rejected"
    assert (await queue_stats(gateway, admin_token, queue))["dead"] == 1
    queue_pk, message_id = staff.pk("queue", queue), lease["id"]

    # Redrive the queue: its dead message is visible again.
    page = await asyncio.to_thread(staff.action, "queue", "redrive_queues", [queue_pk])
    assert f"{queue}: redrove 1 dead messages.".lower() in [n.lower() for n in notices(page)]
    stats = await queue_stats(gateway, admin_token, queue)
    assert (stats["visible"], stats["dead"]) == (1, 0)

    # Delete it (the admin asks first; the second POST confirms).
    page = await asyncio.to_thread(staff.action, "message", "delete_selected", [message_id])
    assert "Are you sure you want to delete the selected message?" in page
    page = await asyncio.to_thread(
        staff.action, "message", "delete_selected", [message_id], confirm=True
    )
    assert "Successfully deleted 1 message." in notices(page)
    assert (await queue_stats(gateway, admin_token, queue))["visible"] == 0

    # Revoke a token (never used, so no gateway has it cached): it stops working.
    doomed_name = unique("doomed")
    doomed = gateway.issue_token("admin", name=doomed_name)
    token_pk = staff.pk("token", doomed_name)
    page = await asyncio.to_thread(staff.action, "token", "revoke_tokens", [token_pk])
    assert any(n.startswith("Revoked.") for n in notices(page))
    status, _ = await ahttp("GET", f"{gateway.http}/api/queues/{queue}", doomed)
    assert status == 401

    entries = admin_log(gateway)
    (redriven,) = logged(entries, "queue", queue_pk)
    assert redriven["message"] == "Redrove 1 dead messages."
    (deleted,) = logged(entries, "message", message_id)
    assert deleted["flag"] == DELETION
    (revoked,) = logged(entries, "token", token_pk)
    assert revoked["message"] == "Revoked."
    assert {e["user"] for e in (redriven, deleted, revoked)} == {STAFF}


async def test_topic_history_settings_from_the_admin_are_checked_and_applied(
    gateway: GatewayProcess, admin_token: str, staff: StaffSession
) -> None:
    topic = unique("tadmin")
    fields = [("name", topic), ("history_ttl", "60"), ("_save", "Save")]
    page = await asyncio.to_thread(
        staff.post, "/admin/gateway/topic/add/", [*fields, ("history_size", "-3")]
    )
    assert "errorlist" in page  # refused, nothing stored
    status, doc = await ahttp("GET", f"{gateway.http}/api/topics/{topic}", admin_token)
    assert status == 200 and doc["history_size"] == 0
    await asyncio.to_thread(
        staff.post, "/admin/gateway/topic/add/", [*fields, ("history_size", "50")]
    )
    # Applied on the gateway within GATEWAY_QUEUE_SETTINGS_TTL.
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        status, doc = await ahttp("GET", f"{gateway.http}/api/topics/{topic}", admin_token)
        if (doc["history_size"], doc["history_ttl"]) == (50, 60.0):
            break
        assert asyncio.get_running_loop().time() < deadline, doc
        await asyncio.sleep(0.2)

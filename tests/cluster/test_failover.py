"""PostgreSQL failover under load, on separate hosts: nothing confirmed is lost.

The deployment of tests/cluster/deploy.py with a standby: db1 is the
primary, db2 a streaming standby that every commit waits for
(``synchronous_standby_names = '*'``), and both gateways run on one
multi-host ``DATABASE_URL`` (``db1:5432,db2:5432`` with
``target_session_attrs=read-write``), as docs/operations.md describes.

Under steady load (two producers with an idempotency key per message, two
workers, all on the client host through haproxy), every process of the
primary's host is killed (``kill -9``), and a second later the standby is
promoted (``pg_promote()``), as a failover manager would. The ledger of what
the clients were told is then checked against what they received:

- every enqueue answered ``enqueued`` is delivered afterwards (lost: 0);
- no message whose ack was answered ``acked`` is delivered again;
- every answer during the switch is the right one or ``unavailable`` (an
  ack may also be ``stale_receipt``: its lease was taken back), never another;
- each gateway confirms work again by itself, without a restart.

Duplicates are counted and explained: a delivery whose lease commit did not
reach the standby (lease rounds commit without waiting for it, as losing one
loses nothing), or whose ack was answered ``unavailable``, is delivered
again. The unavailability window is measured and printed, never asserted on.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from tests.cluster.deploy import Deployment
from tests.cluster.services import open_socket, request
from tests.support.clients import Socket, unique

# Alone, after the parallel run: hosts, databases and Sentinels of their own.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

#: What an enqueue may be answered during a failover, and an ack.
ENQUEUE_ANSWERS = {"enqueued", "unavailable"}
ACK_ANSWERS = {"acked", "unavailable", "stale_receipt"}
#: Failures of a connection attempt while the deployment switches.
OPEN_FAILURES = (OSError, InvalidHandshake, TimeoutError)
LOST_SOCKET = (ConnectionError, ConnectionClosed, TimeoutError)


@dataclass
class Ledger:
    """What the clients were told and what they received, with the times of the answers."""

    #: key -> when its enqueue was answered ``enqueued``
    confirmed: dict[str, float] = field(default_factory=dict)
    #: id -> deliveries received
    delivered: Counter[str] = field(default_factory=Counter)
    #: id -> the ``deliveries`` count of the delivery whose ack was answered ``acked``
    acked: dict[str, int] = field(default_factory=dict)
    #: deliveries of a message after its ack was confirmed (an undone ack)
    undone: list[dict[str, Any]] = field(default_factory=list)
    #: answers by kind: ("enqueue", "enqueued"), ("ack", "stale_receipt")...
    answers: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: answers that are not allowed
    wrong: list[dict[str, Any]] = field(default_factory=list)
    #: (time the request was sent, time answered, kind, answer)
    events: list[tuple[float, float, str, str]] = field(default_factory=list)
    #: acks answered ``unavailable``, then ``stale_receipt`` when sent again: the first
    #: was applied after all (its commit reached the standby, its answer did not come)
    applied_unanswered: int = 0
    #: enqueues sent again with their key and answered ``duplicate``: the same story
    duplicates: int = 0
    refused_opens: int = 0
    closes: Counter[str] = field(default_factory=Counter)

    def answer(self, kind: str, sent: float, reply: dict[str, Any], allowed: set[str]) -> str:
        """Record a reply; returns ``op`` or the error's ``code``."""
        outcome = reply["op"] if reply["op"] != "error" else str(reply.get("code"))
        self.answers[kind, outcome] += 1
        self.events.append((sent, time.time(), kind, outcome))
        if outcome not in allowed:
            self.wrong.append({"kind": kind, **reply})
        return outcome


async def connect(d: Deployment, path: str, ledger: Ledger, stop: asyncio.Event) -> Socket | None:
    """A socket through haproxy from the client host, retried while the deployment switches."""
    while not stop.is_set():
        try:
            return await open_socket(d.client, f"{d.balancer.ws}{path}", d.token)
        except OPEN_FAILURES:
            ledger.refused_opens += 1
            await asyncio.sleep(0.1)
    return None


async def producer(
    d: Deployment, queue: str, name: str, ledger: Ledger, stop: asyncio.Event
) -> None:
    """Enqueues one at a time, each with its own key; one not confirmed is sent again."""
    n, pending = 0, None
    while not stop.is_set():
        s = await connect(d, "/ws/produce/", ledger, stop)
        if s is None:
            return
        try:
            while not stop.is_set():
                if pending is None:
                    pending, n = f"{name}-{n}", n + 1
                sent = time.time()
                frame = {"op": "enqueue", "queue": queue, "body": {"id": pending}, "key": pending}
                reply = await s.request(frame, timeout=15)
                if ledger.answer("enqueue", sent, reply, ENQUEUE_ANSWERS) == "enqueued":
                    ledger.confirmed[pending] = time.time()
                    ledger.duplicates += bool(reply.get("duplicate"))
                    pending = None
                else:  # unavailable: nothing applied, or applied and the key says so
                    await asyncio.sleep(0.05)
        except LOST_SOCKET:
            ledger.closes[f"producer {s.conn.close_code}"] += 1
        finally:
            await s.close()


async def worker(d: Deployment, queue: str, ledger: Ledger, done: asyncio.Event) -> None:
    """Acks every delivery; an ack answered ``unavailable`` is sent again (its lease stays)."""
    while not done.is_set():
        s = await connect(d, f"/ws/queues/{queue}/?prefetch=10&visibility_timeout=5", ledger, done)
        if s is None:
            return
        try:
            while not done.is_set():
                try:
                    frame = await s.next(timeout=0.2)
                except TimeoutError:
                    continue
                if frame["op"] != "deliver":
                    ledger.wrong.append({"kind": "unsolicited", **frame})
                    continue
                mid, count = frame["body"]["id"], frame["deliveries"]
                if mid in ledger.acked and count >= ledger.acked[mid]:
                    # Not an old frame overtaken by the ack: a lease taken after it.
                    ledger.undone.append(frame)
                ledger.delivered[mid] += 1
                retried = False
                while not done.is_set():
                    sent = time.time()
                    reply = await s.request({"op": "ack", "receipt": frame["receipt"]}, timeout=15)
                    outcome = ledger.answer("ack", sent, reply, ACK_ANSWERS)
                    if outcome == "acked":
                        ledger.acked[mid] = count
                    elif outcome == "stale_receipt" and retried:
                        ledger.applied_unanswered += 1
                    if outcome != "unavailable":
                        break
                    retried = True
                    await asyncio.sleep(0.05)
        except LOST_SOCKET:
            ledger.closes[f"worker {s.conn.close_code}"] += 1
        finally:
            await s.close()


async def queue_counts(d: Deployment, queue: str) -> dict[str, int]:
    status, stats = await request(d.client, "GET", f"{d.balancer.http}/api/queues/{queue}", d.token)
    if status != 200:
        return {}
    return {k: stats[k] for k in ("visible", "in_flight", "delayed", "dead")}


async def confirms_directly(d: Deployment, index: int, queue: str, timeout: float = 30) -> float:
    """Seconds until gateway ``index``, asked directly, confirms an enqueue."""
    gw = d.gateways[index]
    started = time.monotonic()
    deadline = started + timeout
    key = f"direct-{index}"
    while time.monotonic() < deadline:
        try:
            s = await open_socket(d.client, f"ws://{gw.host.address}:8000/ws/produce/", d.token)
        except OPEN_FAILURES:
            await asyncio.sleep(0.1)
            continue
        try:
            frame = {"op": "enqueue", "queue": queue, "body": {"id": key}, "key": key}
            if (await s.request(frame))["op"] == "enqueued":
                return time.monotonic() - started
        except LOST_SOCKET:
            pass
        finally:
            await s.close()
        await asyncio.sleep(0.1)
    raise AssertionError(f"{gw.host} never confirmed an enqueue after the failover:\n{d.logs()}")


def first_after(ledger: Ledger, moment: float, kind: str, outcome: str) -> float | None:
    """When the first ``outcome`` of a ``kind`` request sent after ``moment`` was answered."""
    times = [
        done for sent, done, k, o in ledger.events if k == kind and o == outcome and sent > moment
    ]
    return min(times) if times else None


async def test_primary_killed_and_standby_promoted_loses_nothing_confirmed(
    replicated: Deployment,
) -> None:
    d = replicated
    assert d.standby is not None
    queue = unique("failover")
    ledger = Ledger()
    stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
    workers = [asyncio.create_task(worker(d, queue, ledger, stop_consuming)) for _ in range(2)]
    producers = [
        asyncio.create_task(producer(d, queue, f"p{k}", ledger, stop_producing)) for k in range(2)
    ]
    try:
        deadline = time.monotonic() + 30
        while len(ledger.confirmed) < 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(ledger.confirmed) >= 200, f"the load never got going:\n{d.logs()}"
        confirmed_before = len(ledger.confirmed)
        # The primary's host dies: every PostgreSQL process on it, kill -9.
        await asyncio.to_thread(d.primary.host.kill_all)
        killed = time.time()  # from here on, no server accepts a write
        await asyncio.sleep(1.0)  # what a failover manager takes to decide, shortened
        promoting = time.time()
        promoted = await asyncio.to_thread(
            d.standby.query, "SELECT pg_promote(wait => true, wait_seconds => 30)"
        )
        assert promoted == [(True,)], promoted
        promoted_at = time.time()
        # Each gateway, asked directly, confirms again by itself (no restart).
        recovery = [await confirms_directly(d, i, unique("direct")) for i in range(2)]
        deadline = time.monotonic() + 30
        while len(ledger.confirmed) < confirmed_before + 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop_producing.set()
        await asyncio.wait_for(asyncio.gather(*producers), 30)
        # Drain: every confirmed message delivered and the queue empty (a
        # lease lost in the switch comes back after the 5 s visibility timeout).
        deadline = time.monotonic() + 40
        counts: dict[str, int] = {}
        while time.monotonic() < deadline:
            counts = await queue_counts(d, queue)
            if (
                set(ledger.confirmed) <= set(ledger.delivered)
                and counts
                and not any(counts[k] for k in ("visible", "in_flight", "delayed"))
            ):
                break
            await asyncio.sleep(0.2)
    finally:
        stop_producing.set()
        stop_consuming.set()
        await asyncio.wait_for(asyncio.gather(*producers, *workers, return_exceptions=True), 60)
    for task in [*producers, *workers]:
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

    lost = sorted(set(ledger.confirmed) - set(ledger.delivered))
    redelivered = sum(ledger.delivered.values()) - len(ledger.delivered)
    first_enqueue = first_after(ledger, killed, "enqueue", "enqueued")
    first_ack = first_after(ledger, killed, "ack", "acked")
    unavailable = [done for _, done, _, o in ledger.events if o == "unavailable"]

    def since(t: float | None) -> str:
        return "-" if t is None else f"{t - killed:.2f} s"

    summary = (
        f"{len(ledger.confirmed)} enqueues confirmed ({confirmed_before} before the kill), "
        f"{len(ledger.delivered)} distinct messages delivered, {len(ledger.acked)} acks "
        f"confirmed, {redelivered} redeliveries, {ledger.applied_unanswered} acks applied though "
        f"answered 'unavailable', {ledger.duplicates} enqueues sent again found by their key; "
        f"answers {dict(ledger.answers)}; "
        f"{ledger.refused_opens} refused socket opens; closes {dict(ledger.closes)}. "
        f"After the kill: promotion asked at {since(promoting)}, done at {since(promoted_at)}; "
        f"'unavailable' answered from {since(min(unavailable, default=None))} to "
        f"{since(max(unavailable, default=None))}; first enqueue confirmed at "
        f"{since(first_enqueue)}, first ack at {since(first_ack)}; each gateway asked "
        f"directly confirmed {', '.join(f'{r:.2f} s' for r in recovery)} after the promotion"
    )
    print(f"\nPostgreSQL failover: {summary}")
    assert not lost, f"confirmed, never delivered: {lost[:20]}; {summary}\n{d.logs()}"
    assert not ledger.undone, f"acked, then delivered again: {ledger.undone[:5]}; {summary}"
    assert not ledger.wrong, f"answers that are neither right nor unavailable: {ledger.wrong[:5]}"
    # The switch reached the clients as `unavailable`; nothing sent after the kill was
    # confirmed before a server could accept writes again, and work was confirmed after.
    assert ledger.answers["enqueue", "unavailable"] > 0, summary
    assert first_enqueue is not None and first_enqueue > promoting, summary
    assert counts == {"visible": 0, "in_flight": 0, "delayed": 0, "dead": 0}, (counts, summary)
    for gw in d.gateways:  # failures were answered, not crashed on
        assert "Traceback" not in gw.log_text(), gw.log_text()[-3000:]

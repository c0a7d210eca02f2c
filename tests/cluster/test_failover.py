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

import pytest

from tests.cluster.deploy import Deployment
from tests.cluster.load import (
    Ledger,
    confirms_directly,
    first_after,
    producer,
    queue_counts,
    worker,
)
from tests.support.clients import unique

# Alone, after the parallel run: hosts, databases and Sentinels of their own.
pytestmark = [pytest.mark.slow, pytest.mark.serial]


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

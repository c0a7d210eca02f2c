"""On SQLite the store's log is checkpointed by a thread of the gateway, not by its commits.

The store's connections turn SQLite's automatic checkpoint off (it ran inside
whichever commit took the log past 1,000 pages, and every operation queued
behind that commit waited for it), and ``gateway.engine.wal.WalCheckpointer``
copies the log back into the database file every two seconds. If that thread did
nothing, the ``-wal`` file would grow by everything the store ever wrote.

A Django connection that enqueues leaves the checkpoints to that thread too,
while a gateway process serves the file, and only then.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from django.db import connections

import gateway as leasecast
from gateway.engine.wal import INTERVAL
from tests.integration.test_workqueue import producer
from tests.support.clients import unique
from tests.support.databases import django_alias
from tests.support.gateways import sqlite_gateway

#: Each frame enqueues this many messages of BODY_BYTES.
PER_FRAME = 100
BODY_BYTES = 2000
FRAMES = 60  # about 12 MB of message bodies in all


async def test_the_log_stays_small_while_the_store_writes_megabytes() -> None:
    with sqlite_gateway("wal") as gateway:
        token = gateway.issue_token("admin", name="wal")
        wal = Path(gateway.env["GATEWAY_SQLITE_PATH"] + "-wal")
        p = await producer(gateway, token)
        queue = unique("wal")
        body = "x" * BODY_BYTES
        sizes: list[int] = []
        try:
            for frame in range(FRAMES):
                reply = await p.request(
                    {
                        "op": "enqueue_many",
                        "queue": queue,
                        "messages": [{"body": body}] * PER_FRAME,
                    }
                )
                assert reply["op"] == "enqueued_many", reply
                sizes.append(wal.stat().st_size)
                if frame % 10 == 9:  # a pause now and then, as real traffic has
                    await asyncio.sleep(INTERVAL * 1.5)
        finally:
            await p.close()
    written = FRAMES * PER_FRAME * BODY_BYTES
    # Checkpointed, the log is reused from its start: it stays near what the
    # writes between two pauses add, far below what they add in all.
    assert max(sizes) < written / 3, (max(sizes), written)


def autocheckpoint(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute("PRAGMA wal_autocheckpoint")
        (pages,) = cursor.fetchone()
    return int(pages)


def test_an_enqueue_through_django_leaves_checkpoints_to_the_gateway_while_one_serves() -> None:
    with sqlite_gateway("walcp") as gateway, django_alias(gateway.env, "walcp") as alias:
        own = autocheckpoint(alias)
        assert own > 0  # SQLite's default, 1,000 pages
        queue = unique("walcp")
        leasecast.enqueue(queue, {"n": 1}, using=alias)
        # The gateway's checkpointer does them: none inside this connection's commits.
        assert autocheckpoint(alias) == 0
        gateway.stop()
        # With no gateway on the file, the connection checkpoints again, as it
        # did (the first enqueue may still find the stopped process's socket).
        for n in (2, 3):
            leasecast.enqueue(queue, {"n": n}, using=alias)
        assert autocheckpoint(alias) == own
        gateway.start()
        leasecast.enqueue(queue, {"n": 4}, using=alias)
        assert autocheckpoint(alias) == 0

"""On SQLite the store's log is checkpointed by a thread of the gateway, not by its commits.

The store's connections turn SQLite's automatic checkpoint off (it ran inside
whichever commit took the log past 1,000 pages, and every operation queued
behind that commit waited for it), and ``gateway.engine.wal.WalCheckpointer``
copies the log back into the database file every two seconds. If that thread did
nothing, the ``-wal`` file would grow by everything the store ever wrote.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.engine.wal import INTERVAL
from tests.integration.test_workqueue import producer
from tests.support.clients import unique
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

"""The path of one message to an idle worker: the enqueue's commit carries its delivery.

Against a real daphne, once on SQLite and once on PostgreSQL (conftest.py).
Never a timing: the store's batch count shows the mechanism.
"""

from __future__ import annotations

from tests.support.clients import Socket, ahttp, unique
from tests.support.gateways import GatewayProcess


async def store_batches(gw: GatewayProcess, token: str) -> int:
    status, body = await ahttp("GET", f"{gw.http}/api/stats", token)
    assert status == 200, body
    return int(body["process"]["store_batches"])


async def test_an_idle_worker_gets_the_message_from_the_enqueues_transaction(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    async with (
        await Socket.open(f"{gateway.ws}/ws/queues/{q}/?prefetch=5", admin_token) as w,
        await Socket.open(f"{gateway.ws}/ws/produce/", admin_token) as p,
    ):
        await w.quiet(0.3)  # its first, empty lease round is done
        before = await store_batches(gateway, admin_token)  # counts its own batch
        reply = await p.request({"op": "enqueue", "queue": q, "body": "now"})
        assert reply["op"] == "enqueued", reply
        (delivery,) = await w.deliveries(1)
        assert delivery["body"] == "now"
        await w.quiet(0.3)  # a round after it would have run by now
        after = await store_batches(gateway, admin_token)
        # One batch for the enqueue and its lease round, one for the second
        # stats call: before, the round was a transaction of its own after the
        # enqueue's, and then another round looked again and found nothing.
        assert after - before == 2
        assert (await w.request({"op": "ack", "receipt": delivery["receipt"]}))["op"] == "acked"

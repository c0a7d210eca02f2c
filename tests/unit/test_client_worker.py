"""The Worker against a real WebSocket server that speaks enough of the protocol.

The server is :class:`tests.support.fake_gateway.FakeGateway`; the producer,
subscriber and CLI tests use it too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from leasecast import Delivery, EnqueueResult, Worker

from gateway.core.errors import (
    ConnectionClosed,
    Forbidden,
    Invalid,
    StaleReceipt,
    Unauthorized,
)
from tests.support.fake_gateway import TOKEN, FakeGateway, take


@pytest.fixture
async def gateway() -> AsyncIterator[FakeGateway]:
    async with FakeGateway() as gw:
        yield gw


# -- iteration and ending leases ----------------------------------------------


async def test_worker_iterates_and_ends_leases(gateway: FakeGateway) -> None:
    await gateway.put("jobs", "a", "b", "c", "d")
    async with Worker(gateway.http, "jobs", token=TOKEN, prefetch=4) as worker:
        deliveries = aiter(worker)
        a, b, c, d = await take(deliveries, 4)
        assert (a.queue, a.id, a.body, a.deliveries, a.expires_in) == ("jobs", "m1", "a", 1, 30.0)
        assert [x.body for x in (b, c, d)] == ["b", "c", "d"]

        assert await a.ack() == []
        await b.nack()
        await c.reject()
        assert await d.extend(90) == 90.0 and d.expires_in == 90.0
        assert await d.ack(enqueue=[{"body": "next"}, {"queue": "other", "body": "x"}]) == [
            EnqueueResult("m5", False),
            EnqueueResult("m6", False),
        ]
        again, follow_up = await take(deliveries, 2)
        assert (again.body, again.deliveries, again.id) == ("b", 2, b.id)
        assert follow_up.body == "next"
        await again.ack()
        await follow_up.ack()
    assert gateway.acked == ["a", "d", "b", "next"]
    assert gateway.dead == ["c"]
    assert [m.body for m in gateway.queues["other"]] == ["x"]
    # Every request carried its own ref, and the URL carried the parameters.
    refs = [f["ref"] for f in gateway.received]
    assert len(set(refs)) == len(refs)


def test_worker_url_carries_prefetch_and_visibility_timeout() -> None:
    worker = Worker("http://h:1", "emails.x", token=TOKEN, prefetch=3, visibility_timeout=7.5)
    assert worker.url == "ws://h:1/ws/queues/emails.x/?prefetch=3&visibility_timeout=7.5&batch=3"
    v1 = Worker("https://h", "q", token=TOKEN, batch=False)
    assert v1.url == "wss://h/ws/queues/q/?prefetch=10"


async def test_error_replies_raise_and_the_socket_stays_usable(gateway: FakeGateway) -> None:
    await gateway.put("jobs", 1, 2)
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=2) as worker:
        one, two = await take(worker, 2)
        await one.ack()
        with pytest.raises(StaleReceipt, match="not a current lease"):
            await one.ack()
        with pytest.raises(Invalid):
            await two.nack(delay=-1)
        with pytest.raises(Forbidden, match="enqueue:secret"):
            await two.ack(enqueue=[{"queue": "secret", "body": 0}])
        assert gateway.acked == [1]  # the refused ack changed nothing
        await two.ack()
        assert gateway.acked == [1, 2]
        assert worker.connected and gateway.handshakes == 1


async def test_replies_are_matched_by_ref_whatever_their_order(gateway: FakeGateway) -> None:
    await gateway.put("jobs", "slow", "fast", "third")
    gateway.reply_delays["ack"] = 0.3  # the ack's reply comes last
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=2) as worker:
        deliveries = aiter(worker)
        slow, fast = await take(deliveries, 2)
        acking = asyncio.create_task(slow.ack())
        await asyncio.sleep(0.01)  # the ack frame is out first
        await fast.reject()  # its reply overtakes the ack's
        assert not acking.done()
        # The gateway pushed the next delivery before answering the ack, too.
        (third,) = await take(deliveries, 1)
        assert third.body == "third"
        assert await acking == []
    ops = [f["op"] for f in gateway.sent]
    assert ops.index("rejected") < ops.index("acked")
    # The frame that carried "third" ("deliver", or a "deliveries" batch).
    bodies = [
        [f.get("body")] if f["op"] == "deliver" else [i["body"] for i in f.get("items", [])]
        for f in gateway.sent
    ]
    third_at = next(i for i, b in enumerate(bodies) if "third" in b)
    assert third_at < ops.index("acked")


async def test_many_concurrent_requests_each_get_their_own_reply(gateway: FakeGateway) -> None:
    await gateway.put("jobs", *range(20))
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=20) as worker:
        got = await take(worker, 20)
        await got[3].ack()  # so acking it again is stale, in the middle of the rest
        results = await asyncio.gather(*(d.extend(d.body + 1) for d in got), return_exceptions=True)
    assert isinstance(results[3], StaleReceipt)
    assert [r for i, r in enumerate(results) if i != 3] == [
        float(i + 1) for i in range(20) if i != 3
    ]


async def test_frames_that_are_not_json_objects_are_ignored(gateway: FakeGateway) -> None:
    gateway.noise = True
    await gateway.put("jobs", {"n": 1})
    async with Worker(gateway.ws, "jobs", token=TOKEN) as worker:
        (delivery,) = await take(worker, 1)
        assert delivery.body == {"n": 1}
        await delivery.ack()


async def test_worker_enqueue_to_its_own_queue_and_others(gateway: FakeGateway) -> None:
    async with Worker(gateway.ws, "jobs", token=TOKEN) as worker:
        first = await worker.enqueue({"n": 1}, key="k")
        assert first == EnqueueResult("m1", False)
        assert await worker.enqueue({"n": 1}, key="k") == EnqueueResult("m1", True)
        await worker.enqueue("elsewhere", queue="other", delay=5)
        with pytest.raises(Forbidden):
            await worker.enqueue(1, queue="secret")
        (delivery,) = await take(worker, 1)
        assert delivery.body == {"n": 1}
    assert [m.body for m in gateway.queues["other"]] == ["elsewhere"]


# -- protocol 1.1: group, priority, ttl ------------------------------------------


async def test_deliveries_carry_group_and_priority_when_the_message_has_them(
    gateway: FakeGateway,
) -> None:
    await gateway.put("jobs", "plain")
    await gateway.put("jobs", "grouped", group="order-7")
    await gateway.put("jobs", "urgent", priority=-100)
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=3) as worker:
        plain, grouped, urgent = await take(worker, 3)
    assert (plain.group, plain.priority) == (None, 0)
    assert (grouped.group, grouped.priority) == ("order-7", 0)
    assert (urgent.group, urgent.priority) == (None, -100)
    # What the gateway sent: the fields only on the messages that have them.
    sent = [f for f in gateway.sent if f["op"] == "deliver"]
    sent += [item for f in gateway.sent if f["op"] == "deliveries" for item in f["items"]]
    assert ["group" in f for f in sent] == [False, True, False]
    assert ["priority" in f for f in sent] == [False, True, True]
    assert "group='order-7'" in repr(grouped) and "priority=-100" in repr(urgent)


async def test_worker_enqueue_and_ack_follow_ups_send_group_priority_ttl(
    gateway: FakeGateway,
) -> None:
    async with Worker(gateway.ws, "jobs", token=TOKEN) as worker:
        await worker.enqueue("v1")
        await worker.enqueue("v1.1", queue="other", group="g", priority=7, ttl=60)
        (delivery,) = await take(worker, 1)
        follow_ups = [
            {"body": "next", "group": "g", "priority": -3, "ttl": 0.5},
            {"queue": "other", "body": "plain"},
        ]
        assert len(await delivery.ack(enqueue=follow_ups)) == 2
        with pytest.raises(Invalid, match="priority"):
            await worker.enqueue("x", priority=101)  # the gateway's answer, not the client's
        with pytest.raises(Invalid, match="ttl"):
            await worker.enqueue("x", ttl=0)
    frames = [f for f in gateway.received if f["op"] in ("enqueue", "ack")]
    # A v1 call sends the v1 frame: no field of 1.1, not even a default.
    assert frames[0] == {"op": "enqueue", "body": "v1", "delay": 0, "ref": frames[0]["ref"]}
    assert {k: frames[1][k] for k in ("queue", "group", "priority", "ttl")} == {
        "queue": "other",
        "group": "g",
        "priority": 7,
        "ttl": 60,
    }
    assert frames[2]["enqueue"] == follow_ups
    stored = {m.body: m for msgs in gateway.queues.values() for m in msgs}
    assert (stored["next"].group, stored["next"].priority, stored["next"].ttl) == ("g", -3, 0.5)
    assert (stored["plain"].group, stored["plain"].priority) == (None, 0)
    assert "x" not in stored


# -- refusals -------------------------------------------------------------------


async def test_a_refused_handshake_raises_at_once(gateway: FakeGateway) -> None:
    with pytest.raises(Unauthorized, match="HTTP 403"):
        async with Worker(gateway.ws, "jobs", token="lc_wrong"):
            pass
    assert gateway.handshakes == 1


async def test_a_forbidden_queue_raises_the_stated_error_without_retrying(
    gateway: FakeGateway,
) -> None:
    async with Worker(gateway.ws, "secret", token=TOKEN, backoff_initial=0.01) as worker:
        with pytest.raises(Forbidden, match="no secret"):
            await take(worker, 1)
        with pytest.raises(Forbidden):  # and again: the refusal is final
            await take(worker, 1)
    assert gateway.handshakes == 1


async def test_invalid_parameters_and_a_bare_4403_are_final_too(gateway: FakeGateway) -> None:
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=0) as worker:
        with pytest.raises(Invalid, match="prefetch"):
            await take(worker, 1)
    async with Worker(gateway.ws, "silent", token=TOKEN) as worker:
        with pytest.raises(Forbidden, match="4403"):
            await take(worker, 1)
    assert gateway.handshakes == 2


async def test_an_unreachable_gateway_fails_fast_on_open() -> None:
    async with FakeGateway() as gw:
        url = gw.ws
    with pytest.raises(ConnectionClosed, match="cannot connect"):
        async with Worker(url, "jobs", token=TOKEN):
            pass


# -- dropped sockets and reconnecting -------------------------------------------


async def test_worker_reconnects_after_a_drop_and_old_receipts_are_stale(
    gateway: FakeGateway,
) -> None:
    await gateway.put("jobs", "x", "y")
    worker = Worker(gateway.ws, "jobs", token=TOKEN, prefetch=1, backoff_initial=0.01)
    async with worker:
        deliveries = aiter(worker)
        (x,) = await take(deliveries, 1)
        gateway.drop()
        # The gateway released the lease with the socket: x comes again.
        (again,) = await take(deliveries, 1)
        assert (again.body, again.id, again.deliveries) == ("x", x.id, 2)
        assert worker.reconnects == 1 and gateway.handshakes == 2
        with pytest.raises(StaleReceipt, match="released"):
            await x.ack()
        await again.ack()
        (y,) = await take(deliveries, 1)
        await y.ack()
    assert gateway.acked == ["x", "y"]


async def test_reconnect_retries_transient_refusals_with_growing_delays(
    gateway: FakeGateway,
) -> None:
    await gateway.put("jobs", "x")
    worker = Worker(gateway.ws, "jobs", token=TOKEN, backoff_initial=0.02, backoff_max=0.08)
    async with worker:
        deliveries = aiter(worker)
        await take(deliveries, 1)
        gateway.refuse_handshakes = 3  # HTTP 503 three times, then accepted
        started = time.monotonic()
        gateway.drop()
        (again,) = await take(deliveries, 1)
        # Four delays of at least half of 0.02, 0.04, 0.08, 0.08.
        assert time.monotonic() - started >= 0.11
        assert again.deliveries == 2 and worker.reconnects == 1
        assert gateway.handshakes == 5


async def test_a_token_revoked_while_disconnected_stops_reconnecting(
    gateway: FakeGateway,
) -> None:
    await gateway.put("jobs", "x")
    async with Worker(gateway.ws, "jobs", token=TOKEN, backoff_initial=0.01) as worker:
        deliveries = aiter(worker)
        await take(deliveries, 1)
        gateway.token = "lc_rotated"
        gateway.drop()
        with pytest.raises(Unauthorized):
            await take(deliveries, 1)
    assert gateway.handshakes == 2


async def test_without_reconnect_a_drop_raises_connection_closed(gateway: FakeGateway) -> None:
    await gateway.put("jobs", "x")
    async with Worker(gateway.ws, "jobs", token=TOKEN, reconnect=False) as worker:
        deliveries = aiter(worker)
        (x,) = await take(deliveries, 1)
        gateway.drop()
        with pytest.raises(ConnectionClosed):
            await take(deliveries, 1)
        with pytest.raises(StaleReceipt):
            await x.nack()
    assert gateway.handshakes == 1


async def test_a_request_in_flight_when_the_socket_drops_raises_connection_closed(
    gateway: FakeGateway,
) -> None:
    await gateway.put("jobs", "x")
    gateway.drop_on = lambda frame: frame.get("op") == "ack"
    async with Worker(gateway.ws, "jobs", token=TOKEN, backoff_initial=0.01) as worker:
        deliveries = aiter(worker)
        (x,) = await take(deliveries, 1)
        with pytest.raises(ConnectionClosed):
            await x.ack()
        gateway.drop_on = lambda frame: False
        (again,) = await take(deliveries, 1)
        assert again.deliveries == 2
        # enqueue() shares the reopened socket.
        await worker.enqueue("more")
        assert worker.reconnects == 1 and gateway.handshakes == 2


async def test_close_interrupts_a_reconnect_in_its_backoff(gateway: FakeGateway) -> None:
    await gateway.put("jobs", "x")
    worker = Worker(gateway.ws, "jobs", token=TOKEN, backoff_initial=4.0, backoff_max=4.0)
    await worker.connect()
    deliveries = aiter(worker)
    await take(deliveries, 1)
    gateway.drop()
    consuming = asyncio.create_task(take(deliveries, 1))
    await asyncio.sleep(0.05)  # now asleep in the first backoff delay (2 to 4 s)
    started = time.monotonic()
    await worker.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(consuming, 1)
    assert time.monotonic() - started < 0.5
    assert gateway.handshakes == 1
    with pytest.raises(ConnectionClosed, match="closed"):
        await worker.enqueue(1)


async def test_iterating_without_async_with_connects_on_first_use(gateway: FakeGateway) -> None:
    await gateway.put("jobs", "x")
    worker = Worker(gateway.ws, "jobs", token=TOKEN)
    try:
        (x,) = await take(worker, 1)
        await x.ack()
    finally:
        await worker.close()
    assert gateway.handshakes == 1 and worker.reconnects == 0


def test_delivery_repr_hides_the_socket() -> None:
    fields = Delivery.__dataclass_fields__
    assert set(fields) == {
        "queue",
        "id",
        "receipt",
        "body",
        "deliveries",
        "expires_in",
        "group",
        "priority",
        "cancelled",
        "_link",
        "_acks",
    }
    assert not fields["_link"].repr
    assert not fields["cancelled"].repr

"""The fast path and the 1.1 client features against the in-test gateway of ``test_client_worker``.

Batched deliveries, acks coalesced into ``ack_many`` and enqueues into
``enqueue_many`` (each caller still gets its own answer), ``retry_after`` on
``backpressure``, signed-token ``refresh`` and the 4401 close.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from leasecast import EnqueueResult, Producer, Worker
from leasecast.batching import Pending
from leasecast.errors import Backpressure, Invalid, StaleReceipt, TokenExpired
from leasecast.link import BACKPRESSURE_RETRIES

from tests.support.fake_gateway import TOKEN, FakeGateway, take
from tests.support.tokens import unsigned


@pytest.fixture
async def gateway() -> AsyncIterator[FakeGateway]:
    async with FakeGateway() as gw:
        yield gw


def ops(gateway: FakeGateway) -> list[str]:
    return [f["op"] for f in gateway.received]


# -- worker ----------------------------------------------------------------------


async def test_deliveries_come_in_batches_and_concurrent_acks_in_one_frame(
    gateway: FakeGateway,
) -> None:
    await gateway.put("jobs", *range(5))
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=5) as worker:
        got = await take(worker, 5)
        assert [d.body for d in got] == list(range(5))
        assert await asyncio.gather(*(d.ack() for d in got)) == [[]] * 5
    assert gateway.paths == ["/ws/queues/jobs/?prefetch=5&batch=5"]
    assert [f["op"] for f in gateway.sent if "items" in f] == ["deliveries"]
    assert ops(gateway) == ["ack_many"]
    assert gateway.received[0]["receipts"] == [d.receipt for d in got]
    assert gateway.acked == list(range(5))


async def test_a_lone_ack_is_a_plain_ack(gateway: FakeGateway) -> None:
    await gateway.put("jobs", "a", "b")
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=2) as worker:
        a, b = await take(worker, 2)
        await a.ack()
        await b.ack()
    assert ops(gateway) == ["ack", "ack"]


async def test_a_stale_receipt_in_a_batch_fails_only_its_caller(gateway: FakeGateway) -> None:
    await gateway.put("jobs", *range(4))
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=4) as worker:
        got = await take(worker, 4)
        await got[1].reject()  # its receipt is stale from now on
        results = await asyncio.gather(*(d.ack() for d in got), return_exceptions=True)
    assert results[0] == results[2] == results[3] == []
    assert isinstance(results[1], StaleReceipt)
    # The batch, then the stale one asked on its own (the gateway's exact answer).
    assert ops(gateway) == ["reject", "ack_many", "ack"]
    assert gateway.acked == [0, 2, 3]


async def test_a_gateway_without_ack_many_gets_plain_acks(gateway: FakeGateway) -> None:
    gateway.ack_many_op = False
    await gateway.put("jobs", *range(6))
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=3) as worker:
        first = await take(worker, 3)
        await asyncio.gather(*(d.ack() for d in first))
        second = await take(worker, 3)
        await asyncio.gather(*(d.ack() for d in second))
    # Refused once (nothing applied), acked one by one; then never asked again.
    assert ops(gateway) == ["ack_many"] + ["ack"] * 6
    assert sorted(gateway.acked) == list(range(6))


async def test_batch_false_speaks_v1_only(gateway: FakeGateway) -> None:
    await gateway.put("jobs", *range(3))
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=3, batch=False) as worker:
        got = await take(worker, 3)
        await asyncio.gather(*(d.ack() for d in got))
    assert gateway.paths == ["/ws/queues/jobs/?prefetch=3"]
    assert {f["op"] for f in gateway.sent if "receipt" in f} == {"deliver"}
    assert ops(gateway) == ["ack"] * 3


async def test_acks_after_a_drop_are_stale_without_asking(gateway: FakeGateway) -> None:
    await gateway.put("jobs", 1, 2)
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=2) as worker:
        got = await take(worker, 2)
        gateway.drop()
        await asyncio.sleep(0.05)
        results = await asyncio.gather(*(d.ack() for d in got), return_exceptions=True)
    assert all(isinstance(r, StaleReceipt) for r in results)
    assert ops(gateway) == []


# -- producer --------------------------------------------------------------------


async def test_concurrent_enqueues_share_an_enqueue_many(gateway: FakeGateway) -> None:
    async with Producer(gateway.ws, token=TOKEN) as producer:
        results = await asyncio.gather(
            producer.enqueue("q", "a", key="k-a"),
            producer.enqueue("q", "b", group="g", priority=5, ttl=60),
            producer.enqueue("other", "c", delay=1),
        )
        again = await producer.enqueue("q", "a", key="k-a")
    assert results == [EnqueueResult("m1", False), EnqueueResult("m2", False), results[2]]
    assert again == EnqueueResult("m1", True)
    assert ops(gateway) == ["enqueue_many", "enqueue", "enqueue"]
    many = gateway.received[0]
    assert many["queue"] == "q"
    assert many["messages"] == [
        {"body": "a", "delay": 0, "key": "k-a"},
        {"body": "b", "delay": 0, "group": "g", "priority": 5, "ttl": 60},
    ]
    stored = [(m.body, m.group, m.priority, m.ttl) for m in gateway.queues["q"]]
    assert stored == [("a", None, 0, None), ("b", "g", 5, 60)]


async def test_one_bad_message_fails_only_its_caller(gateway: FakeGateway) -> None:
    async with Producer(gateway.ws, token=TOKEN) as producer:
        results = await asyncio.gather(
            producer.enqueue("q", 1),
            producer.enqueue("q", 2, ttl=-1),
            producer.enqueue("q", 3),
            return_exceptions=True,
        )
    assert isinstance(results[1], Invalid) and "ttl" in str(results[1])
    assert isinstance(results[0], EnqueueResult) and isinstance(results[2], EnqueueResult)
    # The batch was refused whole (nothing applied), then each message went alone.
    assert ops(gateway) == ["enqueue_many", "enqueue", "enqueue", "enqueue"]
    assert [m.body for m in gateway.queues["q"]] == [1, 3]


async def test_a_v1_gateway_gets_single_enqueues() -> None:
    async with FakeGateway(batch_op=False) as gateway:
        async with Producer(gateway.ws, token=TOKEN) as producer:
            await asyncio.gather(*(producer.enqueue("q", i) for i in range(3)))
            await asyncio.gather(*(producer.enqueue("q", i) for i in range(3, 5)))
        assert ops(gateway) == ["enqueue_many"] + ["enqueue"] * 5
        assert [m.body for m in gateway.queues["q"]] == list(range(5))


async def test_a_producer_closed_with_calls_in_flight_answers_them(gateway: FakeGateway) -> None:
    producer = Producer(gateway.ws, token=TOKEN)
    await producer.__aenter__()
    calls = [asyncio.ensure_future(producer.enqueue("q", i)) for i in range(3)]
    await asyncio.sleep(0)
    await producer.close()
    assert [(await c).id for c in calls] == ["m1", "m2", "m3"]


# -- backpressure with retry_after -------------------------------------------------


async def test_backpressure_with_retry_after_is_retried(gateway: FakeGateway) -> None:
    gateway.rate_limited = 2
    async with Producer(gateway.ws, token=TOKEN, batch=False) as producer:
        assert (await producer.enqueue("q", "x")).id == "m1"
    assert ops(gateway) == ["enqueue"] * 3
    assert [m.body for m in gateway.queues["q"]] == ["x"]


async def test_backpressure_retries_are_bounded(gateway: FakeGateway) -> None:
    gateway.rate_limited = 100
    async with Producer(gateway.ws, token=TOKEN) as producer:
        with pytest.raises(Backpressure) as caught:
            await producer.enqueue("q", "x")
    assert caught.value.retry_after == 0.01
    assert ops(gateway) == ["enqueue"] * (BACKPRESSURE_RETRIES + 1)
    assert not gateway.queues["q"]


async def test_backpressure_without_retry_after_is_raised_at_once(gateway: FakeGateway) -> None:
    gateway.rate_limited, gateway.retry_after = 1, None
    await gateway.put("jobs", "a")
    async with Worker(gateway.ws, "jobs", token=TOKEN) as worker:
        (a,) = await take(worker, 1)
        with pytest.raises(Backpressure) as caught:
            await a.ack()
        assert caught.value.retry_after is None
        await a.ack()  # the lease is still held: nothing was applied
    assert ops(gateway) == ["ack", "ack"]


async def test_enqueue_many_chunks_refused_for_rate_are_sent_again(gateway: FakeGateway) -> None:
    gateway.rate_limited = 1
    async with Producer(gateway.ws, token=TOKEN) as producer:
        results = await producer.enqueue_many("q", [{"body": i} for i in range(3)])
    assert [r.id for r in results] == ["m1", "m2", "m3"]
    assert ops(gateway) == ["enqueue_many", "enqueue_many"]


# -- signed tokens: refresh and 4401 ------------------------------------------------


async def test_a_signed_token_is_refreshed_before_it_expires(gateway: FakeGateway) -> None:
    issued: list[str] = []

    async def mint() -> str:
        # A fresh token each time, 2 s of life (so the refresh comes after 1 s),
        # which the fake gateway accepts.
        token = unsigned({"sub": "ada", "exp": time.time() + 2, "n": len(issued)})
        issued.append(token)
        gateway.tokens.add(token)
        return token

    gateway.refresh_expires_in = 2.0
    async with Producer(gateway.ws, token=mint) as producer:
        await producer.enqueue("q", 1)
        deadline = asyncio.get_running_loop().time() + 10
        while ops(gateway).count("refresh") < 2:
            assert asyncio.get_running_loop().time() < deadline, "never refreshed twice"
            await asyncio.sleep(0.05)
        await producer.enqueue("q", 2)  # the same socket goes on
    refreshes = [f["token"] for f in gateway.received if f["op"] == "refresh"]
    # Asked afresh each time, never the connection's token again.
    assert refreshes == issued[1:3]
    assert gateway.handshakes == 1


async def test_a_refused_refresh_stops_refreshing(gateway: FakeGateway) -> None:
    def mint() -> str:
        token = unsigned({"sub": "ada", "exp": time.time() + 1})
        gateway.tokens.add(token)
        return token

    gateway.refresh_expires_in = None  # forbidden
    async with Producer(gateway.ws, token=mint) as producer:
        await producer.enqueue("q", 1)
        deadline = asyncio.get_running_loop().time() + 10
        while "refresh" not in ops(gateway):
            assert asyncio.get_running_loop().time() < deadline, "never refreshed"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.7)
        await producer.enqueue("q", 2)  # the socket is still usable
    assert ops(gateway).count("refresh") == 1


async def test_a_static_token_is_never_refreshed(gateway: FakeGateway) -> None:
    token = unsigned({"sub": "ada", "exp": time.time() + 1})
    gateway.tokens.add(token)
    async with Producer(gateway.ws, token=token) as producer:
        await producer.enqueue("q", 1)
        await asyncio.sleep(0.7)  # past the moment a callable would be asked
        await producer.enqueue("q", 2)
    assert "refresh" not in ops(gateway)


async def test_close_4401_reconnects_with_a_fresh_token(gateway: FakeGateway) -> None:
    tokens = iter(["tok-1", "tok-2", "tok-3"])
    gateway.tokens.update({"tok-1", "tok-2"})
    await gateway.put("jobs", "a")
    async with Worker(gateway.ws, "jobs", token=lambda: next(tokens), prefetch=1) as worker:
        deliveries = aiter(worker)
        (a,) = await take(deliveries, 1)
        gateway.tokens.discard("tok-1")  # expired
        await gateway.close_sockets(4401)
        with pytest.raises(StaleReceipt):
            await a.ack()
        (again,) = await take(deliveries, 1)  # the same message, on the new socket
        assert again.id == a.id and again.deliveries == 2
        await again.ack()
        assert worker.reconnects == 1
    assert gateway.handshakes == 2


async def test_4401_is_token_expired_and_not_final() -> None:
    assert issubclass(TokenExpired, Exception)
    from leasecast.link import permanent

    assert not permanent(TokenExpired("expired"))


async def test_acks_flushed_after_their_socket_closed_are_stale(gateway: FakeGateway) -> None:
    await gateway.put("jobs", 1)
    async with Worker(gateway.ws, "jobs", token=TOKEN) as worker:
        (delivery,) = await take(worker, 1)
        link = worker._link
        assert link is not None
        await link.close()  # closed between the ack being asked and its flush
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await worker._flush_acks(link, [Pending(delivery.receipt, future)])
        with pytest.raises(StaleReceipt):
            future.result()
    assert "ack" not in ops(gateway)

"""The Python client and the ``leasecast`` console script against a real gateway.

Besides v1 behaviour: the fast path (batched deliveries, ``ack_many`` and
``enqueue_many`` coalescing, each caller with its own answer), ``retry_after``
on a token over its rate, signed-token refresh and the 4401 close, and
Subscriber resume across a forced disconnect (when the gateway keeps topic
history).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from leasecast import EnqueueResult, Producer, Subscriber, Worker
from leasecast.link import Link, name_path, ws_url

from gateway.core.errors import Forbidden, ProtocolError, StaleReceipt, Unauthorized
from tests.support.clients import Socket, ahttp, run_cli, unique
from tests.support.gateways import GatewayProcess
from tests.support.waiting import wait_until


async def test_worker_iterates_and_ends_leases(gateway: GatewayProcess, admin_token: str) -> None:
    q, follow = unique(), unique("follow")
    async with Producer(gateway.http, token=admin_token) as producer:
        first = await producer.enqueue(q, {"n": 1}, key="k1")
        again = await producer.enqueue(q, {"n": 1}, key="k1")
        assert again == EnqueueResult(first.id, duplicate=True)
        await producer.enqueue_many(q, [{"body": {"n": i}} for i in range(2, 5)])
    seen = []
    async with Worker(gateway.ws, q, token=admin_token, prefetch=4) as worker:
        async for delivery in worker:
            seen.append((delivery.body["n"], delivery.deliveries))
            n = delivery.body["n"]
            if n == 1:
                assert 29 < await delivery.extend(60) <= 60
                enqueued = await delivery.ack(enqueue=[{"queue": follow, "body": "next"}])
                assert enqueued[0].duplicate is False
                with pytest.raises(StaleReceipt):
                    await delivery.ack()
            elif n == 2 and delivery.deliveries == 1:
                await delivery.nack()
            elif n == 3:
                await delivery.reject()
            else:
                await delivery.ack()
            if len(seen) == 5:
                break
    assert sorted(seen) == [(1, 1), (2, 1), (2, 2), (3, 1), (4, 1)]


async def test_producer_reports_refusals(gateway: GatewayProcess) -> None:
    token = gateway.issue_token("enqueue:mine.*", name="mine")
    async with Producer(gateway.ws, token=token) as producer:
        with pytest.raises(Forbidden):
            await producer.enqueue("theirs", 1)
        with pytest.raises(Forbidden):
            await producer.publish("prices", 1)  # no publish scope
        assert (await producer.enqueue("mine.x", 1)).duplicate is False


async def test_bad_token_and_forbidden_queue_raise_without_retrying(
    gateway: GatewayProcess,
) -> None:
    with pytest.raises(Unauthorized):
        async with Worker(gateway.ws, "q", token="lc_nope"):
            pass
    token = gateway.issue_token("consume:mine", name="narrow")
    async with Worker(gateway.ws, "not-mine", token=token) as worker:
        with pytest.raises(Forbidden):
            async for _ in worker:
                pass


async def test_worker_reconnects_after_the_gateway_restarts(
    own_gateway: GatewayProcess,
) -> None:
    token = own_gateway.issue_token("admin", name="restart")
    q = unique()
    # An hour-long lease: "before" stays leased to the dead socket for the whole
    # test, so what the reconnected worker gets next is known exactly.
    worker = Worker(own_gateway.ws, q, token=token, visibility_timeout=3600, backoff_initial=0.05)
    async with worker:
        deliveries = aiter(worker)
        async with Producer(own_gateway.ws, token=token) as producer:
            before = await producer.enqueue(q, "before")
        held = await asyncio.wait_for(anext(deliveries), 10)
        assert (held.body, held.id, held.deliveries) == ("before", before.id, 1)
        own_gateway.kill()
        own_gateway.start()  # same port, same database
        async with Producer(own_gateway.ws, token=token) as producer:
            after = await producer.enqueue(q, "after")
        got = await asyncio.wait_for(anext(deliveries), 60)
        assert (got.body, got.id, got.deliveries) == ("after", after.id, 1)
        assert worker.reconnects == 1
        await got.ack()
        with pytest.raises(StaleReceipt):
            await held.ack()  # its socket died with the gateway
    # "before" is not lost: still leased (to the dead socket) until its timeout.
    status, stats = await ahttp("GET", f"{own_gateway.http}/api/queues/{q}", token)
    assert status == 200
    assert (stats["visible"], stats["in_flight"], stats["delayed"], stats["dead"]) == (0, 1, 0, 0)


async def test_subscriber_reconnects_after_the_gateway_restarts(
    own_gateway: GatewayProcess,
) -> None:
    token = own_gateway.issue_token("admin", name="restart-sub")
    topic = unique("t")
    subscriber = Subscriber(
        own_gateway.ws, topic, token=token, backoff_initial=0.05, backoff_max=0.5
    )
    async with subscriber:
        messages = aiter(subscriber)
        async with Producer(own_gateway.ws, token=token) as producer:
            await producer.publish(topic, "before")
        first = await asyncio.wait_for(anext(messages), 10)
        assert (first.body, first.seq) == ("before", 1)
        own_gateway.kill()
        own_gateway.start()  # same port
        # Iterating drives the reconnect; nobody calls anything else on the subscriber.
        waiting = asyncio.ensure_future(anext(messages))
        await wait_until(
            lambda: subscriber.reconnects == 1 or waiting.done(), "the subscriber reconnected"
        )
        assert not waiting.done(), waiting  # nothing was published yet: nothing to yield
        # Topics are not durable: what is published once it is back reaches it,
        # in order, on a fresh stream (seq starts again at 1).
        async with Producer(own_gateway.ws, token=token) as producer:
            for body in ("after-1", "after-2"):
                await producer.publish(topic, body)
        got = [await asyncio.wait_for(waiting, 10), await asyncio.wait_for(anext(messages), 10)]
        assert [(m.body, m.seq) for m in got] == [("after-1", 1), ("after-2", 2)]
        assert (subscriber.reconnects, subscriber.dropped) == (1, 0)


async def test_subscriber_reconnects_after_the_gateway_drops_its_socket(
    gateway: GatewayProcess, admin_token: str
) -> None:
    topic = unique("t")
    async with (
        Subscriber(gateway.ws, topic, token=admin_token, backoff_initial=0.05) as subscriber,
        Producer(gateway.ws, token=admin_token) as producer,
        await Socket.open(f"{gateway.ws}/ws/dashboard/", admin_token) as dashboard,
    ):
        messages = aiter(subscriber)
        await producer.publish(topic, "before")
        assert (await asyncio.wait_for(anext(messages), 10)).body == "before"
        # An operator disconnects the subscriber's socket (close 4000) from the dashboard.
        target = None
        while target is None:
            snapshot = await dashboard.next(timeout=10)
            target = next(
                (
                    (process["name"], s["id"])
                    # other frames (the dashboard's "history") have no processes
                    for process in snapshot.get("processes", [])
                    for s in process["sockets"]
                    if s.get("topic") == topic
                ),
                None,
            )
        reply = await dashboard.request(
            {"op": "disconnect", "process": target[0], "socket": target[1]}
        )
        assert reply["op"] == "disconnected"
        waiting = asyncio.ensure_future(anext(messages))
        await wait_until(
            lambda: subscriber.reconnects == 1 or waiting.done(), "the subscriber reconnected"
        )
        assert not waiting.done(), waiting
        await producer.publish(topic, "after")
        got = await asyncio.wait_for(waiting, 10)
        assert (got.body, got.seq) == ("after", 1)  # a new socket, a new stream
        assert subscriber.reconnects == 1


def test_cli_enqueue_consume_stats(gateway: GatewayProcess, admin_token: str) -> None:
    q = unique()
    code, out, err = run_cli(gateway, admin_token, "enqueue", q, '{"a": 1}', "-", stdin="2\n\n3\n")
    assert code == 0, err
    assert [json.loads(line)["duplicate"] for line in out.splitlines()] == [False] * 3
    code, out, err = run_cli(gateway, admin_token, "consume", q, "--count", "3")
    assert code == 0, err
    assert [json.loads(line)["body"] for line in out.splitlines()] == [{"a": 1}, 2, 3]
    code, out, _ = run_cli(gateway, admin_token, "stats", q)
    assert code == 0 and json.loads(out)["visible"] == 0


def test_cli_errors_are_clear(gateway: GatewayProcess) -> None:
    code, _, err = run_cli(gateway, None, "stats")
    assert code == 2 and "no token" in err
    code, _, err = run_cli(gateway, "lc_wrong", "stats", "x")
    assert code == 1 and "unauthorized" in err
    code, _, err = run_cli(gateway, "lc_wrong", "enqueue", "q", "{not json")
    assert code == 2 and "not JSON" in err
    narrow = gateway.issue_token("enqueue:a", name="cli-narrow")
    code, _, err = run_cli(gateway, narrow, "enqueue", "b", "1")
    assert code == 1 and "forbidden" in err


# -- the fast path (issue 14 item 2) ---------------------------------------------------


async def test_the_fast_path_coalesces_and_each_caller_gets_its_own_answer(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("fast")
    n = 300
    async with Producer(gateway.ws, token=admin_token) as producer:
        results = await asyncio.gather(
            *(producer.enqueue(q, {"n": i}, key=f"k{i}") for i in range(n)),
            producer.enqueue(q, "bad", ttl=-1),  # refused: only this caller fails
            return_exceptions=True,
        )
        assert producer._link is not None
        sent = dict(producer._link.sent_ops)
    assert isinstance(results[-1], ProtocolError) and results[-1].code == "invalid"
    ids = [r.id for r in results[:n] if isinstance(r, EnqueueResult)]
    assert len(set(ids)) == n
    # One enqueue_many for the lot (refused whole for the bad one), then each alone.
    assert sent == {"enqueue_many": 1, "enqueue": n + 1}

    async with Producer(gateway.ws, token=admin_token) as producer:
        calls = (producer.enqueue(q, {"n": i}, key=f"k{i}") for i in range(n))
        again = await asyncio.gather(*calls)
        assert producer._link is not None and dict(producer._link.sent_ops) == {"enqueue_many": 1}
    assert [r.id for r in again] == ids and all(r.duplicate for r in again)

    seen: list[int] = []
    async with Worker(gateway.ws, q, token=admin_token, prefetch=50) as worker:
        assert "batch=50" in worker.url
        deliveries = aiter(worker)
        while len(seen) < n:
            batch = [await asyncio.wait_for(anext(deliveries), 10)]
            # What already came in the same frame, without waiting for more.
            while len(batch) < 50 and len(seen) + len(batch) < n:
                try:
                    batch.append(await asyncio.wait_for(anext(deliveries), 0.01))
                except TimeoutError:
                    break
            await asyncio.gather(*(d.ack() for d in batch))
            seen += [d.body["n"] for d in batch]
        assert worker._link is not None
        sent = dict(worker._link.sent_ops)
    assert sorted(seen) == list(range(n))
    assert sent.get("ack_many", 0) >= 1
    assert sent.get("ack_many", 0) + sent.get("ack", 0) < n  # fewer frames than acks
    status, stats = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
    assert status == 200 and (stats["visible"], stats["in_flight"]) == (0, 0)


async def test_a_stale_receipt_in_a_coalesced_batch_fails_only_its_caller(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("stale")
    async with Producer(gateway.ws, token=admin_token) as producer:
        await producer.enqueue_many(q, [{"body": i} for i in range(4)])
    async with Worker(gateway.ws, q, token=admin_token, prefetch=4) as worker:
        deliveries = aiter(worker)
        got = [await asyncio.wait_for(anext(deliveries), 10) for _ in range(4)]
        await got[2].reject()
        results = await asyncio.gather(*(d.ack() for d in got), return_exceptions=True)
    assert [r == [] for r in results] == [True, True, False, True]
    assert isinstance(results[2], StaleReceipt)
    status, stats = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
    assert status == 200
    assert (stats["visible"], stats["in_flight"], stats["dead"]) == (0, 0, 1)


async def test_batch_false_is_the_v1_path(gateway: GatewayProcess, admin_token: str) -> None:
    q = unique("v1")
    async with Producer(gateway.ws, token=admin_token, batch=False) as producer:
        await asyncio.gather(*(producer.enqueue(q, i) for i in range(5)))
        assert producer._link is not None and dict(producer._link.sent_ops) == {"enqueue": 5}
    async with Worker(gateway.ws, q, token=admin_token, prefetch=5, batch=False) as worker:
        deliveries = aiter(worker)
        got = [await asyncio.wait_for(anext(deliveries), 10) for _ in range(5)]
        await asyncio.gather(*(d.ack() for d in got))
        assert worker._link is not None and dict(worker._link.sent_ops) == {"ack": 5}
    assert sorted(d.body for d in got) == list(range(5))


# -- retry_after, signed tokens, resume ---------------------------------------------------


@pytest.fixture
def limited_gateway(database_env: tuple[dict[str, str], Path]) -> Iterator[GatewayProcess]:
    """A gateway whose tokens may send 5 messages a second, in bursts of 2."""
    env, var = database_env
    settings = {"GATEWAY_TOKEN_RATE": "5", "GATEWAY_TOKEN_BURST": "2"}
    process = GatewayProcess({**env, **settings}, var, name="limited")
    process.start()
    yield process
    process.stop()


async def test_backpressure_retry_after_is_honoured(limited_gateway: GatewayProcess) -> None:
    token = limited_gateway.issue_token("admin", name="limited")
    reader = limited_gateway.issue_token("admin", name="reader")  # its own rate
    q = unique("rate")
    async with Producer(limited_gateway.ws, token=token, batch=False) as producer:
        # Sequential: the third and later are over the burst, refused with
        # retry_after, and the client waits and sends them again.
        results = [await producer.enqueue(q, i) for i in range(5)]
        assert producer._link is not None
        sent = producer._link.sent_ops["enqueue"]
    assert len({r.id for r in results}) == 5
    assert sent > 5  # some were refused, then retried
    status, stats = await ahttp("GET", f"{limited_gateway.http}/api/queues/{q}", reader)
    assert status == 200 and stats["visible"] == 5


KEY = "client-integration-signing-key-" + "0123456789abcdef" * 3


@pytest.fixture
def signed_gateway(database_env: tuple[dict[str, str], Path]) -> Iterator[GatewayProcess]:
    """A gateway with a signing key (signed tokens and refresh)."""
    env, var = database_env
    process = GatewayProcess({**env, "GATEWAY_SIGNING_KEY": KEY}, var, name="signed")
    process.start()
    yield process
    process.stop()


async def test_a_signed_token_is_refreshed_and_a_lapsed_one_reconnects(
    signed_gateway: GatewayProcess,
) -> None:
    from gateway.access.tokens import signed_token

    q = unique("signed")
    minted: list[str] = []

    def mint() -> str:
        # 3 s of life: refreshed after 1.5 s, over and over.
        minted.append(signed_token("ada", [f"enqueue:{q}", f"consume:{q}"], 3, key=KEY))
        return minted[-1]

    async with Producer(signed_gateway.ws, token=mint) as producer:
        await producer.enqueue(q, "first")
        await wait_until(
            lambda: producer._link is not None and producer._link.refreshes >= 2,
            "two refreshes",
            timeout=20,
        )
        # Well past the first token's exp: the socket lives on its refreshed tokens.
        assert producer._link is not None and producer._link.is_open
        await producer.enqueue(q, "second")
        assert producer._link.sent_ops["refresh"] >= 2
    assert len(minted) >= 3

    # A static signed token is not refreshed: the gateway closes with 4401 at
    # exp and the worker reconnects, asking its callable for a fresh token.
    tokens = iter([signed_token("ada", [f"consume:{q}"], 2, key=KEY)])
    fresh = [signed_token("ada", [f"consume:{q}"], 60, key=KEY)]

    def once_short() -> str:
        return next(tokens, fresh[0])

    worker = Worker(signed_gateway.ws, q, token=once_short, backoff_initial=0.05, prefetch=2)
    async with worker:
        assert worker._link is not None
        worker._link._refresher and worker._link._refresher.cancel()  # no refresh: let it lapse
        deliveries = aiter(worker)
        got = [await asyncio.wait_for(anext(deliveries), 10) for _ in range(2)]
        assert sorted(d.body for d in got) == ["first", "second"]
        # Iterating drives the reconnect once the gateway closes with 4401 at exp.
        again = [await asyncio.wait_for(anext(deliveries), 30) for _ in range(2)]
        assert worker.reconnects == 1
        assert sorted(d.body for d in again) == ["first", "second"]
        assert all(d.deliveries == 2 for d in again)
        await asyncio.gather(*(d.ack() for d in again))


async def test_a_subscriber_resumes_after_a_forced_disconnect(
    gateway: GatewayProcess, admin_token: str
) -> None:
    topic = unique("resume")
    status, _ = await ahttp(
        "PATCH", f"{gateway.http}/api/topics/{topic}", admin_token, {"history_size": 100}
    )
    if status != 200:
        pytest.skip(f"this gateway keeps no topic history (PATCH /api/topics/: HTTP {status})")
    subscriber = Subscriber(gateway.ws, topic, token=admin_token, backoff_initial=0.05)
    async with Producer(gateway.ws, token=admin_token) as producer:
        await producer.publish(topic, "old")  # before the subscription: not yielded
        await subscriber.__aenter__()
        messages = aiter(subscriber)
        await producer.publish(topic, "a")
        first = await asyncio.wait_for(anext(messages), 10)
        assert first.body == "a" and first.offset is not None
        assert subscriber._link is not None
        await subscriber._link.conn.close()  # a forced disconnect
        for body in ("missed-1", "missed-2"):
            await producer.publish(topic, body)
        got = [await asyncio.wait_for(anext(messages), 20) for _ in range(2)]
        await producer.publish(topic, "live")
        got.append(await asyncio.wait_for(anext(messages), 20))
        await subscriber.close()
    assert [m.body for m in got] == ["missed-1", "missed-2", "live"]
    assert [m.offset for m in got] == [first.offset + 1, first.offset + 2, first.offset + 3]
    assert subscriber.reconnects == 1 and subscriber.gaps == 0
    assert subscriber.subscribed is not None and subscriber.subscribed.recovered


async def test_a_direct_link_answers_pings_while_its_owner_does_not_read(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """A Subscriber's socket is read by the subscriber's own iteration (no
    reader task). While the caller is busy, frames must still be taken off the
    wire so the keepalive's pongs are seen: a socket that stopped reading after
    16 frames (websockets' default buffer) would be closed for a missed pong."""
    topic = unique("t")
    url = ws_url(gateway.ws, name_path("/ws/topics/", topic), {"credit": 1000})
    link = await Link.open(url, admin_token, direct=True, ping_interval=0.1, ping_timeout=0.3)
    try:
        async with Producer(gateway.ws, token=admin_token) as producer:
            for i in range(40):
                await producer.publish(topic, i)
                await asyncio.sleep(0.005)  # one frame each: the sender finds it idle
        await asyncio.sleep(1.5)  # the owner is busy: many pings come and go meanwhile
        bodies: list[int] = []
        while len(bodies) < 40:
            frame = await asyncio.wait_for(link.next(), 10)
            bodies += [item["body"] for item in frame.get("items", [])]
        assert bodies == list(range(40))
        assert link.is_open, link.closed_with
        # Closed under it while nobody reads: is_open says so at once.
        await link.conn.close()
        assert not link.is_open
    finally:
        await link.close()

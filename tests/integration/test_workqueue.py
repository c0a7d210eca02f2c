"""Every work-queue rule of the protocol, against a real daphne and real sockets.

Runs once on SQLite and once on PostgreSQL (see conftest.py).
"""

from __future__ import annotations

import asyncio
import time

from tests.support.clients import Socket, ahttp, unique
from tests.support.gateways import GatewayProcess, both_servers


async def worker(gw: GatewayProcess, token: str, queue: str, **params: object) -> Socket:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return await Socket.open(f"{gw.ws}/ws/queues/{queue}/?{query}", token)


async def producer(gw: GatewayProcess, token: str) -> Socket:
    return await Socket.open(f"{gw.ws}/ws/produce/", token)


async def enqueue(p: Socket, queue: str, body: object, **extra: object) -> dict[str, object]:
    reply = await p.request({"op": "enqueue", "queue": queue, "body": body, **extra})
    assert reply["op"] == "enqueued", reply
    return reply


async def stats(gw: GatewayProcess, token: str, queue: str) -> dict[str, int]:
    status, body = await ahttp("GET", f"{gw.http}/api/queues/{queue}", token)
    assert status == 200, body
    return body  # type: ignore[no-any-return]


@both_servers
async def test_enqueue_deliver_ack_round_trip(gateway: GatewayProcess, admin_token: str) -> None:
    q = unique()
    async with (
        await producer(gateway, admin_token) as p,
        await worker(gateway, admin_token, q) as w,
    ):
        sent = await enqueue(p, q, {"hello": ["world", 1, None]})
        (d,) = await w.deliveries(1)
        assert d["id"] == sent["id"] and d["queue"] == q
        assert d["body"] == {"hello": ["world", 1, None]}
        assert d["deliveries"] == 1 and 0 < d["expires_in"] <= 30
        assert (await w.request({"op": "ack", "receipt": d["receipt"]}))["op"] == "acked"
    s = await stats(gateway, admin_token, q)
    assert (s["visible"], s["in_flight"], s["delayed"], s["dead"]) == (0, 0, 0, 0)


@both_servers
async def test_push_stops_at_prefetch_and_resumes_on_ack(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    async with await producer(gateway, admin_token) as p:
        for i in range(5):
            await enqueue(p, q, i)
    async with await worker(gateway, admin_token, q, prefetch=2) as w:
        first = await w.deliveries(2)
        assert [d["body"] for d in first] == [0, 1]
        await w.quiet(0.4)
        await w.request({"op": "ack", "receipt": first[0]["receipt"]})
        (third,) = await w.deliveries(1)
        assert third["body"] == 2
        await w.quiet(0.3)


@both_servers
async def test_dead_socket_releases_its_leases_at_once(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    async with await producer(gateway, admin_token) as p:
        await enqueue(p, q, "job")
    doomed = await worker(gateway, admin_token, q, visibility_timeout=300)
    (d,) = await doomed.deliveries(1)
    async with await worker(gateway, admin_token, q) as w2:
        await w2.quiet(0.3)  # still leased to the first socket
        await doomed.abort()  # no close handshake: the TCP connection just dies
        (again,) = await w2.deliveries(1, timeout=10)  # long before the 300 s timeout
        assert again["id"] == d["id"] and again["deliveries"] == 2
        assert again["receipt"] != d["receipt"]


async def first_frame(*sockets: Socket) -> tuple[Socket, dict[str, object]]:
    """The first unsolicited frame on any of ``sockets``, and which one got it."""
    tasks = {asyncio.ensure_future(s.next()): s for s in sockets}
    done, pending = await asyncio.wait(tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    assert done, "no frame arrived"
    task = done.pop()
    return tasks[task], task.result()


async def test_lease_expiry_redelivers_and_old_receipt_is_stale(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    async with await producer(gateway, admin_token) as p:
        await enqueue(p, q, "slow job")
    async with (
        await worker(gateway, admin_token, q, visibility_timeout=0.5, prefetch=1) as w1,
        await worker(gateway, admin_token, q, prefetch=1) as w2,
    ):
        (d1,) = await w1.deliveries(1)
        # The lease expires after 0.5 s; whichever worker has room gets it again.
        holder, d2 = await first_frame(w1, w2)
        assert d2["id"] == d1["id"] and d2["deliveries"] == 2
        assert d2["receipt"] != d1["receipt"]
        for op in ("ack", "nack", "reject"):
            reply = await w1.request({"op": op, "receipt": d1["receipt"]})
            assert reply["code"] == "stale_receipt", reply
        reply = await w1.request({"op": "extend", "receipt": d1["receipt"], "timeout": 10})
        assert reply["code"] == "stale_receipt"
        # The stale receipts changed nothing: the new lease is still held and ackable.
        assert (await stats(gateway, admin_token, q))["in_flight"] == 1
        assert (await holder.request({"op": "ack", "receipt": d2["receipt"]}))["op"] == "acked"
    s = await stats(gateway, admin_token, q)
    assert s["visible"] + s["in_flight"] == 0


async def test_extend_keeps_the_lease(gateway: GatewayProcess, admin_token: str) -> None:
    q = unique()
    async with await producer(gateway, admin_token) as p:
        await enqueue(p, q, "x")
    async with await worker(gateway, admin_token, q, visibility_timeout=0.6, prefetch=1) as w:
        (d,) = await w.deliveries(1)
        reply = await w.request({"op": "extend", "receipt": d["receipt"], "timeout": 30})
        assert reply["op"] == "extended" and 29 < reply["expires_in"] <= 30
        await w.quiet(1.2)  # past the original 0.6 s: no redelivery
        assert (await w.request({"op": "ack", "receipt": d["receipt"]}))["op"] == "acked"


async def test_nack_with_delay_then_redelivered_in_original_place(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    delay = 2.0
    async with (
        await producer(gateway, admin_token) as p,
        await worker(gateway, admin_token, q, prefetch=1) as w,
    ):
        await enqueue(p, q, "first")
        (d,) = await w.deliveries(1)
        # Newer messages, waiting while the worker is full.
        await enqueue(p, q, "second")
        await enqueue(p, q, "third")
        started = time.monotonic()
        reply = await w.request({"op": "nack", "receipt": d["receipt"], "delay": delay})
        assert reply["op"] == "nacked"
        # While "first" is delayed, the freed slot takes the next visible message.
        (d2,) = await w.deliveries(1)
        assert d2["body"] == "second"
        # Hold "second" until "first" is due: then "first" and the newer
        # "third" are both visible, and only their places decide what comes next.
        deadline = time.monotonic() + 30
        while True:
            s = await stats(gateway, admin_token, q)
            if (s["visible"], s["delayed"], s["in_flight"]) == (2, 0, 1):
                break
            assert (s["visible"], s["delayed"], s["in_flight"]) == (1, 1, 1), s
            assert time.monotonic() < deadline, s
            await asyncio.sleep(0.1)
        assert time.monotonic() - started >= delay  # never visible before its delay
        await w.request({"op": "ack", "receipt": d2["receipt"]})
        (again,) = await w.deliveries(1)
        assert (again["body"], again["id"], again["deliveries"]) == ("first", d["id"], 2)
        await w.request({"op": "ack", "receipt": again["receipt"]})
        (last,) = await w.deliveries(1)
        assert (last["body"], last["deliveries"]) == ("third", 1)


async def test_nack_without_delay_keeps_place_ahead_of_newer(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    async with await producer(gateway, admin_token) as p:
        for i in range(3):
            await enqueue(p, q, i)
    async with await worker(gateway, admin_token, q, prefetch=1) as w:
        (d0,) = await w.deliveries(1)
        await w.request({"op": "nack", "receipt": d0["receipt"]})
        (again,) = await w.deliveries(1)
        assert again["body"] == 0 and again["deliveries"] == 2


async def test_reject_dead_letters_and_redrive_brings_back(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    async with (
        await producer(gateway, admin_token) as p,
        await worker(gateway, admin_token, q) as w,
    ):
        await enqueue(p, q, "bad")
        (d,) = await w.deliveries(1)
        assert (await w.request({"op": "reject", "receipt": d["receipt"]}))["op"] == "rejected"
        await w.quiet(0.3)
        assert (await stats(gateway, admin_token, q))["dead"] == 1
        status, body = await ahttp("POST", f"{gateway.http}/api/queues/{q}/redrive", admin_token)
        assert (status, body) == (200, {"redriven": 1})
        (again,) = await w.deliveries(1)
        assert again["id"] == d["id"] and again["deliveries"] == 1


async def test_poison_message_dead_lettered_after_max_deliveries(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    await asyncio.to_thread(gateway.manage, "configure_queue", q, "--max-deliveries", "2")
    async with (
        await producer(gateway, admin_token) as p,
        await worker(gateway, admin_token, q) as w,
    ):
        await enqueue(p, q, "poison")
        for attempt in (1, 2):
            (d,) = await w.deliveries(1)
            assert d["deliveries"] == attempt
            await w.request({"op": "nack", "receipt": d["receipt"]})
        await enqueue(p, q, "healthy")
        (d,) = await w.deliveries(1)
        assert d["body"] == "healthy"  # the poison went to the dead letters instead
        s = await stats(gateway, admin_token, q)
        assert s["dead"] == 1 and s["max_deliveries"] == 2


async def test_idempotency_key_dedups_even_after_ack(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    async with (
        await producer(gateway, admin_token) as p,
        await worker(gateway, admin_token, q) as w,
    ):
        first = await enqueue(p, q, 1, key="order-7")
        assert first["duplicate"] is False
        again = await enqueue(p, q, 2, key="order-7")
        assert again == {**first, "duplicate": True, "ref": again["ref"]}
        (d,) = await w.deliveries(1)
        await w.request({"op": "ack", "receipt": d["receipt"]})
        after_ack = await enqueue(p, q, 3, key="order-7")
        assert after_ack["duplicate"] is True and after_ack["id"] == first["id"]
        await w.quiet(0.3)


async def test_delayed_enqueue_is_not_delivered_early(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    async with (
        await producer(gateway, admin_token) as p,
        await worker(gateway, admin_token, q) as w,
    ):
        sent_at = time.monotonic()
        await enqueue(p, q, "later", delay=0.7)
        assert (await stats(gateway, admin_token, q))["delayed"] == 1
        (d,) = await w.deliveries(1)
        assert d["body"] == "later"
        assert time.monotonic() - sent_at >= 0.7


async def test_ack_with_follow_ups_is_all_or_nothing(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q, next_q = unique(), unique("next")
    async with (
        await producer(gateway, admin_token) as p,
        await worker(gateway, admin_token, q) as w,
    ):
        await enqueue(p, q, "step 1")
        (d,) = await w.deliveries(1)
        bad = await w.request(
            {
                "op": "ack",
                "receipt": d["receipt"],
                "enqueue": [{"queue": next_q, "body": "ok"}, {"queue": next_q, "delay": -1}],
            }
        )
        assert bad["op"] == "error" and bad["code"] in ("invalid", "bad_frame")
        status, _ = await ahttp("GET", f"{gateway.http}/api/queues/{next_q}", admin_token)
        assert status == 404  # nothing was enqueued
        assert (await stats(gateway, admin_token, q))["in_flight"] == 1  # lease still held
        good = await w.request(
            {
                "op": "ack",
                "receipt": d["receipt"],
                "enqueue": [{"queue": next_q, "body": "a"}, {"body": "b", "key": "k"}],
            }
        )
        assert good["op"] == "acked"
        assert [e["duplicate"] for e in good["enqueued"]] == [False, False]
        assert (await stats(gateway, admin_token, next_q))["visible"] == 1
        (follow,) = await w.deliveries(1)  # "b" went to the worker's own queue
        assert follow["body"] == "b"


async def test_delivery_order_is_enqueue_order(gateway: GatewayProcess, admin_token: str) -> None:
    q = unique()
    async with await producer(gateway, admin_token) as p:
        for i in range(50):
            await p.send({"op": "enqueue", "queue": q, "body": i})
        replies = [await p.next() for _ in range(50)]
        assert all(r["op"] == "enqueued" for r in replies)
    async with await worker(gateway, admin_token, q, prefetch=100) as w:
        got = await w.deliveries(50)
        assert [d["body"] for d in got] == list(range(50))


@both_servers
async def test_idle_worker_is_woken_by_enqueue_without_polling(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    async with await worker(gateway, admin_token, q) as w:
        await w.quiet(0.3)
        _, before = await ahttp("GET", f"{gateway.http}/api/stats", admin_token)
        await asyncio.sleep(1.0)
        _, after = await ahttp("GET", f"{gateway.http}/api/stats", admin_token)
        # While idle the store did nothing but answer the first stats call:
        # nobody polls the queue.
        assert after["process"]["store_batches"] - before["process"]["store_batches"] <= 1
        async with await producer(gateway, admin_token) as p:
            await enqueue(p, q, "wake up")
        (d,) = await w.deliveries(1)
        assert d["body"] == "wake up"


async def test_purge_deletes_all_but_in_flight(gateway: GatewayProcess, admin_token: str) -> None:
    q = unique()
    async with await producer(gateway, admin_token) as p:
        for i in range(4):
            await enqueue(p, q, i)
    async with await worker(gateway, admin_token, q, prefetch=1) as w:
        (d,) = await w.deliveries(1)
        status, body = await ahttp("POST", f"{gateway.http}/api/queues/{q}/purge", admin_token)
        assert (status, body) == (200, {"purged": 3})
        assert (await w.request({"op": "ack", "receipt": d["receipt"]}))["op"] == "acked"
        await w.quiet(0.3)


@both_servers
async def test_http_batch_enqueue_all_or_nothing(gateway: GatewayProcess, admin_token: str) -> None:
    q = unique()
    url = f"{gateway.http}/api/queues/{q}/messages"
    status, body = await ahttp(
        "POST", url, admin_token, {"messages": [{"body": 1}, {"body": 2, "delay": -3}]}
    )
    assert status == 400 and body["error"] == "invalid" and "messages[1]" in body["detail"]
    status, _ = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
    assert status == 404
    status, body = await ahttp(
        "POST", url, admin_token, {"messages": [{"body": 1, "key": "a"}, {"body": 2, "key": "a"}]}
    )
    assert status == 200
    assert [r["duplicate"] for r in body["results"]] == [False, True]
    assert (await stats(gateway, admin_token, q))["visible"] == 1


@both_servers
async def test_batch_extensions_enqueue_many_deliveries_ack_many(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    async with await producer(gateway, admin_token) as p:
        reply = await p.request(
            {"op": "enqueue_many", "queue": q, "messages": [{"body": i} for i in range(25)]}
        )
        assert reply["op"] == "enqueued_many" and len(reply["results"]) == 25
        bad = await p.request(
            {"op": "enqueue_many", "queue": q, "messages": [{"body": 1}, {"delay": 1}]}
        )
        assert bad["code"] == "bad_frame" and "messages[1]" in bad["detail"]
    assert (await stats(gateway, admin_token, q))["visible"] == 25  # the bad batch added nothing
    async with await worker(gateway, admin_token, q, prefetch=10, batch=10) as w:
        items: list[dict[str, object]] = []
        while len(items) < 10:
            frame = await w.next()
            assert frame["op"] == "deliveries" and frame["queue"] == q
            items += frame["items"]  # type: ignore[arg-type]
        assert [i["body"] for i in items] == list(range(10))
        receipts = [str(i["receipt"]) for i in items]
        reply = await w.request({"op": "ack_many", "receipts": [*receipts[:4], "1.ff"]})
        assert reply == {**reply, "op": "acked_many", "acked": 4, "stale": ["1.ff"]}
        again = await w.request({"op": "ack_many", "receipts": receipts[:2]})
        assert again["acked"] == 0 and again["stale"] == receipts[:2]
        more = await w.next()  # four acks made room for four more
        assert [i["body"] for i in more["items"]] == [10, 11, 12, 13]

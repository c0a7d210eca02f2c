"""The Python client and the ``leasecast`` console script against a real gateway."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from gateway.client import Producer, Subscriber, Worker
from gateway.errors import Forbidden, StaleReceipt, Unauthorized
from tests.databases import ROOT
from tests.integration.harness import GatewayProcess, Socket, ahttp, unique


async def test_worker_iterates_and_ends_leases(gateway: GatewayProcess, admin_token: str) -> None:
    q, follow = unique(), unique("follow")
    async with Producer(gateway.http, token=admin_token) as producer:
        first = await producer.enqueue(q, {"n": 1}, key="k1")
        assert await producer.enqueue(q, {"n": 1}, key="k1") == {**first, "duplicate": True}
        await producer.enqueue_many(q, [{"body": {"n": i}} for i in range(2, 5)])
    seen = []
    async with Worker(gateway.ws, q, token=admin_token, prefetch=4) as worker:
        async for delivery in worker:
            seen.append((delivery.body["n"], delivery.deliveries))
            n = delivery.body["n"]
            if n == 1:
                assert 29 < await delivery.extend(60) <= 60
                enqueued = await delivery.ack(enqueue=[{"queue": follow, "body": "next"}])
                assert enqueued[0]["duplicate"] is False
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
        assert (await producer.enqueue("mine.x", 1))["duplicate"] is False


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
        assert (held.body, held.id, held.deliveries) == ("before", before["id"], 1)
        own_gateway.kill()
        own_gateway.start()  # same port, same database
        async with Producer(own_gateway.ws, token=token) as producer:
            after = await producer.enqueue(q, "after")
        got = await asyncio.wait_for(anext(deliveries), 60)
        assert (got.body, got.id, got.deliveries) == ("after", after["id"], 1)
        assert worker.reconnects == 1
        await got.ack()
        with pytest.raises(StaleReceipt):
            await held.ack()  # its socket died with the gateway
    # "before" is not lost: still leased (to the dead socket) until its timeout.
    status, stats = await ahttp("GET", f"{own_gateway.http}/api/queues/{q}", token)
    assert status == 200
    assert (stats["visible"], stats["in_flight"], stats["delayed"], stats["dead"]) == (0, 1, 0, 0)


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    """Wait until ``condition()`` holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


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
        await eventually(
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
                    for process in snapshot["processes"]
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
        await eventually(
            lambda: subscriber.reconnects == 1 or waiting.done(), "the subscriber reconnected"
        )
        assert not waiting.done(), waiting
        await producer.publish(topic, "after")
        got = await asyncio.wait_for(waiting, 10)
        assert (got.body, got.seq) == ("after", 1)  # a new socket, a new stream
        assert subscriber.reconnects == 1


def run_cli(
    gw: GatewayProcess, token: str | None, *args: str, stdin: str = ""
) -> tuple[int, str, str]:
    env = {"PATH": "/usr/bin:/bin", "LEASECAST_URL": gw.http}
    if token:
        env["LEASECAST_TOKEN"] = token
    done = subprocess.run(
        [sys.executable, "-m", "gateway.client.cli", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout, done.stderr


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

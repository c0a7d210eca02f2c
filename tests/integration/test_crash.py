"""``kill -9`` of the gateway: nothing confirmed is lost (protocol: Work queue)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from tests.support.clients import Socket, ahttp, unique
from tests.support.gateways import GatewayProcess


async def _produce(
    gw: GatewayProcess, token: str, queue: str, start: int, confirmed: set[int]
) -> None:
    """Enqueue numbered bodies, pipelined, recording confirmed numbers, until the socket dies."""
    with contextlib.suppress(Exception):
        async with await Socket.open(f"{gw.ws}/ws/produce/", token) as p:
            n = start
            while True:
                batch = list(range(n, n + 50))
                for i in batch:
                    await p.send({"op": "enqueue", "queue": queue, "body": i, "ref": i})
                for _ in batch:
                    reply = await p.next(timeout=5)
                    if reply["op"] == "enqueued":
                        confirmed.add(reply["ref"])
                n += 50


async def _consume(gw: GatewayProcess, token: str, queue: str, seen: set[int]) -> None:
    """Ack everything delivered, recording bodies, until the socket dies."""
    with contextlib.suppress(Exception):
        url = f"{gw.ws}/ws/queues/{queue}/?prefetch=50&visibility_timeout=1"
        async with await Socket.open(url, token) as w:
            while True:
                frame = await w.next(timeout=30)
                if frame["op"] == "deliver":
                    seen.add(frame["body"])
                    await w.send({"op": "ack", "receipt": frame["receipt"]})


async def test_kill_9_under_load_loses_nothing_confirmed(own_gateway: GatewayProcess) -> None:
    token = own_gateway.issue_token("admin", name="crash")
    q = unique("crash")
    confirmed: set[int] = set()
    seen: set[int] = set()
    tasks = [
        asyncio.create_task(_produce(own_gateway, token, q, k * 1_000_000, confirmed))
        for k in range(3)
    ]
    tasks.append(asyncio.create_task(_consume(own_gateway, token, q, seen)))
    deadline = time.monotonic() + 30
    while len(confirmed) < 3000 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    own_gateway.kill()  # mid-stream: enqueues and acks in flight
    await asyncio.wait(tasks, timeout=30)
    assert len(confirmed) >= 3000, "the load never got going"
    before_crash = len(seen)

    own_gateway.start()
    drained: set[int] = set()
    consumer = asyncio.create_task(_consume(own_gateway, token, q, drained))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        status, s = await ahttp("GET", f"{own_gateway.http}/api/queues/{q}", token)
        assert status == 200
        if s["visible"] + s["in_flight"] + s["delayed"] == 0:
            break
    consumer.cancel()
    lost = confirmed - seen - drained
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    assert before_crash > 0 and drained  # work happened on both sides of the crash


async def test_leases_of_a_killed_gateway_return_after_their_timeout(
    own_gateway: GatewayProcess,
) -> None:
    token = own_gateway.issue_token("admin", name="crash")
    q = unique("lease")
    async with await Socket.open(f"{own_gateway.ws}/ws/produce/", token) as p:
        for i in range(3):
            assert (await p.request({"op": "enqueue", "queue": q, "body": i}))["op"] == "enqueued"
    w = await Socket.open(f"{own_gateway.ws}/ws/queues/{q}/?visibility_timeout=2", token)
    held = await w.deliveries(3)
    own_gateway.kill()
    with contextlib.suppress(Exception):
        await w.close()
    own_gateway.start()
    async with await Socket.open(f"{own_gateway.ws}/ws/queues/{q}/", token) as w2:
        again = await w2.deliveries(3, timeout=20)
    assert sorted(d["id"] for d in again) == sorted(d["id"] for d in held)
    assert all(d["deliveries"] == 2 for d in again)

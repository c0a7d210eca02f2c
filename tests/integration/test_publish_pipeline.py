"""Publishes pipelined on one socket (protocol v1.1: Topics; issue 10).

A producer that sends many PUBLISH frames without waiting for the replies
must have every one accepted, in order, whether the gateway is one process or
several on one Redis; a subscriber on another process hears them all, in
order. And a gateway writes each log record once.

A publish is confirmed only once every buffer on the process has taken it
(docs/protocol.md, Broadcast topics): pipelined publishes meeting a full
``block`` subscriber are held until credit makes room, with or without Redis
(issue 21.10: with Redis, the stream reader used to let the third through).
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.typing import Origin

from tests.support.clients import Socket, b_hears_a, collect, unique
from tests.support.databases import sqlite_database
from tests.support.gateways import GatewayProcess, gateways_on_redis

#: Publish frames sent back to back, no reply awaited in between.
PIPELINED = 200


@pytest.fixture(scope="module")
def cluster(redis_url: str) -> Iterator[tuple[GatewayProcess, GatewayProcess, str]]:
    """Gateways A and B on one Redis with default settings, and an admin token."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-pipeline-"))
    with gateways_on_redis(var, redis_url) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def lone(redis_url: str) -> Iterator[tuple[GatewayProcess, str]]:
    """One gateway process on Redis (its relay has no peer), and an admin token."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-pipeline-lone-"))
    with sqlite_database(var) as env:
        env.update(REDIS_URL=redis_url, GATEWAY_REDIS_PREFIX=f"lct{unique('p')}")
        gw = GatewayProcess(env, var, name="lone")
        gw.start()
        try:
            yield gw, gw.issue_token("admin", name="lone")
        finally:
            gw.stop()


@pytest.fixture(scope="module")
def embedded() -> Iterator[tuple[GatewayProcess, str]]:
    """One gateway process without Redis (the in-memory layer), and an admin token."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-pipeline-embedded-"))
    with sqlite_database(var) as env:
        gw = GatewayProcess(env, var, name="embedded")
        gw.start()
        try:
            yield gw, gw.issue_token("admin", name="embedded")
        finally:
            gw.stop()


@pytest.fixture(params=["embedded", "lone"])
def one_process(request: pytest.FixtureRequest) -> tuple[GatewayProcess, str]:
    """One gateway process, without Redis (``embedded``) and with it (``lone``)."""
    gw: tuple[GatewayProcess, str] = request.getfixturevalue(request.param)
    return gw


async def subscriber(gw: GatewayProcess, token: str, topic: str) -> Socket:
    return await Socket.open(f"{gw.ws}/ws/topics/{topic}/?capacity=10000&credit=1000000", token)


async def pipeline(p: Socket, topic: str, n: int) -> list[dict[str, Any]]:
    """Send ``n`` publishes (``ref`` and body 0..n-1) back to back; return the ``n`` replies."""
    for i in range(n):
        await p.send({"op": "publish", "topic": topic, "body": {"i": i}, "ref": i})
    return [await p.next(timeout=30) for _ in range(n)]


def check_replies(replies: list[dict[str, Any]], n: int) -> None:
    """Every publish accepted, answered in the order sent, with increasing seqs."""
    refused = [r for r in replies if r.get("op") != "published"]
    assert not refused, f"{len(refused)} of {n} refused, e.g. {refused[:3]}"
    assert [r["ref"] for r in replies] == list(range(n))
    seqs = [r["seq"] for r in replies]
    assert all(x < y for x, y in itertools.pairwise(seqs)), seqs


async def heard(s: Socket, n: int) -> list[int]:
    """The next ``n`` bodies ``s`` receives, after checking nothing was dropped."""
    items, dropped = await collect(s, n, timeout=30)
    assert dropped == 0
    seqs = [it["seq"] for it in items]
    assert all(x < y for x, y in itertools.pairwise(seqs)), seqs
    return [it["body"]["i"] for it in items]


async def test_pipelined_publishes_on_one_process_of_two_are_all_heard_on_both(
    cluster: tuple[GatewayProcess, GatewayProcess, str],
) -> None:
    a, b, token = cluster
    topic = unique("pipe")
    async with (
        await subscriber(b, token, topic) as on_b,
        await Socket.open(f"{a.ws}/ws/produce/", token) as p,
    ):
        await b_hears_a(p, topic, on_b)
        async with await subscriber(a, token, topic) as on_a:
            replies = await pipeline(p, topic, PIPELINED)
            check_replies(replies, PIPELINED)
            assert await heard(on_a, PIPELINED) == list(range(PIPELINED))
            assert await heard(on_b, PIPELINED) == list(range(PIPELINED))
            for s in (on_a, on_b):
                await s.quiet(0.3)  # nothing more: no repeat, no late drop report


async def test_two_producers_pipelining_on_both_processes_at_once(
    cluster: tuple[GatewayProcess, GatewayProcess, str],
) -> None:
    """Each process relays its own pipeline while receiving the other's."""
    a, b, token = cluster
    topics = {gw.name: unique("pipe2") for gw in (a, b)}
    listeners = {}
    async with (
        await Socket.open(f"{a.ws}/ws/produce/", token) as pa,
        await Socket.open(f"{b.ws}/ws/produce/", token) as pb,
    ):
        # Topic of A's producer heard on B, and the other way round.
        for producer, there, topic in ((pa, b, topics["a"]), (pb, a, topics["b"])):
            listeners[topic] = await subscriber(there, token, topic)
            await b_hears_a(producer, topic, listeners[topic])
        replies = await asyncio.gather(
            pipeline(pa, topics["a"], PIPELINED), pipeline(pb, topics["b"], PIPELINED)
        )
        for got in replies:
            check_replies(got, PIPELINED)
        for listener in listeners.values():
            assert await heard(listener, PIPELINED) == list(range(PIPELINED))
            await listener.close()


async def test_pipelined_publishes_on_a_lone_process_with_redis(
    lone: tuple[GatewayProcess, str],
) -> None:
    gw, token = lone
    topic = unique("pipe")
    async with (
        await subscriber(gw, token, topic) as s,
        await Socket.open(f"{gw.ws}/ws/produce/", token) as p,
    ):
        check_replies(await pipeline(p, topic, PIPELINED), PIPELINED)
        assert await heard(s, PIPELINED) == list(range(PIPELINED))


async def test_pipelined_publishes_on_one_embedded_process(
    embedded: tuple[GatewayProcess, str],
) -> None:
    gw, token = embedded
    topic = unique("pipe")
    async with (
        await subscriber(gw, token, topic) as s,
        await Socket.open(f"{gw.ws}/ws/produce/", token) as p,
    ):
        check_replies(await pipeline(p, topic, PIPELINED), PIPELINED)
        assert await heard(s, PIPELINED) == list(range(PIPELINED))


async def test_a_gateway_writes_each_log_record_once(
    embedded: tuple[GatewayProcess, str],
) -> None:
    """One refused socket, one warning: the line appears once in the process's output."""
    gw, _ = embedded
    origin = f"http://{unique('evil')}.example"
    # A browser's socket (an Origin) without a token: accepted, told, closed 4401.
    async with connect(f"{gw.ws}/ws/produce/", origin=Origin(origin)) as refused:
        await refused.wait_closed()
    assert refused.close_code == 4401
    needle = f"origin {origin!r}"
    deadline = asyncio.get_running_loop().time() + 10
    while needle not in gw.log_text():
        assert asyncio.get_running_loop().time() < deadline, gw.log_text()[-2000:]
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # a second copy, if any, would be written by now
    lines = [line for line in gw.log_text().splitlines() if needle in line]
    assert len(lines) == 1, lines


async def block_subscriber(gw: GatewayProcess, token: str, topic: str) -> Socket:
    """A ``block`` subscriber with room for two messages and no credit."""
    return await Socket.open(f"{gw.ws}/ws/topics/{topic}/?capacity=2&credit=0&on_full=block", token)


async def send_three(p: Socket, topic: str) -> None:
    """Three publishes back to back (``ref`` and body 0..2); the first two are confirmed."""
    for i in range(3):
        await p.send({"op": "publish", "topic": topic, "body": {"i": i}, "ref": i})
    first = [await p.next() for _ in range(2)]
    assert [(r["op"], r["ref"]) for r in first] == [("published", 0), ("published", 1)], first


async def test_a_pipelined_publish_waits_for_a_full_block_subscriber(
    one_process: tuple[GatewayProcess, str],
) -> None:
    """The third publish meets the full buffer: its reply waits for the credit that makes room."""
    gw, token = one_process
    topic = unique("blk")
    async with (
        await block_subscriber(gw, token, topic) as s,
        await Socket.open(f"{gw.ws}/ws/produce/", token) as p,
    ):
        await send_three(p, topic)
        await p.quiet(0.5)  # no credit, no room: the third is not confirmed
        await s.send({"op": "credit", "n": 2})
        items, dropped = await collect(s, 2)
        assert [it["body"]["i"] for it in items] == [0, 1] and dropped == 0
        reply = await p.next()
        assert (reply["op"], reply["ref"]) == ("published", 2), reply
        await s.send({"op": "credit", "n": 1})
        items, dropped = await collect(s, 1)
        assert [it["body"]["i"] for it in items] == [2] and dropped == 0
        await s.quiet(0.3)


async def test_the_reply_comes_after_the_frames_that_made_room(
    one_process: tuple[GatewayProcess, str],
) -> None:
    """On the subscriber's own socket, one ordered stream: the reply follows the frame
    whose sending made room for the third message."""
    gw, token = one_process
    topic = unique("blk")
    async with await block_subscriber(gw, token, topic) as s:
        await send_three(s, topic)
        await s.quiet(0.5)  # neither a reply nor messages without credit
        await s.send({"op": "credit", "n": 2})
        sent, reply = await s.next(), await s.next()
        assert sent["op"] == "messages", sent
        assert [it["body"]["i"] for it in sent["items"]] == [0, 1]
        assert (reply["op"], reply["ref"]) == ("published", 2), reply
        await s.quiet(0.3)  # the third is buffered, waiting for credit

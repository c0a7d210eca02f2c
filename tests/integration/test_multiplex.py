"""The multiplexed socket ``/ws/`` (docs/protocol.md, "The multiplexed socket").

Every test runs on two deployments: one gateway process on SQLite without
Redis, and two processes on PostgreSQL sharing a Redis, subscribing on B and
publishing on A.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import Socket, ahttp, unique
from tests.support.databases import postgres_database, postgres_unavailable, sqlite_database
from tests.support.gateways import GatewayProcess

#: Both deployments run with these: a short block wait, a low subscription limit.
SETTINGS = {"GATEWAY_BLOCK_WAIT": "1", "GATEWAY_MAX_SUBSCRIPTIONS": "120"}


@dataclass
class Deployment:
    """Where to publish and where to subscribe (the same process, or A and B)."""

    name: str
    pub: GatewayProcess
    sub: GatewayProcess
    token: str

    async def configure(self, topic: str, **settings: Any) -> None:
        status, doc = await ahttp(
            "PATCH", f"{self.pub.http}/api/topics/{topic}", self.token, settings
        )
        assert status == 200, doc
        if self.sub is not self.pub:
            await asyncio.sleep(2.1)  # read again within GATEWAY_QUEUE_SETTINGS_TTL


@pytest.fixture(scope="module")
def one() -> Iterator[Deployment]:
    var = Path(tempfile.mkdtemp(prefix="leasecast-mux-one-"))
    with sqlite_database(var) as env:
        gw = GatewayProcess({**env, **SETTINGS}, var, name="one")
        gw.start()
        try:
            yield Deployment("one", gw, gw, gw.issue_token("admin", name="admin"))
        finally:
            gw.stop()


@pytest.fixture(scope="module")
def two(redis_url: str) -> Iterator[Deployment]:
    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    var = Path(tempfile.mkdtemp(prefix="leasecast-mux-two-"))
    with postgres_database(var) as env:
        env.update(SETTINGS, REDIS_URL=redis_url, GATEWAY_REDIS_PREFIX=unique("lcm"))
        a = GatewayProcess(env, var, name="a")
        b = GatewayProcess(env, var, name="b")
        a.start()
        try:
            b.start()
            yield Deployment("two", a, b, a.issue_token("admin", name="admin"))
        finally:
            a.stop()
            b.stop()


@pytest.fixture(params=["one", "two"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


async def publish(d: Deployment, topic: str, bodies: list[Any]) -> None:
    status, reply = await ahttp(
        "POST", f"{d.pub.http}/api/topics/{topic}/messages", d.token,
        {"messages": [{"body": b} for b in bodies]},
    )  # fmt: skip
    assert status == 200, reply


async def gather_items(
    s: Socket, wanted: int, timeout: float = 20
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int], list[dict[str, Any]]]:
    """``messages`` items by topic until ``wanted`` arrived; drops by topic; other frames."""
    items: dict[str, list[dict[str, Any]]] = defaultdict(list)
    dropped: dict[str, int] = defaultdict(int)
    others: list[dict[str, Any]] = []
    while sum(map(len, items.values())) < wanted:
        frame = await s.next(timeout)
        if frame["op"] != "messages":
            others.append(frame)
            continue
        items[frame["topic"]] += frame["items"]
        dropped[frame["topic"]] += frame["dropped"]
    return items, dropped, others


async def test_a_hundred_subscriptions_on_one_socket_get_exactly_their_topics(
    deployment: Deployment,
) -> None:
    d = deployment
    topics = [unique("mux") for _ in range(100)]
    async with await Socket.open(f"{d.sub.ws}/ws/", d.token) as s:
        replies = await asyncio.gather(
            *(s.request({"op": "subscribe", "topic": t}) for t in topics)
        )
        assert [r["op"] for r in replies] == ["subscribed"] * 100
        assert {r["topic"] for r in replies} == set(topics)
        assert all(r["recovered"] is None for r in replies)
        # Topic i gets 1 + i % 3 messages, each naming its topic.
        counts = {t: 1 + i % 3 for i, t in enumerate(topics)}
        await asyncio.gather(
            *(publish(d, t, [{"t": t, "n": n} for n in range(k)]) for t, k in counts.items())
        )
        items, dropped, others = await gather_items(s, sum(counts.values()))
        assert others == []
        for t in topics:
            assert [it["body"] for it in items[t]] == [{"t": t, "n": n} for n in range(counts[t])]
            assert [it["seq"] for it in items[t]] == list(range(1, counts[t] + 1))
            assert dropped[t] == 0
        await s.quiet(0.5)  # nothing more, for any topic


async def test_credit_policy_and_block_are_per_subscription(deployment: Deployment) -> None:
    d = deployment
    starved, steady, blocked = unique("starved"), unique("steady"), unique("blocked")
    async with await Socket.open(f"{d.sub.ws}/ws/", d.token) as s:
        for frame in (
            {"op": "subscribe", "topic": starved, "credit": 0, "capacity": 5},
            {"op": "subscribe", "topic": steady, "priority": 3},
            {"op": "subscribe", "topic": blocked, "credit": 0, "capacity": 2, "on_full": "block"},
        ):
            assert (await s.request(frame))["op"] == "subscribed"
        await publish(d, starved, list(range(10)))
        await publish(d, steady, list(range(10)))
        items, _, _ = await gather_items(s, 10)
        assert [it["body"] for it in items[steady]] == list(range(10))
        assert starved not in items  # no credit: all wait in its own buffer
        # The block subscription fills, stays full past the block wait (1 s),
        # and only it ends; the publish proceeds.
        await publish(d, blocked, list(range(5)))
        ended = await s.next(timeout=20)
        assert ended == {"op": "unsubscribed", "topic": blocked, "reason": "slow_consumer"}
        # The others go on: the starved one gets its last 5, 5 told dropped.
        await s.send({"op": "credit", "topic": starved, "n": 100})
        items, dropped, _ = await gather_items(s, 5)
        assert [it["body"] for it in items[starved]] == [5, 6, 7, 8, 9]
        assert dropped[starved] == 5
        await publish(d, steady, ["more"])
        items, _, _ = await gather_items(s, 1)
        assert [it["body"] for it in items[steady]] == ["more"]
        # Unsubscribed: nothing of the topic follows the reply.
        reply = await s.request({"op": "unsubscribe", "topic": steady})
        assert reply["op"] == "unsubscribed" and "reason" not in reply
        await publish(d, steady, ["after"])
        await s.quiet(0.5)


async def test_several_subscriptions_resume_after_a_forced_disconnect(
    deployment: Deployment,
) -> None:
    d = deployment
    topics = [unique("resume") for _ in range(3)]
    for t in topics:
        await d.configure(t, history_size=100)
    positions: dict[str, tuple[str, int]] = {}
    s = await Socket.open(f"{d.sub.ws}/ws/", d.token)
    for t in topics:
        reply = await s.request({"op": "subscribe", "topic": t})
        positions[t] = (reply["epoch"], reply["offset"])
    for t in topics:
        await publish(d, t, [f"{t}-{n}" for n in range(3)])
    items, _, _ = await gather_items(s, 9)
    for t in topics:
        positions[t] = (positions[t][0], items[t][-1]["offset"])
    await s.abort()  # the network drops it
    for t in topics:
        await publish(d, t, [f"{t}-{n}" for n in range(3, 6)])
    async with await Socket.open(f"{d.sub.ws}/ws/", d.token) as s:
        for t in topics:
            epoch, offset = positions[t]
            frame = {"op": "subscribe", "topic": t, "since": offset, "epoch": epoch}
            reply = await s.request(frame)
            assert reply["op"] == "subscribed" and reply["recovered"] is True, reply
        items, _, _ = await gather_items(s, 9)
        for t in topics:
            assert [it["body"] for it in items[t]] == [f"{t}-{n}" for n in range(3, 6)]
        await s.quiet(0.3)


async def test_bad_input_is_one_error_and_harms_nothing_else(deployment: Deployment) -> None:
    d = deployment
    mine = unique("mine")
    narrow = d.pub.issue_token(f"subscribe:{mine}*", f"publish:{mine}*", name=unique("narrow"))
    async with await Socket.open(f"{d.sub.ws}/ws/", narrow) as s:
        assert (await s.request({"op": "subscribe", "topic": mine}))["op"] == "subscribed"
        bad: list[tuple[dict[str, Any], str]] = [
            ({"op": "subscribe", "topic": mine}, "invalid"),  # twice
            ({"op": "subscribe", "topic": "elsewhere"}, "forbidden"),
            ({"op": "subscribe", "topic": mine + "x", "capacity": 0}, "invalid"),
            ({"op": "subscribe", "topic": mine + "x", "on_full": "nope"}, "invalid"),
            ({"op": "subscribe", "topic": mine + "x", "since": 3}, "invalid"),
            ({"op": "subscribe", "topic": mine + "x", "credit": "lots"}, "bad_frame"),
            ({"op": "subscribe", "topic": "bad name"}, "invalid"),
            ({"op": "subscribe"}, "bad_frame"),
            ({"op": "unsubscribe", "topic": mine + "y"}, "invalid"),
            ({"op": "credit", "topic": mine + "y", "n": 5}, "invalid"),
            ({"op": "credit", "n": 5}, "invalid"),
            ({"op": "ack", "receipt": "x"}, "unknown_op"),
        ]
        for frame, code in bad:
            reply = await s.request(frame)
            assert (reply["op"], reply["code"]) == ("error", code), (frame, reply)
            assert reply["detail"]
        # Beyond GATEWAY_MAX_SUBSCRIPTIONS (120 here): one more is invalid.
        extra = [f"{mine}.{n}" for n in range(119)]
        replies = await asyncio.gather(*(s.request({"op": "subscribe", "topic": t}) for t in extra))
        assert {r["op"] for r in replies} == {"subscribed"}
        reply = await s.request({"op": "subscribe", "topic": mine + ".last"})
        assert (reply["op"], reply["code"]) == ("error", "invalid")
        assert "GATEWAY_MAX_SUBSCRIPTIONS" in reply["detail"]
        # The socket and its first subscription are unharmed.
        reply = await s.request({"op": "publish", "topic": mine, "body": "still here"})
        assert reply["op"] == "published"
        items, _, _ = await gather_items(s, 1)
        assert [it["body"] for it in items[mine]] == ["still here"]

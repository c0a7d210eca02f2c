"""The multiplexed socket ``/ws/`` and presence (docs/protocol.md, "The multiplexed
socket", "Presence").

Every test runs on two deployments: one gateway process on SQLite without
Redis, and two processes on PostgreSQL sharing a Redis, subscribing on B and
publishing on A. A process killed with SIGKILL has gateways of its own.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import InvalidStatus

from tests.support.clients import Socket, ahttp, unique
from tests.support.databases import postgres_database, postgres_unavailable, sqlite_database
from tests.support.gateways import GatewayProcess, gateways_on_redis
from tests.support.tokens import TEST_SIGNING_KEY, mint

#: Every deployment runs with these: a short block wait, a low subscription
#: limit, signed tokens.
SETTINGS = {
    "GATEWAY_BLOCK_WAIT": "1",
    "GATEWAY_MAX_SUBSCRIPTIONS": "120",
    "GATEWAY_SIGNING_KEY": TEST_SIGNING_KEY,
}


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


# -- presence


async def presence_of(gw: GatewayProcess, topic: str, token: str) -> dict[str, Any]:
    status, doc = await ahttp("GET", f"{gw.http}/api/topics/{topic}/presence", token)
    assert status == 200, doc
    return doc  # type: ignore[no-any-return]


def presence_gauge(gw: GatewayProcess, topic: str, token: str) -> float | None:
    """``leasecast_topic_presence{topic}`` in one scrape of ``gw``."""
    request = urllib.request.Request(f"{gw.http}/metrics")
    request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "leasecast_topic_presence" and sample.labels["topic"] == topic:
                return sample.value
    return None


async def next_presence(s: Socket, timeout: float = 10) -> dict[str, Any]:
    """The next join, leave or presence frame (other frames are not expected)."""
    frame = await s.next(timeout)
    assert frame["op"] in ("join", "leave", "presence"), frame
    return frame


def members(frame: dict[str, Any], kind: str = "joins") -> list[tuple[str, Any]]:
    """(user, info) of a join/leave frame, or of a presence frame's ``joins``/``leaves``."""
    if frame["op"] == "presence":
        return sorted((m["user"], m["info"]) for m in frame[kind])
    return [(frame["user"], frame.get("info"))]


async def test_presence_lists_every_subscription_and_tells_joins_and_leaves(
    deployment: Deployment,
) -> None:
    d = deployment
    topic = unique("room")
    await d.configure(topic, presence=True)
    assert await presence_of(d.pub, topic, d.token) == {"topic": topic, "count": 0, "clients": []}
    alice = mint("alice", [f"subscribe:{topic}"], info={"name": "Alice"})
    bob = mint("bob", [f"subscribe:{topic}"], info={"seat": 3})
    async with await Socket.open(f"{d.sub.ws}/ws/", alice) as watcher:
        reply = await watcher.request({"op": "subscribe", "topic": topic, "presence": True})
        assert reply["op"] == "subscribed"
        first = await next_presence(watcher)
        assert first["op"] == "presence" and first["topic"] == topic and first["leaves"] == []
        assert members(first) in ([], [("alice", {"name": "Alice"})])  # it may list itself
        # Bob on the other process, on a subscriber socket without presence events.
        other = await Socket.open(f"{d.pub.ws}/ws/topics/{topic}/", bob)
        joined = await next_presence(watcher)
        assert members(joined) == [("bob", {"seat": 3})]
        for gw in (d.pub, d.sub):
            doc = await presence_of(gw, topic, d.token)
            assert doc["count"] == 2
            assert [(c["user"], c["info"]) for c in doc["clients"]] == [
                ("alice", {"name": "Alice"}),
                ("bob", {"seat": 3}),
            ]
            assert len({c["client"] for c in doc["clients"]}) == 2
        for gw in (d.pub, d.sub):  # one scrape describes the deployment
            assert presence_gauge(gw, topic, d.token) == 2
        # Its own scope is enough to read the presence.
        assert (await presence_of(d.sub, topic, alice))["count"] == 2
        await other.close()
        left = await next_presence(watcher)
        assert left["op"] == "leave" and members(left) == [("bob", None)], left
        assert (await presence_of(d.pub, topic, d.token))["count"] == 1
        # Presence frames use no credit: a watcher with none still hears them.
        reply = await watcher.request({"op": "unsubscribe", "topic": topic})
        assert reply["op"] == "unsubscribed"
    assert (await presence_of(d.sub, topic, d.token))["count"] == 0


async def test_presence_refusals(deployment: Deployment) -> None:
    d = deployment
    plain = unique("plain")
    status, err = await ahttp("GET", f"{d.sub.http}/api/topics/{plain}/presence", d.token)
    assert (status, err["error"]) == (400, "invalid") and "presence" in err["detail"]
    async with await Socket.open(f"{d.sub.ws}/ws/", d.token) as s:
        reply = await s.request({"op": "subscribe", "topic": plain, "presence": True})
        assert (reply["op"], reply["code"]) == ("error", "invalid")
        reply = await s.request({"op": "subscribe", "topic": plain, "presence": "yes"})
        assert (reply["op"], reply["code"]) == ("error", "bad_frame")
        assert (await s.request({"op": "subscribe", "topic": plain}))["op"] == "subscribed"
    stranger = mint("eve", ["subscribe:elsewhere"])
    status, err = await ahttp("GET", f"{d.sub.http}/api/topics/{plain}/presence", stranger)
    assert (status, err["error"]) == (403, "forbidden")
    # An info claim that is no JSON object, or over 1 KiB, and the token is refused.
    for info in (["not", "an", "object"], {"pad": "x" * 1100}):
        token = mint("mallory", [f"subscribe:{plain}"], info=info)
        with pytest.raises(InvalidStatus) as refused:
            await Socket.open(f"{d.sub.ws}/ws/", token)
        assert refused.value.response.status_code == 403
        status, err = await ahttp("GET", f"{d.sub.http}/api/topics/{plain}/presence", token)
        assert status == 401


def told(frame: dict[str, Any], user: str) -> list[tuple[str, str]]:
    """("join" | "leave", member id) of ``user``'s members in a join, leave or presence frame."""
    if frame["op"] in ("join", "leave"):
        return [(frame["op"], frame["client"])] if frame["user"] == user else []
    found = [("join", m["client"]) for m in frame["joins"] if m["user"] == user]
    return found + [("leave", m["client"]) for m in frame["leaves"] if m["user"] == user]


async def test_short_memberships_are_told_as_a_join_and_a_leave_on_every_process(
    two: Deployment,
) -> None:
    """A subscription opened and closed at once on B: a watcher on A and one on B
    are each told its join and then its leave, however short it was."""
    d = two
    topic = unique("room")
    await d.configure(topic, presence=True)
    rounds = 20
    churner = mint("churner", [f"subscribe:{topic}"])
    watchers = []
    for gw in (d.pub, d.sub):
        watcher = await Socket.open(f"{gw.ws}/ws/", mint("watcher", [f"subscribe:{topic}"]))
        watchers.append(watcher)
        reply = await watcher.request({"op": "subscribe", "topic": topic, "presence": True})
        assert reply["op"] == "subscribed"
        assert (await next_presence(watcher))["op"] == "presence"
    try:
        async with await Socket.open(f"{d.sub.ws}/ws/", churner) as s:
            for _ in range(rounds):
                assert (await s.request({"op": "subscribe", "topic": topic}))["op"] == "subscribed"
                reply = await s.request({"op": "unsubscribe", "topic": topic})
                assert reply["op"] == "unsubscribed"
        for watcher in watchers:
            events: list[tuple[str, str]] = []
            while len(events) < 2 * rounds:
                events += told(await next_presence(watcher), "churner")
            joins = [c for kind, c in events if kind == "join"]
            assert len(set(joins)) == rounds, events
            # Each membership whole and in order: its join, then its leave.
            assert events == [(kind, c) for c in joins for kind in ("join", "leave")], events
    finally:
        for watcher in watchers:
            await watcher.close()


@pytest.mark.slow
async def test_a_killed_process_members_leave_within_30_seconds(
    redis_url: str, tmp_path: Path
) -> None:
    topic = unique("room")
    with gateways_on_redis(tmp_path, redis_url, GATEWAY_SIGNING_KEY=TEST_SIGNING_KEY) as (
        a,
        b,
        admin,
    ):
        for gw in (a, b):  # each has its own database
            status, _ = await ahttp(
                "PATCH", f"{gw.http}/api/topics/{topic}", admin, {"presence": True}
            )
            assert status == 200
        doomed = mint("doomed", [f"subscribe:{topic}"])
        watcher_token = mint("watcher", [f"subscribe:{topic}"])
        async with await Socket.open(f"{b.ws}/ws/", watcher_token) as watcher:
            reply = await watcher.request({"op": "subscribe", "topic": topic, "presence": True})
            assert reply["op"] == "subscribed"
            await next_presence(watcher)
            on_a = await Socket.open(f"{a.ws}/ws/", doomed)
            assert (await on_a.request({"op": "subscribe", "topic": topic}))["op"] == "subscribed"
            assert members(await next_presence(watcher)) == [("doomed", None)]
            assert (await presence_of(b, topic, admin))["count"] == 2
            a.kill()  # no goodbye: its member expires in Redis
            left = await next_presence(watcher, timeout=30)
            assert left["op"] == "leave" and members(left) == [("doomed", None)], left
            doc = await presence_of(b, topic, admin)
            assert [c["user"] for c in doc["clients"]] == ["watcher"]
            await on_a.abort()


# -- the Python client


async def test_python_multiplexer_resumes_its_topics_together_after_a_drop(
    deployment: Deployment,
) -> None:
    from leasecast import Multiplexer

    d = deployment
    topics = [unique("py") for _ in range(3)]
    for t in topics:
        await d.configure(t, history_size=100)
    async with Multiplexer(d.sub.http, token=d.token, backoff_max=0.5) as mux:
        subs = [await mux.subscribe(t, credit=4) for t in topics]
        first_link = mux.link
        for t in topics:
            await publish(d, t, [f"{t}-{n}" for n in range(10)])

        async def read(sub: Any, n: int) -> list[Any]:
            got = []
            async for message in sub:
                got.append(message.body)
                if len(got) == n:
                    return got
            raise AssertionError("iteration ended")

        got = await asyncio.wait_for(asyncio.gather(*(read(s, 5) for s in subs)), 20)
        assert got == [[f"{t}-{n}" for n in range(5)] for t in topics]
        first_link.conn.transport.abort()  # the network drops the one socket
        for t in topics:
            await publish(d, t, [f"{t}-{n}" for n in range(10, 12)])
        got = await asyncio.wait_for(asyncio.gather(*(read(s, 7) for s in subs)), 30)
        assert got == [[f"{t}-{n}" for n in (*range(5, 10), 10, 11)] for t in topics]
        assert mux.reconnects == 1 and mux.link is not first_link
        assert all(s.gaps == 0 for s in subs)


async def test_a_refresh_must_still_allow_every_subscription(deployment: Deployment) -> None:
    d = deployment
    kept, other = unique("kept"), unique("other")
    both = mint("carol", [f"subscribe:{kept}", f"subscribe:{other}"])
    async with await Socket.open(f"{d.sub.ws}/ws/", both) as s:
        for topic in (kept, other):
            assert (await s.request({"op": "subscribe", "topic": topic}))["op"] == "subscribed"
        narrower = mint("carol", [f"subscribe:{kept}"], ttl=120)
        reply = await s.request({"op": "refresh", "token": narrower})
        assert (reply["op"], reply["code"]) == ("error", "forbidden"), reply
        assert other in reply["detail"]
        reply = await s.request({"op": "unsubscribe", "topic": other})
        assert reply["op"] == "unsubscribed"
        reply = await s.request({"op": "refresh", "token": narrower})
        assert reply["op"] == "refreshed", reply


async def test_python_multiplexer_presence_callbacks_and_document(deployment: Deployment) -> None:
    from leasecast import Multiplexer

    d = deployment
    room = unique("room")
    await d.configure(room, presence=True)
    joined: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    left: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    me = mint("dana", [f"subscribe:{room}"], info={"role": "host"})
    async with Multiplexer(d.sub.http, token=me) as mux:
        sub = await mux.subscribe(
            room, presence=True, on_join=joined.put_nowait, on_leave=left.put_nowait
        )
        # The first presence frame may list the subscription itself.
        guest = mint("erin", [f"subscribe:{room}"], info={"role": "guest"})
        async with await Socket.open(f"{d.pub.ws}/ws/topics/{room}/", guest):
            while True:
                member = await asyncio.wait_for(joined.get(), 10)
                if member["user"] == "erin":
                    break
            assert member["info"] == {"role": "guest"}
            assert "erin" in {m["user"] for m in sub.members.values()}
            doc = await mux.presence(room)
            assert doc["count"] == 2
            assert {(c["user"], str(c["info"])) for c in doc["clients"]} == {
                ("dana", str({"role": "host"})),
                ("erin", str({"role": "guest"})),
            }
        gone = await asyncio.wait_for(left.get(), 10)
        assert gone["user"] == "erin"
        assert "erin" not in {m["user"] for m in sub.members.values()}


async def test_a_multiplexed_socket_that_stops_reading_applies_each_policy(one: Deployment) -> None:
    """Its transport full, every subscription's buffer stops draining: each one's
    capacity and policy apply, and a socket that reads gets everything."""
    from websockets.asyncio.client import connect

    d = one
    oldest, newest = unique("stall-old"), unique("stall-new")
    stalled = await connect(
        f"{d.sub.ws}/ws/",
        additional_headers={"Authorization": f"Bearer {d.token}"},
        ping_interval=None,
        compression=None,
    )
    for topic, policy in ((oldest, "drop_oldest"), (newest, "drop_newest")):
        frame = {"op": "subscribe", "topic": topic, "capacity": 50, "on_full": policy}
        await stalled.send(json.dumps({**frame, "credit": 1_000_000_000}))
        assert json.loads(await stalled.recv())["op"] == "subscribed"
    stalled.transport.pause_reading()  # reads nothing more, not even pings
    publishes, pad = 3000, "x" * 8192
    async with await Socket.open(f"{d.sub.ws}/ws/", d.token) as reader:
        for topic in (oldest, newest):
            frame = {"op": "subscribe", "topic": topic, "credit": 1_000_000_000}
            assert (await reader.request(frame))["op"] == "subscribed"
        async with await Socket.open(f"{d.pub.ws}/ws/produce/", d.token) as producer:
            for start in range(0, publishes, 200):
                replies = await asyncio.gather(
                    *(
                        producer.request({"op": "publish", "topic": t, "body": [i, pad]}, 60)
                        for i in range(start, start + 200)
                        for t in (oldest, newest)
                    )
                )
                assert {r["op"] for r in replies} == {"published"}
        items, dropped, _ = await gather_items(reader, 2 * publishes, timeout=60)
        for topic in (oldest, newest):
            assert [it["body"][0] for it in items[topic]] == list(range(publishes))
            assert dropped[topic] == 0
    status, snapshot = await ahttp("GET", f"{d.sub.http}/api/stats", d.token)
    assert status == 200
    (carried,) = [
        {t["topic"]: t for t in s["topics"]}
        for s in snapshot["sockets"]
        if s["kind"] == "multiplex" and oldest in {t["topic"] for t in s["topics"]}
    ]
    for topic, dropped_by in ((oldest, "dropped_oldest"), (newest, "dropped_newest")):
        sub = carried[topic]
        assert sub["buffered"] == 50, sub  # full: its transport took no more
        assert sub[dropped_by] > 0, sub
        assert sub["delivered"] + sub["buffered"] + sub["dropped"] == publishes, sub
    stalled.transport.abort()


async def test_a_topic_whose_offsets_restart_ends_only_its_subscription(
    two: Deployment, redis_url: str
) -> None:
    """Redis loses one topic's data: on /ws/ that subscription ends with
    ``stream_restarted`` (a subscriber socket would be closed with 4409)."""
    import redis

    d = two
    lost, kept = unique("lost"), unique("kept")
    async with await Socket.open(f"{d.sub.ws}/ws/", d.token) as s:
        for topic in (lost, kept):
            assert (await s.request({"op": "subscribe", "topic": topic}))["op"] == "subscribed"
        await publish(d, lost, ["before"])
        items, _, _ = await gather_items(s, 1)
        assert [it["body"] for it in items[lost]] == ["before"]
        prefix = d.pub.env["GATEWAY_REDIS_PREFIX"]
        client = redis.Redis.from_url(redis_url)
        client.delete(f"{prefix}:topic:{lost}:meta", f"{prefix}:topic:{lost}:stream")
        await publish(d, lost, ["after"])  # a new epoch, seen by the subscribing process
        ended = await s.next(timeout=20)
        assert ended == {"op": "unsubscribed", "topic": lost, "reason": "stream_restarted"}
        await publish(d, kept, ["still"])
        items, _, _ = await gather_items(s, 1)
        assert dict(items) == {kept: [items[kept][0]]}
        assert items[kept][0]["body"] == "still"
        # Subscribed again, it is in the new epoch.
        again = await s.request({"op": "subscribe", "topic": lost})
        assert again["op"] == "subscribed" and again["offset"] >= 1


async def test_a_flood_of_bad_frames_gets_one_error_each_in_order(one: Deployment) -> None:
    """Thousands of bad subscription frames sent without waiting: one error each, in
    order, and the socket's subscription still delivers afterwards."""
    from websockets.asyncio.client import connect

    d = one
    topic = unique("flood")
    bad = [
        lambda i: {"op": "subscribe", "topic": 5, "ref": i},
        lambda i: {"op": "subscribe", "topic": topic, "ref": i},  # subscribed already
        lambda i: {"op": "subscribe", "topic": f"{topic}x", "capacity": -1, "ref": i},
        lambda i: {"op": "subscribe", "topic": f"{topic}x", "presence": 1, "ref": i},
        lambda i: {"op": "unsubscribe", "topic": f"{topic}-{i}", "ref": i},
        lambda i: {"op": "credit", "n": 5, "ref": i},
        lambda i: {"op": "credit", "topic": "not this one", "n": 5, "ref": i},
        lambda i: {"op": "unsubscribe", "ref": i},
    ]
    n = 2000
    async with connect(
        f"{d.sub.ws}/ws/", additional_headers={"Authorization": f"Bearer {d.token}"}
    ) as ws:
        await ws.send(json.dumps({"op": "subscribe", "topic": topic, "ref": "first"}))
        assert json.loads(await ws.recv())["op"] == "subscribed"
        for i in range(n):
            await ws.send(json.dumps(bad[i % len(bad)](i)))
        replies = [json.loads(await asyncio.wait_for(ws.recv(), 30)) for _ in range(n)]
        assert [r["ref"] for r in replies] == list(range(n))
        assert {r["op"] for r in replies} == {"error"}
        assert {r["code"] for r in replies} == {"bad_frame", "invalid"}
        await publish(d, topic, ["after the flood"])
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert frame["op"] == "messages" and frame["items"][0]["body"] == "after the flood"


async def test_a_subscriber_socket_asks_presence_in_its_url(deployment: Deployment) -> None:
    d = deployment
    room = unique("room")
    await d.configure(room, presence=True)
    frank = mint("frank", [f"subscribe:{room}"])
    async with await Socket.open(f"{d.sub.ws}/ws/topics/{room}/?presence=true", frank) as s:
        first = await next_presence(s)
        assert first["op"] == "presence" and members(first) in ([], [("frank", None)])
        async with await Socket.open(f"{d.pub.ws}/ws/", d.token) as other:
            assert (await other.request({"op": "subscribe", "topic": room}))["op"] == "subscribed"
            joined = await next_presence(s)
            assert joined["op"] == "join" and joined["user"] == "admin", joined
        left = await next_presence(s)
        assert left["op"] == "leave" and left["client"] == joined["client"], left
    # A topic without presence refuses the parameter: invalid, closed with 4400.
    plain = unique("plain")
    async with await Socket.open(f"{d.sub.ws}/ws/topics/{plain}/?presence=true", d.token) as s:
        refusal = await s.next()
        assert (refusal["op"], refusal["code"]) == ("error", "invalid")
        with pytest.raises(ConnectionError):
            await s.next()
        assert s.conn.close_code == 4400

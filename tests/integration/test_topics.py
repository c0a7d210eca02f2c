"""Topics: offsets, history and resume (protocol 1.1: Topics: history, offsets and resume).

Every test runs on two deployments: one gateway process without Redis (offsets
and history in the process), and two processes sharing a Redis (the topic's
Redis stream), publishing on A and subscribing on B.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.clients import Socket, ahttp, unique
from tests.support.databases import postgres_database, postgres_unavailable, sqlite_database
from tests.support.gateways import GatewayProcess


@dataclass
class Deployment:
    """Where to publish and where to subscribe (the same process, or A and B)."""

    name: str
    pub: GatewayProcess
    sub: GatewayProcess
    token: str
    redis_url: str | None = None


@pytest.fixture(scope="module")
def one() -> Iterator[Deployment]:
    var = Path(tempfile.mkdtemp(prefix="leasecast-topics-one-"))
    with sqlite_database(var) as env:
        gw = GatewayProcess(env, var, name="one")
        gw.start()
        try:
            yield Deployment("one", gw, gw, gw.issue_token("admin", name="admin"))
        finally:
            gw.stop()


@pytest.fixture(scope="module")
def two(redis_url: str) -> Iterator[Deployment]:
    """Processes A and B sharing PostgreSQL (the topics' settings) and Redis (their streams)."""
    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    var = Path(tempfile.mkdtemp(prefix="leasecast-topics-two-"))
    with postgres_database(var) as env:
        env.update(REDIS_URL=redis_url, GATEWAY_REDIS_PREFIX=f"lct{unique('p')}")
        a = GatewayProcess(env, var, name="a")
        b = GatewayProcess(env, var, name="b")
        a.start()
        try:
            b.start()
            yield Deployment("two", a, b, a.issue_token("admin", name="admin"), redis_url)
        finally:
            a.stop()
            b.stop()


@pytest.fixture(params=["one", "two"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


async def configure(d: Deployment, topic: str, **settings: Any) -> dict[str, Any]:
    status, doc = await ahttp("PATCH", f"{d.pub.http}/api/topics/{topic}", d.token, settings)
    assert status == 200, doc
    # The other process reads settings again within GATEWAY_QUEUE_SETTINGS_TTL (2 s).
    if d.sub is not d.pub:
        await asyncio.sleep(2.1)
    return doc  # type: ignore[no-any-return]


async def subscribe(d: Deployment, topic: str, **params: Any) -> Socket:
    query = "&".join(f"{k}={v}" for k, v in {"credit": 1_000_000, **params}.items())
    return await Socket.open(f"{d.sub.ws}/ws/topics/{topic}/?{query}", d.token)


async def publish(p: Socket, topic: str, body: Any) -> dict[str, Any]:
    reply = await p.request({"op": "publish", "topic": topic, "body": body}, timeout=20)
    assert reply["op"] == "published", reply
    return reply


async def offsets(s: Socket, n: int, timeout: float = 20) -> list[int]:
    """The offsets of the next ``n`` items (asserting no drop and bodies equal to offsets)."""
    got: list[int] = []
    while len(got) < n:
        frame = await s.next(timeout)
        assert frame["op"] == "messages", frame
        assert frame["dropped"] == 0, frame
        for item in frame["items"]:
            assert item["body"] == {"o": item["offset"]} or "o" not in item["body"], item
            got.append(item["offset"])
    return got


async def publish_numbered(p: Socket, topic: str, n: int) -> list[int]:
    """Publish ``n`` messages whose body names their offset's predecessor count; return offsets."""
    out = []
    for _ in range(n):
        reply = await publish(p, topic, {"n": len(out)})
        out.append(reply["offset"])
    return out


async def warm(d: Deployment, p: Socket, topic: str) -> dict[str, Any]:
    """Publish until a subscriber on the subscribing process hears it (B follows the topic)."""
    async with await subscribe(d, topic) as s:
        reply = await publish(p, topic, {"warm": True})
        frame = await s.next(timeout=20)
        assert frame["items"][-1]["offset"] == reply["offset"]
    return reply


# -- offsets


async def test_published_replies_and_items_carry_offset_and_epoch(deployment: Deployment) -> None:
    d = deployment
    topic = unique("t")
    async with (
        await subscribe(d, topic) as s,
        await Socket.open(f"{d.pub.ws}/ws/produce/", d.token) as p,
    ):
        first = await publish(p, topic, 0)
        # Another process (or this one) may need a moment to follow the topic:
        # what it dispatches is in offset order from whatever it starts at.
        replies = [first] + [await publish(p, topic, i) for i in range(1, 20)]
        assert {r["epoch"] for r in replies} == {first["epoch"]}
        assert [r["offset"] for r in replies] == list(range(first["offset"], first["offset"] + 20))
        assert all(r["seq"] == r["offset"] for r in replies)
        seen: list[int] = []
        while not seen or seen[-1] < replies[-1]["offset"]:
            frame = await s.next(timeout=20)
            seen += [it["offset"] for it in frame["items"]]
        assert seen == sorted(seen) and len(seen) == len(set(seen))
        assert seen[-20:] == [r["offset"] for r in replies][-len(seen[-20:]) :]
        status, doc = await ahttp("GET", f"{d.sub.http}/api/topics/{topic}", d.token)
        assert status == 200
        assert doc == {
            "name": topic,
            "history_size": 0,
            "history_ttl": 300.0,
            "presence": False,
            "epoch": first["epoch"],
            "offset": replies[-1]["offset"],
        }


async def test_two_producers_on_two_processes_share_one_sequence(two: Deployment) -> None:
    d = two
    topic = unique("t")
    async with (
        await Socket.open(f"{d.pub.ws}/ws/produce/", d.token) as pa,
        await Socket.open(f"{d.sub.ws}/ws/produce/", d.token) as pb,
        await subscribe(d, topic) as s,
    ):
        await warm(d, pa, topic)

        async def burst(p: Socket, name: str) -> list[int]:
            return [(await publish(p, topic, {name: i}))["offset"] for i in range(100)]

        got_a, got_b = await asyncio.gather(burst(pa, "a"), burst(pb, "b"))
        every = sorted(got_a + got_b)
        assert every == list(range(every[0], every[0] + 200))  # one sequence, no hole
        seen: list[int] = []
        while len(seen) < 200:
            frame = await s.next(timeout=20)
            seen += [it["offset"] for it in frame["items"] if it["offset"] >= every[0]]
        assert seen == every  # in offset order on B, each once


# -- settings


async def test_topic_settings_patch_and_bad_values(deployment: Deployment) -> None:
    d = deployment
    topic = unique("t")
    url = f"{d.pub.http}/api/topics/{topic}"
    status, doc = await ahttp("PATCH", url, d.token, {"history_size": 50, "history_ttl": 60})
    assert status == 200 and (doc["history_size"], doc["history_ttl"]) == (50, 60.0)
    for bad in ({"history_size": -1}, {"history_ttl": 0}, {"nope": 1}, {"history_size": "x"}):
        status, err = await ahttp("PATCH", url, d.token, bad)
        assert status == 400 and err["error"] in ("invalid", "bad_frame"), err
    status, doc = await ahttp("GET", url, d.token)
    assert (doc["history_size"], doc["history_ttl"]) == (50, 60.0)  # nothing changed
    other = d.pub.issue_token(f"subscribe:{topic}", name="sub-only")
    assert (await ahttp("GET", url, other))[0] == 200
    assert (await ahttp("PATCH", url, other, {"history_size": 1}))[0] == 403
    stranger = d.pub.issue_token("subscribe:elsewhere", name="stranger")
    assert (await ahttp("GET", url, stranger))[0] == 403
    assert (await ahttp("GET", f"{url}/history", stranger))[0] == 403


# -- resume


async def test_resume_after_a_missed_burst_gets_every_offset_once(deployment: Deployment) -> None:
    d = deployment
    topic = unique("t")
    await configure(d, topic, history_size=1000)
    async with await Socket.open(f"{d.pub.ws}/ws/produce/", d.token) as p:
        start = await warm(d, p, topic)
        epoch, last = start["epoch"], start["offset"]
        missed = await publish_numbered(p, topic, 300)  # nobody subscribed
        async with await subscribe(d, topic, since=last, epoch=epoch) as s:
            hello = await s.next(timeout=20)
            assert hello == {
                "op": "subscribed",
                "topic": topic,
                "epoch": epoch,
                "offset": missed[-1],
                "recovered": True,
            }
            assert await offsets(s, 300) == missed
            live = await publish_numbered(p, topic, 20)
            assert await offsets(s, 20) == live  # no gap, no duplicate at the seam
            await s.quiet(0.3)


async def test_resume_while_publishes_continue_has_no_gap_and_no_duplicate(
    deployment: Deployment,
) -> None:
    d = deployment
    topic = unique("t")
    await configure(d, topic, history_size=10_000)
    async with await Socket.open(f"{d.pub.ws}/ws/produce/", d.token) as p:
        start = await warm(d, p, topic)
        sent: list[int] = []
        stop = asyncio.Event()

        async def keep_publishing() -> None:
            while not stop.is_set():
                sent.append((await publish(p, topic, {"k": len(sent)}))["offset"])

        publisher = asyncio.create_task(keep_publishing())
        epoch, position, seen = start["epoch"], start["offset"], []
        try:
            for _ in range(4):  # disconnect and resume four times under load
                async with await subscribe(d, topic, since=position, epoch=epoch) as s:
                    hello = await s.next(timeout=20)
                    assert hello["recovered"] is True, hello
                    for _ in range(3):
                        frame = await s.next(timeout=20)
                        assert frame["dropped"] == 0
                        seen += [it["offset"] for it in frame["items"]]
                position = seen[-1]
                await asyncio.sleep(0.05)  # publishes go on while nobody listens
        finally:
            stop.set()
            await publisher
        assert seen == list(range(start["offset"] + 1, seen[-1] + 1))
        assert set(seen) <= set(sent)


async def test_resume_from_another_epoch_or_beyond_history_is_not_recovered(
    deployment: Deployment,
) -> None:
    d = deployment
    topic = unique("t")
    await configure(d, topic, history_size=10)
    async with await Socket.open(f"{d.pub.ws}/ws/produce/", d.token) as p:
        start = await warm(d, p, topic)
        await publish_numbered(p, topic, 30)  # more than the 10 kept
        for since, epoch in ((start["offset"], start["epoch"]), (1, "not-the-epoch")):
            async with await subscribe(d, topic, since=since, epoch=epoch) as s:
                hello = await s.next(timeout=20)
                assert hello["recovered"] is False and hello["epoch"] == start["epoch"], hello
                live = await publish_numbered(p, topic, 3)
                assert await offsets(s, 3) == live  # only live messages follow
        status, page = await ahttp(
            "GET", f"{d.sub.http}/api/topics/{topic}/history?limit=1000", d.token
        )
        assert status == 200 and len(page["items"]) == 10
        kept = [it["offset"] for it in page["items"]]
        assert kept == list(range(page["offset"] - 9, page["offset"] + 1))


async def test_history_ttl_forgets_old_messages(deployment: Deployment) -> None:
    d = deployment
    topic = unique("t")
    await configure(d, topic, history_size=100, history_ttl=1)
    async with await Socket.open(f"{d.pub.ws}/ws/produce/", d.token) as p:
        start = await warm(d, p, topic)
        await publish_numbered(p, topic, 5)
        await asyncio.sleep(1.5)
        async with await subscribe(d, topic, since=start["offset"], epoch=start["epoch"]) as s:
            hello = await s.next(timeout=20)
            assert hello["recovered"] is False, hello
        status, page = await ahttp("GET", f"{d.sub.http}/api/topics/{topic}/history", d.token)
        assert status == 200 and page["items"] == []
        fresh = await publish_numbered(p, topic, 2)
        status, page = await ahttp(
            "GET", f"{d.sub.http}/api/topics/{topic}/history?since={fresh[0]}", d.token
        )
        assert [it["offset"] for it in page["items"]] == fresh[1:]


async def test_cache_mode_sends_the_latest_message_then_live(deployment: Deployment) -> None:
    d = deployment
    topic = unique("t")
    await configure(d, topic, history_size=5)
    async with await Socket.open(f"{d.pub.ws}/ws/produce/", d.token) as p:
        await warm(d, p, topic)
        sent = await publish_numbered(p, topic, 4)
        async with await subscribe(d, topic, recover="latest") as s:
            hello = await s.next(timeout=20)
            assert hello["recovered"] is True and hello["offset"] == sent[-1], hello
            assert await offsets(s, 1) == [sent[-1]]
            live = await publish_numbered(p, topic, 2)
            assert await offsets(s, 2) == live
    empty = unique("t")
    async with await subscribe(d, empty, recover="latest") as s:
        hello = await s.next(timeout=20)
        assert (hello["recovered"], hello["offset"]) == (False, 0)


async def test_bad_resume_parameters_are_refused(deployment: Deployment) -> None:
    d = deployment
    for query in ("since=3", "epoch=x", "since=-1&epoch=x", "since=x&epoch=y", "recover=all",
                  "recover=latest&since=1&epoch=x"):  # fmt: skip
        async with await Socket.open(f"{d.sub.ws}/ws/topics/t/?{query}", d.token) as s:
            frame = await s.next(timeout=10)
            assert frame["op"] == "error" and frame["code"] == "invalid", (query, frame)
            await asyncio.wait_for(s.reader, 10)
            assert s.conn.close_code == 4400


async def test_an_epoch_change_closes_subscribers_and_resume_is_not_recovered(
    two: Deployment,
) -> None:
    """Redis loses the topic's data: its subscribers are closed (4409), never shown a
    gap as continuous, and resuming from before is ``recovered: false``."""
    d = two
    topic = unique("t")
    await configure(d, topic, history_size=100)
    async with await Socket.open(f"{d.pub.ws}/ws/produce/", d.token) as p:
        start = await warm(d, p, topic)
        async with await subscribe(d, topic, since=start["offset"], epoch=start["epoch"]) as s:
            assert (await s.next(timeout=20))["recovered"] is True
            await publish_numbered(p, topic, 5)
            assert len(await offsets(s, 5)) == 5
            # What a Redis restart without persistence does to this topic.
            assert d.redis_url is not None
            client = redis.Redis.from_url(d.redis_url)
            prefix = d.pub.env["GATEWAY_REDIS_PREFIX"]
            client.delete(f"{prefix}:topic:{topic}:meta", f"{prefix}:topic:{topic}:stream")
            reply = await publish(p, topic, {"after": "loss"})
            assert reply["epoch"] != start["epoch"] and reply["offset"] == 1
            with pytest.raises(ConnectionError):
                while True:  # anything still queued, then the close
                    frame = await s.next(timeout=20)
                    assert all(it["body"] != {"after": "loss"} for it in frame["items"])
            assert s.conn.close_code == 4409
        async with await subscribe(d, topic, since=start["offset"] + 5, epoch=start["epoch"]) as s:
            hello = await s.next(timeout=20)
            assert hello["recovered"] is False and hello["epoch"] == reply["epoch"], hello


# -- coalescing


async def test_a_published_batch_reaches_a_keeping_up_subscriber_in_a_few_frames(
    deployment: Deployment,
) -> None:
    d = deployment
    topic = unique("t")
    async with (
        await Socket.open(f"{d.pub.ws}/ws/produce/", d.token) as p,
    ):
        await warm(d, p, topic)
        async with await subscribe(d, topic, capacity=10_000) as s:
            await publish(p, topic, "fence")
            assert (await s.next(timeout=20))["items"][-1]["body"] == "fence"
            bodies = [{"body": i} for i in range(500)]
            status, _ = await ahttp(
                "POST", f"{d.pub.http}/api/topics/{topic}/messages", d.token, {"messages": bodies}
            )
            assert status == 200
            frames, got = 0, []
            while len(got) < 500:
                frame = await s.next(timeout=20)
                frames += 1
                got += [it["body"] for it in frame["items"]]
            assert got == list(range(500))
            assert frames <= 5, frames


async def test_three_hundred_subscribers_opening_at_once_are_all_accepted(two: Deployment) -> None:
    """Each reads its topic's head in Redis: the pool waits for a free connection
    instead of refusing. bench/topics.py saw two thirds of 100 answered
    ``unavailable: Too many connections`` on a loaded machine; this quiet run
    did not reproduce it without the waiting pool, so it guards the outcome."""
    d = two
    topic = unique("t")
    await configure(d, topic, history_size=100)
    sockets = await asyncio.gather(*[subscribe(d, topic, recover="latest") for _ in range(300)])
    try:
        hellos = await asyncio.gather(*[s.next(timeout=30) for s in sockets])
        assert [h["op"] for h in hellos] == ["subscribed"] * 300, hellos[:3]
    finally:
        await asyncio.gather(*[s.close() for s in sockets])


async def test_a_replay_sends_no_more_than_the_credit_and_every_offset_once(
    deployment: Deployment,
) -> None:
    """2,500 missed, credit 1,500: a read of 1,000, then (read ahead while the
    first is sent) the 500 the credit leaves; nothing more until credit comes,
    then the rest and the live stream, each offset once and in order."""
    d = deployment
    topic = unique("t")
    await configure(d, topic, history_size=10_000)
    async with await Socket.open(f"{d.pub.ws}/ws/produce/", d.token) as p:
        start = await warm(d, p, topic)
        epoch, last = start["epoch"], start["offset"]
        replies = await asyncio.gather(*(publish(p, topic, {"m": i}) for i in range(2500)))
        head = max(r["offset"] for r in replies)
        assert head == last + 2500
        async with await subscribe(d, topic, since=last, epoch=epoch, credit=1500) as s:
            hello = await s.next(timeout=20)
            assert hello["recovered"] is True and hello["offset"] == head, hello
            first = await offsets(s, 1500)
            await s.quiet(0.5)  # the credit is spent: nothing more
            assert first == list(range(last + 1, last + 1501))
            await s.send({"op": "credit", "n": 10_000})
            rest = await offsets(s, 1000)
            assert rest == list(range(last + 1501, head + 1))
            live = await publish_numbered(p, topic, 5)
            assert await offsets(s, 5) == live
            await s.quiet(0.3)

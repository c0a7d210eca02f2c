"""Two gateway processes sharing topics through one real Redis (design decision 7).

Publishers are on process A; subscribers of every policy are on both A and B,
so each policy is checked for local delivery (A) and relayed delivery (B).
Topics never touch the database, so each process has its own SQLite file (one
file per process, as docs/operations.md demands) holding the same token: these
tests need Redis and nothing else.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import Socket, ahttp, b_hears_a, collect, publish, unique
from tests.support.gateways import GatewayProcess, gateways_on_redis

BLOCK = "block"


@pytest.fixture(scope="module")
def cluster(redis_url: str) -> Iterator[tuple[GatewayProcess, GatewayProcess, str]]:
    """Gateways A and B on one Redis, with tiny topic streams, and an admin token."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-scaleout-"))
    # Topic streams that keep 20 entries, so the tests can make a reader fall behind.
    with gateways_on_redis(
        var, redis_url, GATEWAY_TOPIC_RELAY_WINDOW="20", GATEWAY_BLOCK_WAIT="1"
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def pair(
    cluster: tuple[GatewayProcess, GatewayProcess, str],
) -> tuple[GatewayProcess, GatewayProcess]:
    return cluster[0], cluster[1]


@pytest.fixture(scope="module")
def token(cluster: tuple[GatewayProcess, GatewayProcess, str]) -> str:
    return cluster[2]


async def sub(gw: GatewayProcess, token: str, topic: str, **params: object) -> Socket:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return await Socket.open(f"{gw.ws}/ws/topics/{topic}/?{query}", token)


def in_order(items: list[dict[str, Any]]) -> list[Any]:
    """The bodies of ``items``, after checking that their seqs increase strictly."""
    seqs = [it["seq"] for it in items]
    assert all(x < y for x, y in itertools.pairwise(seqs)), seqs
    return [it["body"] for it in items]


async def until_closed(s: Socket) -> tuple[list[Any], int]:
    """Every body and drop reported to ``s`` until the gateway closes it."""
    bodies: list[Any] = []
    dropped = 0
    while True:
        try:
            frame = await s.next(timeout=20)
        except ConnectionError:
            return bodies, dropped
        assert frame["op"] == "messages", frame
        bodies += in_order(frame["items"])
        dropped += frame["dropped"]


async def trickle(s: Socket, n: int) -> tuple[list[Any], int]:
    """Read ``n`` messages granting one credit at a time: a reader slower than the publisher."""
    items: list[dict[str, Any]] = []
    dropped = 0
    while len(items) < n:
        await s.send({"op": "credit", "n": 1})
        frame = await s.next(timeout=20)
        assert frame["op"] == "messages", frame
        items += frame["items"]
        dropped += frame["dropped"]
    return in_order(items), dropped


async def socket_rows(gw: GatewayProcess, token: str, topic: str) -> list[dict[str, Any]]:
    """The live state of ``gw``'s subscriber sockets of ``topic``."""
    status, stats = await ahttp("GET", f"{gw.http}/api/stats", token)
    assert status == 200, stats
    return [s for s in stats["sockets"] if s.get("topic") == topic]


async def test_every_drop_policy_on_both_processes(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    a, b = pair
    topic = unique("t")
    n = 10
    async with (
        await sub(b, token, topic) as plain_b,
        await Socket.open(f"{a.ws}/ws/produce/", token) as p,
    ):
        await b_hears_a(p, topic, plain_b)
        async with (
            await sub(a, token, topic) as plain_a,
            await sub(a, token, topic, capacity=3, credit=0) as oldest_a,
            await sub(b, token, topic, capacity=3, credit=0) as oldest_b,
            await sub(a, token, topic, capacity=3, credit=0, on_full="drop_newest") as newest_a,
            await sub(b, token, topic, capacity=3, credit=0, on_full="drop_newest") as newest_b,
        ):
            for i in range(n):
                await publish(p, topic, i)
            # Unlimited subscribers on both get everything, in order. B fans a
            # relayed message out to all its buffers at once, so once plain_b
            # has all ten, so have B's small buffers.
            for s in (plain_a, plain_b):
                items, dropped = await collect(s, n)
                assert in_order(items) == list(range(n)) and dropped == 0
            for s in (oldest_a, oldest_b, newest_a, newest_b):
                await s.send({"op": "credit", "n": n})
            for s in (oldest_a, oldest_b):  # the 3 newest, the 7 older ones counted
                items, dropped = await collect(s, 3)
                assert (in_order(items), dropped) == ([7, 8, 9], 7)
            for s in (newest_a, newest_b):  # the 3 oldest, the 7 newer ones counted
                items, dropped = await collect(s, 3)
                assert (in_order(items), dropped) == ([0, 1, 2], 7)
            for s in (oldest_a, oldest_b, newest_a, newest_b):
                await s.quiet(0.3)  # nothing more: no repeat, no late drop report
            # Each process counted its own sockets' drops by cause.
            for gw in (a, b):
                rows = await socket_rows(gw, token, topic)
                counts = sorted(
                    (r["policy"], r["capacity"], r["dropped_oldest"], r["dropped_newest"])
                    for r in rows
                )
                assert counts == [
                    ("drop_newest", 3, 0, 7),
                    ("drop_oldest", 3, 7, 0),
                    ("drop_oldest", 1024, 0, 0),
                ], (gw.name, rows)
                assert all(r["dropped_relay"] == 0 for r in rows), rows


async def test_block_subscribers_on_both_processes_get_all_in_order_or_4008(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    a, b = pair
    topic = unique("t")
    n = 8
    async with (
        await sub(b, token, topic) as plain_b,
        await Socket.open(f"{a.ws}/ws/produce/", token) as p,
    ):
        await b_hears_a(p, topic, plain_b)
        async with (
            await sub(a, token, topic, capacity=2, credit=0, on_full=BLOCK) as patient_a,
            await sub(b, token, topic, capacity=2, credit=0, on_full=BLOCK) as patient_b,
            await sub(a, token, topic, capacity=2, credit=0, on_full=BLOCK) as stuck_a,
            await sub(b, token, topic, capacity=2, credit=0, on_full=BLOCK) as stuck_b,
        ):
            # The patient ones read one at a time, so publishes wait for their
            # room; the stuck ones never grant credit: after the block wait
            # (1 s) each is closed with 4008 and the publishes go on.
            readers = [asyncio.create_task(trickle(s, n)) for s in (patient_a, patient_b)]
            for i in range(n):
                await publish(p, topic, i)
            for got, dropped in await asyncio.gather(*readers):
                assert (got, dropped) == (list(range(n)), 0)
            for s in (stuck_a, stuck_b):
                await asyncio.wait_for(s.reader, 20)
                assert s.conn.close_code == 4008
            items, dropped = await collect(plain_b, n)
            assert (in_order(items), dropped) == (list(range(n)), 0)
            # The patient ones were never cut off, and nothing more comes.
            for s in (patient_a, patient_b):
                await s.quiet(0.3)


async def test_relay_overflow_disconnects_block_and_counts_drops_never_a_silent_gap(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    a, b = pair
    topic = unique("t")
    total = 500
    counter_b = await sub(b, token, topic, capacity=10_000, credit=1_000_000)
    p = await Socket.open(f"{a.ws}/ws/produce/", token)
    await b_hears_a(p, topic, counter_b)
    # B's stream reader stalls behind a full block subscriber for the 1 s block
    # wait, while A publishes far more than the topic's stream keeps (20).
    blocker_b = await sub(b, token, topic, capacity=1, credit=0, on_full=BLOCK)
    # A block subscriber on B that always has room: it must not get a gap
    # either, so the relay's loss disconnects it.
    roomy_b = await sub(b, token, topic, capacity=10_000, credit=1_000_000, on_full=BLOCK)
    # On A, where the publish happens, nothing is lost, whatever B suffers.
    counter_a = await sub(a, token, topic, capacity=10_000, credit=1_000_000)
    roomy_a = await sub(a, token, topic, capacity=10_000, credit=1_000_000, on_full=BLOCK)
    bodies = [{"body": i} for i in range(total)]
    status, reply = await ahttp(
        "POST", f"{a.http}/api/topics/{topic}/messages", token, {"messages": bodies}
    )
    assert (status, reply) == (200, {"published": total})
    await asyncio.wait_for(blocker_b.reader, 20)
    assert blocker_b.conn.close_code == 4008
    got: list[int] = []
    dropped = 0
    while len(got) + dropped < total:
        frame = await counter_b.next(timeout=20)
        got += in_order(frame["items"])
        dropped += frame["dropped"]
    assert dropped > 0  # the relay lost messages, and said so
    assert got == sorted(got) and len(got) + dropped == total
    # The roomy block subscriber on B got a gapless start, then 4008: never a silent gap.
    before, roomy_dropped = await until_closed(roomy_b)
    assert roomy_b.conn.close_code == 4008
    assert before == list(range(len(before))) and roomy_dropped == 0
    _, stats = await ahttp("GET", f"{b.http}/api/stats", token)
    assert stats["process"]["relay"]["lost"] >= dropped
    for s in (counter_a, roomy_a):
        items, lost = await collect(s, total)
        assert (in_order(items), lost) == (list(range(total)), 0)
        await s.quiet(0.3)  # still open: A's block subscriber was never cut off
    for s in (counter_b, p, counter_a, roomy_a):
        await s.close()


async def test_dashboard_shows_and_disconnects_sockets_of_every_process(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    a, b = pair
    topic = unique("t")
    async with (
        await Socket.open(f"{a.ws}/ws/dashboard/", token) as dash,
        await sub(b, token, topic) as on_b,
    ):
        names: set[str] = set()
        target = None
        for _ in range(20):
            frame = await dash.next(timeout=5)
            if frame["op"] != "snapshot":
                continue  # the history frame, once after the first snapshot
            names = {p["name"] for p in frame["processes"]}
            for process in frame["processes"]:
                for s in process["sockets"]:
                    if s.get("topic") == topic:
                        target = (process["name"], s["id"])
            if len(names) == 2 and target:
                break
        assert len(names) == 2 and target is not None  # both processes, labelled
        assert target[0] != frame["processes"][0]["name"]  # the socket lives on B
        reply = await dash.request({"op": "disconnect", "process": target[0], "socket": target[1]})
        assert reply["op"] == "disconnected"
        await asyncio.wait_for(on_b.reader, 10)
        assert on_b.conn.close_code == 4000


async def test_a_topic_forgotten_while_idle_keeps_its_offsets_and_no_false_gap(
    redis_url: str,
) -> None:
    """A forgets a topic it has no subscriber of after GATEWAY_TOPIC_IDLE; the
    topic's offsets are the deployment's (its Redis stream), so its next
    publishes go on from the last offset, and B neither drops them as old nor
    reports a gap: its block subscriber keeps every message and stays open."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-idle-"))
    with gateways_on_redis(var, redis_url, GATEWAY_TOPIC_IDLE="0.5") as (a, b, admin):
        topic = unique("idle")
        async with (
            await sub(b, admin, topic, on_full=BLOCK) as blocker,
            await Socket.open(f"{a.ws}/ws/produce/", admin) as p,
        ):
            await b_hears_a(p, topic, blocker)
            first = []
            for i in range(5):
                reply = await p.request({"op": "publish", "topic": topic, "body": i})
                first.append(reply["offset"])
            await asyncio.sleep(2)  # A forgets the topic (idle 0.5 s, swept on the next publish)
            later = []
            for i in range(5, 10):
                reply = await p.request({"op": "publish", "topic": topic, "body": i})
                later.append((reply["offset"], reply["epoch"]))
            assert [o for o, _ in later] == list(range(first[-1] + 1, first[-1] + 6))
            items, dropped = await collect(blocker, 10)
            assert in_order(items) == list(range(10)) and dropped == 0
            await blocker.quiet(0.5)  # still open: no 4008, no late drop report

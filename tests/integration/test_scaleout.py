"""Two gateway processes sharing topics through one real Redis (DESIGN decision 7)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import GatewayProcess, Socket, ahttp, unique
from tests.integration.test_fanout import collect

REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_unavailable() -> str | None:
    """Why Redis cannot be used, or None."""
    import socket

    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=2):
            return None
    except OSError as exc:
        return f"Redis at 127.0.0.1:6379 is not reachable: {exc}"


@pytest.fixture(scope="module")
def pair(
    postgres_env: tuple[dict[str, str], Path],
) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    """Gateways A and B on one PostgreSQL and one Redis, with a tiny relay channel."""
    reason = redis_unavailable()
    if reason:
        pytest.skip(reason)
    env, var = postgres_env
    env = {
        **env,
        "REDIS_URL": REDIS_URL,
        "GATEWAY_REDIS_PREFIX": f"lctest{uuid.uuid4().hex[:8]}",
        "GATEWAY_REDIS_CAPACITY": "20",
        "GATEWAY_BLOCK_WAIT": "1",
    }
    a, b = GatewayProcess(env, var, name="a"), GatewayProcess(env, var, name="b")
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture(scope="module")
def token(pair: tuple[GatewayProcess, GatewayProcess]) -> str:
    return pair[0].issue_token("admin", name="scaleout")


async def sub(gw: GatewayProcess, token: str, topic: str, **params: object) -> Socket:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return await Socket.open(f"{gw.ws}/ws/topics/{topic}/?{query}", token)


async def settle() -> None:
    """Let group joins reach Redis."""
    await asyncio.sleep(0.5)


async def test_publish_on_one_process_reaches_subscribers_on_both_with_every_policy(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    a, b = pair
    topic = unique("t")
    async with (
        await sub(a, token, topic) as on_a,
        await sub(b, token, topic) as on_b,
        await sub(b, token, topic, capacity=3, credit=0) as small_b,
        await sub(b, token, topic, capacity=3, credit=0, on_full="drop_newest") as newest_b,
        await Socket.open(f"{a.ws}/ws/produce/", token) as p,
    ):
        await settle()
        for i in range(10):
            assert (await p.request({"op": "publish", "topic": topic, "body": i}))[
                "op"
            ] == "published"
        for s in (on_a, on_b):
            items, dropped = await collect(s, 10)
            assert [it["body"] for it in items] == list(range(10)) and dropped == 0
        await small_b.send({"op": "credit", "n": 10})
        items, dropped = await collect(small_b, 3)
        assert [it["body"] for it in items] == [7, 8, 9] and dropped == 7
        await newest_b.send({"op": "credit", "n": 10})
        items, dropped = await collect(newest_b, 3)
        assert [it["body"] for it in items] == [0, 1, 2] and dropped == 7


async def test_block_subscriber_on_the_other_process_gets_all_or_4008(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    a, b = pair
    topic = unique("t")
    patient = await sub(b, token, topic, capacity=2, credit=0, on_full="block")
    stuck = await sub(b, token, topic, capacity=2, credit=0, on_full="block")
    async with await Socket.open(f"{a.ws}/ws/produce/", token) as p:
        await settle()
        for i in range(3):
            await p.request({"op": "publish", "topic": topic, "body": i})
        await patient.send({"op": "credit", "n": 100})
        items, dropped = await collect(patient, 3)
        assert [it["body"] for it in items] == [0, 1, 2] and dropped == 0
        await asyncio.wait_for(stuck.reader, 10)
        assert stuck.conn.close_code == 4008
    await patient.close()


async def test_relay_overflow_disconnects_block_and_counts_drops_never_a_silent_gap(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    a, b = pair
    topic = unique("t")
    # B's relay stalls behind a full block subscriber for the 1 s block wait,
    # while A publishes far more than B's relay channel (20) holds.
    blocker = await sub(b, token, topic, capacity=1, credit=0, on_full="block")
    counter = await sub(b, token, topic, capacity=10_000, credit=1_000_000)
    await settle()
    bodies = [{"body": i} for i in range(500)]
    status, _ = await ahttp(
        "POST", f"{a.http}/api/topics/{topic}/messages", token, {"messages": bodies}
    )
    assert status == 200
    await asyncio.wait_for(blocker.reader, 15)
    assert blocker.conn.close_code == 4008
    got: list[int] = []
    dropped = 0
    while len(got) + dropped < 500:
        frame = await counter.next(timeout=15)
        got += [it["body"] for it in frame["items"]]
        dropped += frame["dropped"]
    assert dropped > 0  # the relay lost messages, and said so
    assert got == sorted(got) and len(got) + dropped == 500
    _, stats = await ahttp("GET", f"{b.http}/api/stats", token)
    assert stats["process"]["relay"]["lost"] >= dropped
    await counter.close()


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

"""Two gateway processes on one PostgreSQL database (design decision 10)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import Socket, unique
from tests.support.gateways import GatewayProcess


@pytest.fixture
def pair(postgres_env: tuple[dict[str, str], Path]) -> Iterator[tuple[GatewayProcess, ...]]:
    env, var = postgres_env
    a, b = GatewayProcess(env, var, name="a"), GatewayProcess(env, var, name="b")
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


async def test_enqueue_on_one_process_wakes_a_worker_on_the_other(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    a, b = pair
    token = a.issue_token("admin", name="pair")
    q = unique()
    async with await Socket.open(f"{b.ws}/ws/queues/{q}/?prefetch=5", token) as w:
        await w.quiet(0.5)  # B's pump has seen the queue empty and sleeps
        async with await Socket.open(f"{a.ws}/ws/produce/", token) as p:
            for i in range(3):
                assert (await p.request({"op": "enqueue", "queue": q, "body": i}))[
                    "op"
                ] == "enqueued"
        got = await w.deliveries(3)
        assert [d["body"] for d in got] == [0, 1, 2]


async def test_workers_on_both_processes_share_without_duplicates(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    a, b = pair
    token = a.issue_token("admin", name="pair")
    q = unique()
    async with await Socket.open(f"{a.ws}/ws/produce/", token) as p:
        for i in range(200):
            await p.send({"op": "enqueue", "queue": q, "body": i})
        for _ in range(200):
            assert (await p.next())["op"] == "enqueued"
    seen: list[int] = []
    async with (
        await Socket.open(f"{a.ws}/ws/queues/{q}/?prefetch=7", token) as wa,
        await Socket.open(f"{b.ws}/ws/queues/{q}/?prefetch=7", token) as wb,
    ):

        async def drain(w: Socket) -> None:
            while True:
                try:
                    frame = await w.next(timeout=2)
                except TimeoutError:
                    return
                assert frame["op"] in ("deliver", "acked"), frame
                if frame["op"] == "deliver":
                    seen.append(frame["body"])
                    await w.send({"op": "ack", "receipt": frame["receipt"]})

        await asyncio.gather(drain(wa), drain(wb))
    assert sorted(seen) == list(range(200))  # each exactly once: no double lease

"""Work queue 1.1 groups across gateway processes sharing one PostgreSQL database.

docs/protocol.md, "Work queue 1.1": one at a time, in enqueue order, and
the rule holds across gateway processes sharing a database. Workers on two processes lease the same
groups concurrently; a process killed with ``kill -9`` while holding a group's
message holds the group only until the lease's visibility timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.queue11.wq11 import (
    Deployment,
    ack,
    counts,
    enqueue,
    patch,
    producer,
    stats,
    worker,
)
from tests.support.clients import Socket, unique
from tests.support.gateways import GatewayProcess
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def v11(v11_postgres: Deployment) -> Deployment:
    """The package's gateway on PostgreSQL (conftest.py): process A."""
    return v11_postgres


@pytest.fixture(scope="module")
def pair(v11: Deployment) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    """Processes A and B on the same PostgreSQL database."""
    b = GatewayProcess(v11.env, v11.var, name="b")
    b.start()
    yield v11.gateway, b
    b.stop()


@pytest.fixture(scope="module")
def token(v11: Deployment) -> str:
    return v11.admin


async def test_workers_on_two_processes_never_hold_two_messages_of_a_group(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    a, b = pair
    q = unique("grpx")
    groups, per_group = 5, 10
    async with await producer(a, token) as p:
        # Interleaved: g0-0, g1-0, ..., g4-0, g0-1, ...
        reply = await p.request(
            {
                "op": "enqueue_many",
                "queue": q,
                "messages": [
                    {"body": {"g": f"g{g}", "i": i}, "group": f"g{g}"}
                    for i in range(per_group)
                    for g in range(groups)
                ],
            }
        )
        assert reply["op"] == "enqueued_many", reply
    # Per delivery: (group, index, time the deliver arrived, time its ack was sent).
    log: list[tuple[str, int, float, float]] = []
    served = {a.name: 0, b.name: 0}
    total = groups * per_group

    async def work(w: Socket, gw: GatewayProcess) -> None:
        while len(log) < total:
            try:
                d = await w.next(timeout=1.5)
            except TimeoutError:
                continue
            arrived = time.monotonic()
            assert d["op"] == "deliver", d
            assert d["group"] == d["body"]["g"] and d["deliveries"] == 1, d
            await asyncio.sleep(0.03)  # "work": the message is held for a while
            sent = time.monotonic()
            log.append((d["group"], d["body"]["i"], arrived, sent))
            served[gw.name] += 1
            await ack(w, d)

    # Two one-slot workers per process and five groups: each process gets work.
    gws = (a, b, a, b)
    sockets = [await worker(gw, token, q, prefetch=1, visibility_timeout=60) for gw in gws]
    try:
        await asyncio.wait_for(
            asyncio.gather(*(work(w, gw) for w, gw in zip(sockets, gws, strict=True))), 60
        )
    finally:
        for w in sockets:
            await w.close()
    assert len(log) == total
    for g in range(groups):
        mine = sorted((e for e in log if e[0] == f"g{g}"), key=lambda e: e[2])
        # Enqueue order, each message exactly once.
        assert [e[1] for e in mine] == list(range(per_group)), mine
        # Causality, not timing: the next message of the group can only be
        # leased after the previous one's ack was sent, so it arrives after that.
        for prev, nxt in itertools.pairwise(mine):
            assert nxt[2] > prev[3], f"g{g}: {nxt[1]} delivered while {prev[1]} was held"
    # Both processes did work (the groups really were shared between them).
    assert all(served.values()), served
    assert counts(await stats(a, token, q)) == (0, 0, 0, 0)


async def test_group_held_by_a_killed_gateway_resumes_on_the_other_after_the_timeout(
    v11: Deployment, pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    _, b = pair
    doomed = GatewayProcess(v11.env, v11.var, name="doomed")
    doomed.start()
    try:
        q = unique("grpk")
        async with await producer(b, token) as p:
            for i in range(3):
                reply = await p.request({"op": "enqueue", "queue": q, "body": i, "group": "g"})
                assert reply["op"] == "enqueued", reply
            reply = await p.request({"op": "enqueue", "queue": q, "body": "free"})
            assert reply["op"] == "enqueued", reply
        wa = await worker(doomed, token, q, prefetch=1, visibility_timeout=2)
        (held,) = await wa.deliveries(1)
        assert held["body"] == 0
        async with await worker(b, token, q, prefetch=5) as wb:
            (free,) = await wb.deliveries(1)  # B is live: it takes what it may
            assert free["body"] == "free"
            await wb.quiet(0.3)  # but not 1: message 0 of its group is held on A
            doomed.kill()
            with contextlib.suppress(Exception):
                await wa.abort()
            got: list[dict[str, Any]] = []
            for _ in range(3):
                (d,) = await wb.deliveries(1, timeout=20)
                got.append(d)
                await ack(wb, d)
            assert [(d["body"], d["deliveries"]) for d in got] == [(0, 2), (1, 1), (2, 1)]
            assert got[0]["id"] == held["id"]
            await ack(wb, free)
        assert counts(await stats(b, token, q)) == (0, 0, 0, 0)
    finally:
        doomed.stop()


async def test_new_queue_settings_reach_the_other_process(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    a, b = pair
    q = unique("setx")
    async with await producer(b, token) as p:
        await enqueue(p, q, 0)  # B knows the queue, unbounded
        doc = await patch(a, token, q, max_length=1)
        assert doc["max_length"] == 1
        # B applies it within GATEWAY_QUEUE_SETTINGS_TTL (2 s): soon an enqueue
        # on B into the full queue is refused.
        refused: list[dict[str, Any]] = []

        async def b_refuses() -> bool:
            reply = await p.request({"op": "enqueue", "queue": q, "body": 1})
            if reply["op"] == "error":
                refused.append(reply)
            return bool(refused)

        await wait_until(b_refuses, "B refusing an enqueue into the full queue", timeout=15)
        assert refused[0]["code"] == "backpressure", refused

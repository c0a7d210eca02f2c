"""Queue control (protocol 1.2: Pause, Concurrency and rate limits) on two real
gateway processes sharing one database, SQLite and PostgreSQL.

Pause holds every process's workers, survives a restart of both and resumes
them; ``max_in_flight`` and the token bucket hold under many workers spread
over both processes; bad settings are 400 ``invalid`` and change nothing.
Metrics 1.2: the oldest visible message's age and the lease-length
histogram, scraped from the process that did not serve the traffic.
"""

from __future__ import annotations

import asyncio
import sqlite3
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.clients import Socket, ahttp, unique
from tests.support.gateways import GatewayProcess
from tests.support.waiting import wait_until

CONTROL = ("paused", "max_in_flight", "rate_limit", "rate_burst")


@pytest.fixture(scope="module")
def pair(database_env: tuple[dict[str, str], Path]) -> Iterator[tuple[GatewayProcess, ...]]:
    """Two gateway processes on one database (the module's own)."""
    env, var = database_env
    a, b = GatewayProcess(env, var, name="ctl-a"), GatewayProcess(env, var, name="ctl-b")
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture(scope="module")
def token(pair: tuple[GatewayProcess, ...]) -> str:
    return pair[0].issue_token("admin", name="control")


async def patch(gw: GatewayProcess, token: str, queue: str, **changes: Any) -> dict[str, Any]:
    status, body = await ahttp("PATCH", f"{gw.http}/api/queues/{queue}", token, changes)
    assert status == 200, body
    return dict(body)


async def document(gw: GatewayProcess, token: str, queue: str) -> dict[str, Any]:
    status, body = await ahttp("GET", f"{gw.http}/api/queues/{queue}", token)
    assert status == 200, body
    return dict(body)


async def enqueue(gw: GatewayProcess, token: str, queue: str, n: int) -> None:
    body = {"messages": [{"body": i} for i in range(n)]}
    status, reply = await ahttp("POST", f"{gw.http}/api/queues/{queue}/messages", token, body)
    assert status == 200, reply


def lease_times(gw: GatewayProcess, queue: str) -> list[float]:
    """When each message of ``queue`` in flight was leased, read from the database."""
    sql = (
        "SELECT m.leased_at FROM leasecast_message AS m JOIN leasecast_queue AS q "
        "ON q.id = m.queue_id WHERE q.name = {p} AND m.state = 1 ORDER BY m.leased_at"
    )
    if "DATABASE_URL" in gw.env:
        import psycopg

        with psycopg.connect(gw.env["DATABASE_URL"]) as conn:
            rows = conn.execute(sql.format(p="%s"), (queue,)).fetchall()
    else:
        with sqlite3.connect(gw.env["GATEWAY_SQLITE_PATH"]) as conn:
            rows = conn.execute(sql.format(p="?"), (queue,)).fetchall()
    return [float(row[0]) for row in rows]


async def test_pause_holds_workers_on_both_processes_survives_a_restart_and_resumes(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    a, b = pair
    q = unique("pause")
    await enqueue(a, token, q, 2)
    async with await Socket.open(f"{a.ws}/ws/queues/{q}/?prefetch=10", token) as w:
        held = await w.deliveries(2)
        doc = await patch(a, token, q, paused=True)
        assert doc["paused"] is True
        await enqueue(b, token, q, 3)  # enqueues go on
        assert (await w.request({"op": "ack", "receipt": held[0]["receipt"]}))["op"] == "acked"
        nacked = await w.request({"op": "nack", "receipt": held[1]["receipt"]})
        assert nacked["op"] == "nacked", nacked
        await w.quiet(1.5)  # paused at once on the answering process: nothing new
    await asyncio.to_thread(a.stop)
    await asyncio.to_thread(b.stop)
    await asyncio.to_thread(a.start)
    await asyncio.to_thread(b.start)
    doc = await document(b, token, q)
    assert (doc["paused"], doc["visible"], doc["in_flight"]) == (True, 4, 0)
    async with await Socket.open(f"{b.ws}/ws/queues/{q}/?prefetch=10", token) as wb:
        async with await Socket.open(f"{a.ws}/ws/queues/{q}/?prefetch=10", token) as wa:
            await wa.quiet(1.0)
            await wb.quiet(1.0)
        await patch(a, token, q, paused=False)  # resumed on A: B's worker follows
        got = await wb.deliveries(4, timeout=15)
    assert sorted(d["body"] for d in got) == [0, 1, 1, 2]


async def test_max_in_flight_holds_for_many_workers_on_two_processes(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    """Eight workers, four per process, each taking up to five: the messages held
    at once (delivered and not yet acked, as the workers see them) never
    exceed the limit, and all are processed."""
    a, b = pair
    q, limit, total = unique("mif"), 3, 48
    await patch(a, token, q, max_in_flight=limit)
    await enqueue(a, token, q, total)
    held: set[str] = set()
    most = 0
    done: list[int] = []

    async def work(gw: GatewayProcess, turn: int) -> None:
        nonlocal most
        async with await Socket.open(f"{gw.ws}/ws/queues/{q}/?prefetch=5", token) as w:
            while len(done) < total:
                try:
                    frame = await w.next(timeout=3)
                except TimeoutError:
                    continue
                if frame["op"] != "deliver":
                    continue
                held.add(frame["receipt"])
                most = max(most, len(held))
                await asyncio.sleep(0.01 * (turn % 3))
                held.discard(frame["receipt"])  # before the ack is sent: never overcounted
                done.append(frame["body"])
                await w.send({"op": "ack", "receipt": frame["receipt"]})

    await asyncio.wait_for(
        asyncio.gather(*(work(gw, i) for i, gw in enumerate([a, b] * 4))), timeout=120
    )
    assert sorted(done) == list(range(total))
    assert 1 <= most <= limit
    assert (await document(b, token, q))["in_flight"] == 0


async def test_the_rate_limit_holds_for_workers_on_two_processes(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    """Workers on both processes that never ack: the leases, timed by the
    database, never outrun ``rate_burst + rate_limit * T`` over any interval."""
    a, b = pair
    q, rate, burst = unique("rate"), 4.0, 3
    doc = await patch(a, token, q, rate_limit=rate, rate_burst=burst)
    assert (doc["rate_limit"], doc["rate_burst"]) == (rate, burst)
    await enqueue(a, token, q, 40)
    sockets = [
        await Socket.open(f"{gw.ws}/ws/queues/{q}/?prefetch=20", token) for gw in (a, b, a, b)
    ]
    try:
        # The first burst, however slow a loaded machine is to get there, then
        # two seconds of refills (8 more at most).
        await wait_until(
            lambda: asyncio.to_thread(lambda: len(lease_times(a, q)) >= burst),
            "the first burst leased",
        )
        await asyncio.sleep(2.0)
        times = await asyncio.to_thread(lease_times, a, q)  # before closing releases them
    finally:
        for s in sockets:
            await s.close()
    # Each lease transaction dates its leases when it began; one that waited for
    # the queue's lock began up to that wait earlier than the bucket's time, so
    # one token of slack (a wait of 1 / rate seconds) covers that.
    for i in range(len(times)):
        for j in range(i, len(times)):
            assert j - i + 1 <= burst + rate * (times[j] - times[i]) + 1, (i, j, times)
    # Without the limit all 40 would be leased at once.
    assert len(times) < 40


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"paused": "yes"}, "paused"),
        ({"max_in_flight": -1}, "max_in_flight"),
        ({"max_in_flight": 2.5}, "max_in_flight"),
        ({"rate_limit": -1}, "rate_limit"),
        ({"rate_burst": 0}, "rate_burst"),
        ({"rate_limit": 5, "rate_burst": "many"}, "rate_burst"),
        ({"max_inflight": 2}, "max_in_flight"),
    ],
)
async def test_bad_control_settings_are_400_invalid_naming_them_and_change_nothing(
    pair: tuple[GatewayProcess, GatewayProcess], token: str, change: dict[str, Any], named: str
) -> None:
    a, _ = pair
    q = unique("bad")
    before = await patch(a, token, q, max_in_flight=2, rate_limit=1.5)
    status, body = await ahttp("PATCH", f"{a.http}/api/queues/{q}", token, change)
    assert (status, body["error"]) == (400, "invalid"), body
    assert named in body["detail"], body
    after = await document(a, token, q)
    assert {k: after[k] for k in CONTROL} == {k: before[k] for k in CONTROL}
    assert {k: before[k] for k in CONTROL} == {
        "paused": False,
        "max_in_flight": 2,
        "rate_limit": 1.5,
        "rate_burst": 2,  # max(1, ceil(1.5))
    }


async def test_metrics_show_the_oldest_visible_age_and_lease_lengths_deployment_wide(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    a, b = pair
    q, idle = unique("met"), unique("idle")
    await enqueue(a, token, q, 3)
    await patch(a, token, idle)  # a queue with nothing in it
    async with await Socket.open(f"{a.ws}/ws/queues/{q}/?prefetch=2", token) as w:
        got = await w.deliveries(2)
        await asyncio.sleep(0.3)
        for d in got:
            assert (await w.request({"op": "ack", "receipt": d["receipt"]}))["op"] == "acked"
    await asyncio.sleep(0.2)  # the third message ages
    status, text = await ahttp_text(b, token)
    assert status == 200, text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("leasecast_queue_oldest_age_seconds", (("queue", q),))] >= 0.5
    assert samples[("leasecast_queue_oldest_age_seconds", (("queue", idle),))] == 0
    lease = "leasecast_queue_lease_seconds"
    assert samples[(f"{lease}_count", (("queue", q),))] == 2
    assert samples[(f"{lease}_bucket", (("le", "0.25"), ("queue", q)))] == 0  # held >= 0.3 s
    assert samples[(f"{lease}_bucket", (("le", "+Inf"), ("queue", q)))] == 2
    assert 0.6 <= samples[(f"{lease}_sum", (("queue", q),))] < 60
    assert samples[(f"{lease}_count", (("queue", idle),))] == 0


async def ahttp_text(gw: GatewayProcess, token: str) -> tuple[int, str]:
    """``GET /metrics`` of ``gw``: (status, the exposition's text)."""

    def get() -> tuple[int, str]:
        request = urllib.request.Request(f"{gw.http}/metrics")
        request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()

    return await asyncio.to_thread(get)


async def test_http_leases_obey_pause_and_max_in_flight_with_socket_leases(
    pair: tuple[GatewayProcess, GatewayProcess], token: str
) -> None:
    """An HTTP worker on one process and a socket on the other share the one
    limit; a paused queue answers an HTTP lease with nothing."""
    a, b = pair
    q = unique("http")
    await enqueue(a, token, q, 6)
    await patch(a, token, q, max_in_flight=3)
    async with await Socket.open(f"{a.ws}/ws/queues/{q}/?prefetch=2", token) as w:
        await w.deliveries(2)
        status, body = await ahttp("POST", f"{b.http}/api/queues/{q}/lease", token, {"max": 10})
        assert status == 200 and len(body["deliveries"]) == 1, body
        await patch(b, token, q, paused=True, max_in_flight=0)
        status, body = await ahttp("POST", f"{a.http}/api/queues/{q}/lease", token, {"max": 10})
        assert (status, body["deliveries"]) == (200, []), body

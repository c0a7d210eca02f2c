"""Two gateway processes on PostgreSQL and Redis behind a real haproxy, and graceful restarts.

The deployment docs/operations.md describes: gateways A and B share one
PostgreSQL database (the work queue) and one Redis (topics); haproxy, started
here on a loopback port from a generated config (harness.Balancer), passes
WebSockets through, checks ``/healthz`` and retries a refused connection on
the other process. Every client connects through haproxy only.

The restart test keeps producers, workers, a publisher and ``block``
subscribers busy while A, then B, is stopped with SIGTERM and started again,
and counts: every enqueue that got ``enqueued`` is delivered and acked at
least once, every client sees a close code it can act on (1001: daphne's
drain in gateway/server/shutdown.py; under uvicorn, gateway.serve closes them with
1001 before uvicorn would with 1012) and reconnects through the balancer, and
no ``block`` subscriber's socket ever skips a message.

Both servers run the deployment. Skipped, with the reason, without
PostgreSQL, Redis or haproxy (`make balancer` installs it). The first test
needs none of them: one process, SIGTERM, and its leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from tests.support.clients import Socket, ahttp, unique
from tests.support.databases import sqlite_database
from tests.support.gateways import SERVERS, Balancer, GatewayProcess, haproxy_unavailable

pytestmark = pytest.mark.slow

#: What a client may see when its process stops gracefully: daphne's drain
#: sends 1001 (going away, docs/protocol.md, Errors), under both servers.
RESTART_CODES = {1001}


@pytest.mark.parametrize("server", SERVERS)
async def test_sigterm_closes_sockets_with_a_code_and_releases_leases(server: str) -> None:
    """A stopped process closes its sockets visibly and hands its leases back at once."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-sigterm-"))
    with sqlite_database(var) as env:
        gw = GatewayProcess({**env, "GATEWAY_SHUTDOWN_GRACE": "10"}, var, server=server)
        gw.start()
        try:
            token = gw.issue_token("admin", name="sigterm")
            queue = unique("term")
            async with await Socket.open(f"{gw.ws}/ws/produce/", token) as p:
                for i in range(3):
                    assert (await p.request({"op": "enqueue", "queue": queue, "body": i}))[
                        "op"
                    ] == "enqueued"
            # A lease far longer than the test: only a release brings these back.
            w = await Socket.open(f"{gw.ws}/ws/queues/{queue}/?visibility_timeout=600", token)
            await w.deliveries(3)
            assert gw.proc is not None
            gw.proc.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionError):
                await w.next(timeout=20)
            assert w.conn.close_code in RESTART_CODES, (w.conn.close_code, gw.log_text()[-2000:])
            gw.proc.wait(30)
        finally:
            gw.stop()
        again = GatewayProcess(env, var, name="again", server=server)
        again.start()
        try:
            status, stats = await ahttp("GET", f"{again.http}/api/queues/{queue}", token)
            assert status == 200
            assert (stats["visible"], stats["in_flight"]) == (3, 0), stats
        finally:
            again.stop()


# -- the deployment -----------------------------------------------------------------


@dataclass
class Deployment:
    a: GatewayProcess
    b: GatewayProcess
    lb: Balancer
    token: str


@pytest.fixture(scope="module")
def haproxy() -> None:
    reason = haproxy_unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module", params=SERVERS)
def deployment(
    request: pytest.FixtureRequest,
    haproxy: None,
    postgres_env: tuple[dict[str, str], Path],
    redis_url: str,
) -> Iterator[Deployment]:
    """Gateways A and B (one server kind) on one database and one Redis, behind haproxy."""
    env, var = postgres_env
    env = {
        **env,
        "REDIS_URL": redis_url,
        "GATEWAY_REDIS_PREFIX": f"lcb{uuid.uuid4().hex[:8]}",
        "GATEWAY_SHUTDOWN_GRACE": "10",
    }
    a = GatewayProcess(env, var, name="a", server=request.param)
    b = GatewayProcess(env, var, name="b", server=request.param)
    lb = Balancer([a, b], var)
    try:
        a.start()
        b.start()
        lb.start()
        yield Deployment(a, b, lb, a.issue_token("admin", name="balancer"))
    finally:
        lb.stop()
        a.stop()
        b.stop()


async def sockets_on(gw: GatewayProcess, token: str) -> int:
    """Work-queue sockets open on this process (its own /api/stats, not through haproxy)."""
    status, stats = await ahttp("GET", f"{gw.http}/api/stats", token)
    assert status == 200, stats
    return len(stats["sockets"])


async def test_sockets_and_requests_reach_both_processes_through_haproxy(
    deployment: Deployment,
) -> None:
    d = deployment
    queue, topic = unique("lbq"), unique("lbt")
    status, body = await ahttp("GET", f"{d.lb.http}/healthz")
    assert (status, body) == (200, {"status": "ok"})
    workers = [
        await Socket.open(f"{d.lb.ws}/ws/queues/{queue}/?prefetch=5", d.token) for _ in range(4)
    ]
    subscribers = [await Socket.open(f"{d.lb.ws}/ws/topics/{topic}/", d.token) for _ in range(2)]
    try:
        # leastconn: the upgraded sockets are spread over both processes.
        assert await sockets_on(d.a, d.token) >= 1 and await sockets_on(d.b, d.token) >= 1
        messages = [{"body": {"n": n}} for n in range(20)]
        status, body = await ahttp(
            "POST", f"{d.lb.http}/api/queues/{queue}/messages", d.token, {"messages": messages}
        )
        assert status == 200, body
        got: list[int] = []

        async def drain(w: Socket) -> None:
            with contextlib.suppress(TimeoutError):
                while True:
                    frame = await w.next(timeout=1)
                    assert frame["op"] == "deliver", frame
                    assert (await w.request({"op": "ack", "receipt": frame["receipt"]}))[
                        "op"
                    ] == "acked"
                    got.append(frame["body"]["n"])

        await asyncio.gather(*(drain(w) for w in workers))
        assert sorted(got) == list(range(20))
        async with await Socket.open(f"{d.lb.ws}/ws/produce/", d.token) as p:
            reply = await p.request({"op": "publish", "topic": topic, "body": "hello"})
            assert reply["op"] == "published", reply
        for s in subscribers:  # one on each process: the publish crossed Redis
            frame = await s.next()
            assert [item["body"] for item in frame["items"]] == ["hello"], frame
    finally:
        for s in [*workers, *subscribers]:
            await s.close()


# -- graceful restart under load ------------------------------------------------------


@dataclass
class Ledger:
    """What the clients saw, for the checks at the end."""

    confirmed: set[str] = field(default_factory=set)
    delivered: Counter[str] = field(default_factory=Counter)
    acked: Counter[str] = field(default_factory=Counter)
    published: set[int] = field(default_factory=set)
    #: close codes seen by each kind of client
    closes: Counter[tuple[str, int | None]] = field(default_factory=Counter)
    #: one entry per subscriber socket: the bodies' ``n`` in arrival order,
    #: the seqs, the drops reported and how the socket ended
    sessions: list[dict[str, Any]] = field(default_factory=list)
    refused: int = 0


async def connect_through(url: str, token: str, ledger: Ledger, stop: asyncio.Event) -> Socket:
    """Open a socket through the balancer, retrying while the deployment restarts."""
    while True:
        try:
            return await Socket.open(url, token, open_timeout=5)
        except (OSError, InvalidHandshake, TimeoutError):
            ledger.refused += 1
            if stop.is_set():
                raise
            await asyncio.sleep(0.05)


async def producer(
    d: Deployment, queue: str, name: str, ledger: Ledger, stop: asyncio.Event
) -> None:
    """Enqueues with an idempotency key each, retrying one not confirmed after a reconnect."""
    n, pending = 0, None
    while not stop.is_set():
        s = await connect_through(f"{d.lb.ws}/ws/produce/", d.token, ledger, stop)
        try:
            while not stop.is_set():
                if pending is None:
                    pending, n = f"{name}-{n}", n + 1
                frame = {"op": "enqueue", "queue": queue, "body": {"id": pending}, "key": pending}
                reply = await s.request(frame)
                if reply["op"] == "enqueued":
                    ledger.confirmed.add(pending)
                    pending = None
                else:  # backpressure or unavailable: nothing applied, try again
                    await asyncio.sleep(0.05)
        except (ConnectionError, ConnectionClosed, TimeoutError):
            ledger.closes["producer", s.conn.close_code] += 1
        finally:
            await s.close()


async def worker(d: Deployment, queue: str, ledger: Ledger, done: asyncio.Event) -> None:
    """Acks every delivery; reconnects through the balancer when its socket closes."""
    while not done.is_set():
        s = await connect_through(
            f"{d.lb.ws}/ws/queues/{queue}/?prefetch=10", d.token, ledger, done
        )
        try:
            while not done.is_set():
                try:
                    frame = await s.next(timeout=0.2)
                except TimeoutError:
                    continue
                assert frame["op"] == "deliver", frame
                message_id = frame["body"]["id"]
                ledger.delivered[message_id] += 1
                reply = await s.request({"op": "ack", "receipt": frame["receipt"]})
                if reply["op"] == "acked":
                    ledger.acked[message_id] += 1
        except (ConnectionError, ConnectionClosed, TimeoutError):
            ledger.closes["worker", s.conn.close_code] += 1
        finally:
            await s.close()


async def publisher(d: Deployment, topic: str, ledger: Ledger, stop: asyncio.Event) -> None:
    """Publishes 0, 1, 2...; one not confirmed is published again after a reconnect."""
    n = 0
    while not stop.is_set():
        s = await connect_through(f"{d.lb.ws}/ws/produce/", d.token, ledger, stop)
        try:
            while not stop.is_set():
                reply = await s.request({"op": "publish", "topic": topic, "body": {"n": n}})
                if reply["op"] == "published":
                    ledger.published.add(n)
                    n += 1
                await asyncio.sleep(0.002)  # a steady stream, not a flood
        except (ConnectionError, ConnectionClosed, TimeoutError):
            ledger.closes["publisher", s.conn.close_code] += 1
        finally:
            await s.close()


async def subscriber(d: Deployment, topic: str, ledger: Ledger, done: asyncio.Event) -> None:
    """A ``block`` subscriber granting credit as it reads; one session per socket."""
    url = f"{d.lb.ws}/ws/topics/{topic}/?on_full=block&capacity=1000&credit=1000"
    while not done.is_set():
        s = await connect_through(url, d.token, ledger, done)
        session: dict[str, Any] = {"n": [], "seq": [], "dropped": 0, "close": None}
        ledger.sessions.append(session)
        try:
            while not done.is_set():
                try:
                    frame = await s.next(timeout=0.2)
                except TimeoutError:
                    continue
                assert frame["op"] == "messages", frame
                session["n"] += [item["body"]["n"] for item in frame["items"]]
                session["seq"] += [item["seq"] for item in frame["items"]]
                session["dropped"] += frame["dropped"]
                await s.send({"op": "credit", "n": len(frame["items"])})
        except (ConnectionError, ConnectionClosed, TimeoutError):
            session["close"] = s.conn.close_code
            ledger.closes["subscriber", s.conn.close_code] += 1
        finally:
            await s.close()


async def queue_counts(d: Deployment, queue: str) -> tuple[int, int, int]:
    """The queue's visible, in-flight and dead counts (through the balancer)."""
    status, stats = await ahttp("GET", f"{d.lb.http}/api/queues/{queue}", d.token)
    assert status == 200, stats
    return stats["visible"], stats["in_flight"], stats["dead"]


async def restart(d: Deployment, gw: GatewayProcess) -> None:
    """SIGTERM one process, wait for haproxy to see it down, start it again, wait for up."""
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGTERM)
    await asyncio.to_thread(gw.proc.wait, 30)
    await asyncio.to_thread(d.lb.wait_until, {gw.name: "DOWN"})
    await asyncio.to_thread(gw.start)  # the same port, as a process manager would
    await asyncio.to_thread(d.lb.wait_until, {gw.name: "UP"})


async def test_rolling_restart_under_load_loses_nothing_confirmed(
    deployment: Deployment,
) -> None:
    d = deployment
    queue, topic = unique("roll"), unique("rollt")
    ledger = Ledger()
    stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
    consumers = [
        *(asyncio.create_task(worker(d, queue, ledger, stop_consuming)) for _ in range(4)),
        *(asyncio.create_task(subscriber(d, topic, ledger, stop_consuming)) for _ in range(4)),
    ]
    await asyncio.sleep(0.5)  # subscribed before the first publish
    producers = [
        *(
            asyncio.create_task(producer(d, queue, f"p{k}", ledger, stop_producing))
            for k in range(2)
        ),
        asyncio.create_task(publisher(d, topic, ledger, stop_producing)),
    ]
    try:
        await asyncio.sleep(1.5)
        for gw in (d.a, d.b):
            before = len(ledger.confirmed)
            await restart(d, gw)
            await asyncio.sleep(1.5)
            assert len(ledger.confirmed) > before, "no enqueue confirmed across the restart"
        stop_producing.set()
        await asyncio.gather(*producers)
        # Every confirmed message reaches a worker and the queue empties;
        # released leases come back at once, so this waits for the work, not
        # for visibility timeouts.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            delivered = ledger.confirmed <= set(ledger.delivered)
            if delivered and await queue_counts(d, queue) == (0, 0, 0):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # the subscribers' last frames
    finally:
        stop_producing.set()
        stop_consuming.set()
        await asyncio.gather(*producers, *consumers, return_exceptions=True)
    for task in [*producers, *consumers]:
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

    # An ack whose reply was lost to the close was applied or not: if not, the
    # lease was released and the message delivered again; either way the
    # queue ends empty, checked below.
    lost = ledger.confirmed - set(ledger.delivered)
    redelivered = sum(ledger.delivered.values()) - len(ledger.delivered)
    summary = (
        f"{len(ledger.confirmed)} enqueues confirmed, {len(ledger.delivered)} distinct messages "
        f"delivered, {len(ledger.acked)} acked with a reply, {redelivered} redeliveries, "
        f"{len(ledger.published)} publishes confirmed, "
        f"{len(ledger.sessions)} subscriber sockets, {ledger.refused} refused connects, "
        f"closes {dict(ledger.closes)}"
    )
    print(summary)
    if lost:
        states = {}
        for state in ("visible", "delayed", "in_flight", "dead"):
            _, page = await ahttp(
                "GET", f"{d.lb.http}/api/queues/{queue}/messages?state={state}", d.token
            )
            states[state] = page
        detail = {m: ledger.delivered[m] for m in sorted(lost)[:20]}
        raise AssertionError(f"confirmed, never delivered: {detail}; {summary}; queue: {states}")
    # Every socket a restart closed saw a code it can act on; a 1006 (dropped
    # without a close frame) or None would be a silent end.
    assert ledger.closes, summary
    assert {code for _, code in ledger.closes} <= RESTART_CODES, summary
    # Each kind of client was on a restarted process at least once, and came back.
    assert {kind for kind, _ in ledger.closes} == {"producer", "worker", "publisher", "subscriber"}
    # The queue is empty: every delivered message's ack was applied, nothing
    # is stranded in flight or waiting.
    assert await queue_counts(d, queue) == (0, 0, 0), summary
    # block subscribers: within each socket, no drop and no hole between the
    # first and the last message it got (a republished message may come twice);
    # between sockets there is the close code checked above.
    received = 0
    for session in ledger.sessions:
        ns, seqs = session["n"], session["seq"]
        assert session["dropped"] == 0, session
        assert all(x < y for x, y in itertools.pairwise(seqs)), seqs
        if ns:
            missing = set(range(min(ns), max(ns) + 1)) - set(ns)
            assert not missing, f"a block subscriber skipped {sorted(missing)[:20]}"
            received += len(ns)
    assert received > 0, summary

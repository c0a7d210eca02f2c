"""Misbehaving clients cost bounded gateway memory and do not hurt the others (issue 6, item 3).

The misbehaving clients: a worker that never acks, subscribers that never
grant credit (``drop_oldest`` and ``block``), and clients that connect and
then send nothing and read nothing (a worker, a subscriber, a producer and a
dashboard). With them attached, a producer pushes a large load through one
gateway process: 20,000 publishes and 6,000 enqueues of 8 KiB bodies, about
200 MiB in all. A well-behaved worker and subscriber on the same process must
get everything, in order, and the gateway's resident memory (``VmRSS`` of
``/proc/PID/status``) may grow by no more than what the misbehaving clients
may legitimately cost: each subscriber buffer full to its capacity with
bodies of that size, each worker's prefetch of leases, plus a fixed slack for
the interpreter, the allocator and the database driver. Unbounded buffering
would cost at least the 160 MiB of the publishes alone.

Heartbeats are turned off (``GATEWAY_PING_INTERVAL`` one hour) so that what is
measured is the buffering, not how soon daphne drops a client that does not
answer pings. ``GATEWAY_BLOCK_WAIT`` is 1 s so that the ``block`` subscriber is
closed quickly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.support.clients import Socket, ahttp, unique
from tests.support.databases import sqlite_database
from tests.support.gateways import GatewayProcess
from tests.support.waiting import wait_until

BODY_BYTES = 8 * 1024
CAPACITY = 1000
PREFETCH = 10
#: Alone, after the parallel run: a stalled client must read again before the
#: server gives up its close handshake, which a loaded machine delays (1006, not 4008).
pytestmark = pytest.mark.serial

PUBLISHES = 20_000
ENQUEUES = 6_000
#: What a gateway process may grow by whatever its clients do: interpreter,
#: allocator arenas, the database driver's caches, socket bookkeeping.
SLACK_MIB = 48
MIB = 1024 * 1024

QUIET = {
    "GATEWAY_PING_INTERVAL": "3600",
    "GATEWAY_PING_TIMEOUT": "3600",
    "GATEWAY_BLOCK_WAIT": "1",
    # Topics with no subscriber are forgotten after half a second idle (default
    # 300 s): what a burst of new names costs is what the idle window holds.
    "GATEWAY_TOPIC_IDLE": "0.5",
    # And however fast names arrive, at most 1,000 of them are counted (default
    # 10,000): the bound must not depend on how many the machine fits in 0.5 s.
    "GATEWAY_TOPIC_LIMIT": "1000",
}


def rss_mib(pid: int) -> float:
    """The process's resident set, from ``/proc/PID/status``."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


def body(i: int) -> dict[str, Any]:
    """An 8 KiB body that says which message it is."""
    return {"i": i, "pad": "x" * (BODY_BYTES - 32)}


@pytest.fixture
def quiet_gateway(database_env: tuple[dict[str, str], Path]) -> Iterator[GatewayProcess]:
    """A gateway of the test's own (so its memory is the test's alone), heartbeats off."""
    env, var = database_env
    process = GatewayProcess({**env, **QUIET}, var, name="misbehaving")
    process.start()
    yield process
    process.stop()


@pytest.fixture
def quiet_sqlite_gateway() -> Iterator[GatewayProcess]:
    """The same on SQLite only: for the fan-out alone, which never touches the database."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-misbehaving-"))
    with sqlite_database(var) as env:
        process = GatewayProcess({**env, **QUIET}, var, name="misbehaving")
        process.start()
        yield process
        process.stop()


async def silent(url: str, token: str, **options: Any) -> ClientConnection:
    """Connect, then neither send nor read anything (not even pings).

    ``options`` go to ``connect``: ``compression=None`` makes the server send
    frames as they are (uvicorn would deflate the test's bodies of one repeated
    character about a hundredfold, so its transport would take every message).
    """
    conn = await connect(
        url,
        additional_headers={"Authorization": f"Bearer {token}"},
        ping_interval=None,
        **options,
    )
    conn.transport.pause_reading()
    return conn


# -- the well-behaved ------------------------------------------------------------


class GoodWorker:
    """Acks every delivery, pipelined; remembers every id it acked."""

    def __init__(self, socket: Socket) -> None:
        self.socket = socket
        self.acked: dict[str, int] = {}  # id -> deliveries when acked
        self.acks: set[asyncio.Task[dict[str, Any]]] = set()
        self.task = asyncio.create_task(self._run())

    @classmethod
    async def open(cls, gateway: GatewayProcess, token: str, queue: str) -> GoodWorker:
        return cls(await Socket.open(f"{gateway.ws}/ws/queues/{queue}/?prefetch=100", token))

    async def _run(self) -> None:
        while True:
            frame = await self.socket.next(timeout=3600)
            assert frame["op"] == "deliver", frame
            ack = asyncio.create_task(
                self.socket.request({"op": "ack", "receipt": frame["receipt"]}, timeout=60)
            )
            self.acks.add(ack)
            ack.add_done_callback(lambda t, f=frame: self._acked(t, f))

    def _acked(self, task: asyncio.Task[dict[str, Any]], frame: dict[str, Any]) -> None:
        self.acks.discard(task)
        if not task.cancelled() and task.exception() is None and task.result()["op"] == "acked":
            assert frame["id"] not in self.acked, ("acked twice", frame)
            self.acked[frame["id"]] = frame["deliveries"]

    def check(self) -> None:
        if self.task.done():
            self.task.result()

    async def close(self) -> None:
        self.task.cancel()
        await self.socket.close()


class GoodSubscriber:
    """Grants credit as it goes; checks order and that nothing is dropped."""

    def __init__(self, socket: Socket) -> None:
        self.socket = socket
        self.heard = 0
        self.task = asyncio.create_task(self._run())

    @classmethod
    async def open(cls, gateway: GatewayProcess, token: str, topic: str) -> GoodSubscriber:
        url = f"{gateway.ws}/ws/topics/{topic}/?capacity=1000000&credit=1000"
        return cls(await Socket.open(url, token))

    async def _run(self) -> None:
        granted = 1000
        while True:
            frame = await self.socket.next(timeout=3600)
            assert frame["op"] == "messages", frame
            assert frame["dropped"] == 0, frame
            for item in frame["items"]:
                self.heard += 1
                assert item["seq"] == self.heard, (item["seq"], self.heard)
                assert item["body"]["i"] == self.heard - 1, (item["body"]["i"], self.heard)
            if granted - self.heard < 500:
                await self.socket.send({"op": "credit", "n": 1000})
                granted += 1000

    def check(self) -> None:
        if self.task.done():
            self.task.result()

    async def close(self) -> None:
        self.task.cancel()
        await self.socket.close()


async def publish_all(producer: Socket, topic: str, n: int) -> None:
    """``n`` publishes, up to 200 unconfirmed at a time; each must be accepted."""
    window: list[asyncio.Task[dict[str, Any]]] = []
    for i in range(n):
        frame = {"op": "publish", "topic": topic, "body": body(i)}
        window.append(asyncio.create_task(producer.request(frame, timeout=60)))
        if len(window) >= 200:
            for reply in await asyncio.gather(*window):
                assert reply["op"] == "published", reply
            window = []
    for reply in await asyncio.gather(*window):
        assert reply["op"] == "published", reply


async def enqueue_all(producer: Socket, queue: str, n: int) -> list[str]:
    """``n`` enqueues in frames of 500; returns the ids in order."""
    ids: list[str] = []
    for start in range(0, n, 500):
        messages = [{"body": body(i)} for i in range(start, min(n, start + 500))]
        reply = await producer.request(
            {"op": "enqueue_many", "queue": queue, "messages": messages}, timeout=60
        )
        assert reply["op"] == "enqueued_many", reply
        ids += [r["id"] for r in reply["results"]]
    return ids


async def well_behaved_round(gateway: GatewayProcess, token: str, scale: float = 1.0) -> None:
    """The load with only well-behaved clients: warms the allocator and the store."""
    queue, topic = unique("mbwarmq"), unique("mbwarmt")
    worker = await GoodWorker.open(gateway, token, queue)
    sub = await GoodSubscriber.open(gateway, token, topic)
    producer = await Socket.open(f"{gateway.ws}/ws/produce/", token)
    publishes, enqueues = int(PUBLISHES * scale), int(ENQUEUES * scale)
    await publish_all(producer, topic, publishes)
    await enqueue_all(producer, queue, enqueues)
    await wait_until(
        lambda: sub.heard == publishes or sub.check(), "the warm-up publishes", timeout=120
    )
    await wait_until(
        lambda: len(worker.acked) == enqueues or worker.check(), "the warm-up enqueues", timeout=120
    )
    for s in (worker, sub):
        await s.close()
    await producer.close()


async def stats(gateway: GatewayProcess, token: str) -> dict[str, Any]:
    status, reply = await ahttp("GET", f"{gateway.http}/api/stats", token)
    assert status == 200, reply
    return dict(reply)


# -- the tests --------------------------------------------------------------------


async def test_misbehaving_clients_cost_bounded_memory_and_others_get_everything(
    quiet_gateway: GatewayProcess,
) -> None:
    gateway = quiet_gateway
    assert gateway.proc is not None
    pid = gateway.proc.pid
    token = gateway.issue_token("admin", name="admin")
    ws = gateway.ws
    await well_behaved_round(gateway, token)
    before = rss_mib(pid)

    queue, topic = unique("mbq"), unique("mbt")
    # The misbehaving.
    # Leases that outlive the test: the worker that never acks keeps what it got.
    held = f"prefetch={PREFETCH}&visibility_timeout=3600"
    never_acks = await Socket.open(f"{ws}/ws/queues/{queue}/?{held}", token)
    no_credit = [
        await Socket.open(f"{ws}/ws/topics/{topic}/?credit=0&capacity={CAPACITY}", token)
        for _ in range(3)
    ]
    blocker = await Socket.open(
        f"{ws}/ws/topics/{topic}/?credit=0&capacity={CAPACITY}&on_full=block", token
    )
    mute = [
        await silent(f"{ws}/ws/queues/{queue}/?{held}", token),
        await silent(f"{ws}/ws/topics/{topic}/?capacity={CAPACITY}", token),
        await silent(f"{ws}/ws/produce/", token),
        await silent(f"{ws}/ws/dashboard/", token),
    ]
    # The well-behaved, on the same queue and topic.
    worker = await GoodWorker.open(gateway, token, queue)
    sub = await GoodSubscriber.open(gateway, token, topic)
    producer = await Socket.open(f"{ws}/ws/produce/", token)

    await publish_all(producer, topic, PUBLISHES)
    ids = await enqueue_all(producer, queue, ENQUEUES)
    await wait_until(
        lambda: sub.heard == PUBLISHES or sub.check(),
        "the subscriber to hear every publish",
        timeout=120,
    )

    def held_elsewhere(snapshot: dict[str, Any]) -> int:
        return sum(
            s["leases"]
            for s in snapshot["sockets"]
            if s["kind"] == "worker" and s["queue"] == queue and s["prefetch"] == PREFETCH
        )

    async def worker_has_the_rest() -> None:
        deadline = asyncio.get_running_loop().time() + 120
        while True:
            worker.check()
            held = held_elsewhere(await stats(gateway, token))
            if held and len(worker.acked) + held == ENQUEUES:
                return
            assert asyncio.get_running_loop().time() < deadline, (len(worker.acked), held)
            await asyncio.sleep(0.1)

    await worker_has_the_rest()
    # The peak: every misbehaving client still attached, the load all through.
    grown = rss_mib(pid) - before

    snapshot = await stats(gateway, token)
    subscribers = [
        s for s in snapshot["sockets"] if s["kind"] == "subscriber" and s["topic"] == topic
    ]
    # The three without credit, the silent one, and ours; the blocker is gone (4008).
    assert len(subscribers) == 5, subscribers
    for s in subscribers:
        assert s["buffered"] <= s["capacity"], s
        assert s["delivered"] + s["buffered"] + s["dropped"] == PUBLISHES, s
    starved = [s for s in subscribers if s["capacity"] == CAPACITY]
    assert sorted(s["delivered"] for s in starved) == [0, 0, 0, 256], starved  # 256: default credit
    assert all(s["buffered"] == CAPACITY for s in starved), starved
    await blocker.reader
    assert blocker.conn.close_code == 4008
    # The worker that never acks got its prefetch, once each, and nothing more.
    got = [await never_acks.next() for _ in range(PREFETCH)]
    assert [f["deliveries"] for f in got] == [1] * PREFETCH
    with pytest.raises(TimeoutError):
        await never_acks.next(timeout=0.5)

    # Memory: what the misbehaving may hold, and no more.
    buffers = 5 * CAPACITY * BODY_BYTES  # 3 without credit, the silent one, the blocker
    leases = 2 * PREFETCH * BODY_BYTES
    bound = (buffers + leases) / MIB + SLACK_MIB
    print(f"RSS growth with the misbehaving attached: {grown:.0f} MiB (bound {bound:.0f} MiB)")
    assert grown <= bound, f"gateway RSS grew {grown:.0f} MiB (bound {bound:.0f} MiB)"

    # Once the misbehaving go, what they held reaches the well-behaved worker.
    await never_acks.close()
    for conn in mute:
        conn.transport.abort()
    for s in no_credit:
        await s.close()
    await wait_until(
        lambda: len(worker.acked) == ENQUEUES or worker.check(), "the released leases", timeout=120
    )
    assert sorted(worker.acked) == sorted(ids)
    assert sum(1 for d in worker.acked.values() if d > 1) <= 2 * PREFETCH
    status, counts = await ahttp("GET", f"{gateway.http}/api/queues/{queue}", token)
    assert status == 200, counts
    assert [counts[k] for k in ("visible", "delayed", "in_flight", "dead")] == [0, 0, 0, 0]
    await worker.close()
    await sub.close()
    await producer.close()
    assert gateway.proc.poll() is None
    assert "Traceback" not in gateway.log_text()


async def flood_past_readers_that_stopped(
    gateway: GatewayProcess, stalled: int
) -> tuple[float, GoodSubscriber, list[ClientConnection], str]:
    """Publish the load to a topic where ``stalled`` subscribers granted credit, then stopped
    reading. Returns the RSS growth, the well-behaved subscriber, the stalled sockets and
    the topic."""
    assert gateway.proc is not None
    pid = gateway.proc.pid
    token = gateway.issue_token("admin", name="admin")
    await well_behaved_round(gateway, token, scale=0.5)
    before = rss_mib(pid)
    topic = unique("mbstall")
    url = f"{gateway.ws}/ws/topics/{topic}/?capacity={CAPACITY}&credit=1000000000"
    stopped = [await silent(url, token, compression=None) for _ in range(stalled)]
    sub = await GoodSubscriber.open(gateway, token, topic)
    producer = await Socket.open(f"{gateway.ws}/ws/produce/", token)
    await publish_all(producer, topic, PUBLISHES)
    await wait_until(
        lambda: sub.heard == PUBLISHES or sub.check(),
        "the subscriber to hear every publish",
        timeout=120,
    )
    grown = rss_mib(pid) - before
    await producer.close()
    return grown, sub, stopped, topic


async def test_a_subscriber_that_stops_reading_does_not_hold_up_the_others(
    quiet_sqlite_gateway: GatewayProcess,
) -> None:
    """It granted a billion credits and then stopped reading: the others still get everything."""
    grown, sub, stopped, _ = await flood_past_readers_that_stopped(quiet_sqlite_gateway, 2)
    assert sub.heard == PUBLISHES
    for conn in stopped:
        conn.transport.abort()
    await sub.close()
    print(f"RSS growth with 2 stalled readers: {grown:.0f} MiB")  # the figure for the report
    assert quiet_sqlite_gateway.proc is not None and quiet_sqlite_gateway.proc.poll() is None


@pytest.fixture(params=["daphne", "uvicorn"])
def stalled_gateway(request: pytest.FixtureRequest) -> Iterator[GatewayProcess]:
    """:func:`quiet_sqlite_gateway` under each ASGI server: their transports differ."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-stalled-"))
    with sqlite_database(var) as env:
        process = GatewayProcess({**env, **QUIET}, var, name="stalled", server=request.param)
        process.start()
        yield process
        process.stop()


async def topic_subscribers(gateway: GatewayProcess, token: str, topic: str) -> list[Any]:
    """The subscriber sockets of ``topic`` in ``/api/stats``."""
    snapshot = await stats(gateway, token)
    return [s for s in snapshot["sockets"] if s["kind"] == "subscriber" and s["topic"] == topic]


async def test_a_subscriber_that_stops_reading_costs_bounded_memory(
    stalled_gateway: GatewayProcess,
) -> None:
    """design decision 14: its transport full, its buffer stops draining, so its capacity
    and policy apply (``drop_oldest`` here) as for a subscriber without credit."""
    gateway = stalled_gateway
    stalled = 2
    grown, sub, stopped, topic = await flood_past_readers_that_stopped(gateway, stalled)
    token = gateway.issue_token("admin", name="admin")
    subscribers = await topic_subscribers(gateway, token, topic)
    starved = [s for s in subscribers if s["capacity"] == CAPACITY]
    for conn in stopped:
        conn.transport.abort()
    await sub.close()
    # Bounded: its buffer full to capacity (and a frame or two in the socket).
    bound = stalled * 2 * CAPACITY * BODY_BYTES / MIB + SLACK_MIB
    print(
        f"{gateway.server}: RSS growth with {stalled} stalled readers: {grown:.0f} MiB "
        f"(bound {bound:.0f} MiB); sent to each before its transport filled: "
        f"{[s['delivered'] for s in starved]}"
    )
    assert len(starved) == stalled, subscribers
    for s in starved:
        # Full to capacity, the oldest dropped: what it was sent is what its
        # transport window took (the kernel's socket buffers, a frame or two).
        assert s["buffered"] == CAPACITY, s
        assert s["dropped_oldest"] > 0, s
        assert s["delivered"] + s["buffered"] + s["dropped"] == PUBLISHES, s
    assert grown <= bound, f"gateway RSS grew {grown:.0f} MiB (bound {bound:.0f} MiB)"
    assert gateway.proc is not None and gateway.proc.poll() is None
    assert "Traceback" not in gateway.log_text()


async def test_a_block_subscriber_that_stops_reading_gets_4008_and_the_publisher_proceeds(
    stalled_gateway: GatewayProcess,
) -> None:
    """``block`` and a client that stopped reading: after the block wait it is closed with
    4008, the publishes go on, and what it was sent before has no gap."""
    gateway = stalled_gateway
    token = gateway.issue_token("admin", name="admin")
    topic = unique("mbstallblock")
    url = f"{gateway.ws}/ws/topics/{topic}/?capacity=100&credit=1000000000&on_full=block"
    blocker = await silent(url, token, compression=None)
    sub = await GoodSubscriber.open(gateway, token, topic)
    producer = await Socket.open(f"{gateway.ws}/ws/produce/", token)
    await publish_all(producer, topic, PUBLISHES)  # every publish is answered ``published``
    # The publish that met its full buffer waited GATEWAY_BLOCK_WAIT, then it was closed
    # (its close frame goes out behind what it was sent, once it reads again).
    snapshot = await stats(gateway, token)
    assert snapshot["process"]["slow_consumers_closed"] == 1, snapshot["process"]
    [row] = [t for t in snapshot["topics"] if t["name"] == topic]
    assert row["subscribers"] == 1, row
    await wait_until(
        lambda: sub.heard == PUBLISHES or sub.check(),
        "the subscriber to hear every publish",
        timeout=120,
    )
    # It reads again: what it was sent, in order and with nothing dropped, then 4008.
    blocker.transport.resume_reading()
    seqs: list[int] = []

    async def read_to_the_end() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for text in blocker:
                frame = json.loads(text)
                assert frame["op"] == "messages" and frame["dropped"] == 0, frame["op"]
                seqs.extend(item["seq"] for item in frame["items"])

    await asyncio.wait_for(read_to_the_end(), 60)
    assert blocker.close_code == 4008, blocker.close_code
    assert seqs == list(range(1, len(seqs) + 1))
    assert 100 <= len(seqs) < PUBLISHES, len(seqs)  # its buffer and its window, not the rest
    print(f"{gateway.server}: the block subscriber got {len(seqs)} messages, then 4008")
    await sub.close()
    await producer.close()
    assert gateway.proc is not None and gateway.proc.poll() is None
    assert "Traceback" not in gateway.log_text()


async def test_publishing_to_ever_new_topic_names_costs_bounded_memory(
    quiet_sqlite_gateway: GatewayProcess,
) -> None:
    gateway = quiet_sqlite_gateway
    assert gateway.proc is not None
    token = gateway.issue_token("admin", name="admin")
    producer = await Socket.open(f"{gateway.ws}/ws/produce/", token)
    warm = unique("mbwarm")
    for _ in range(10):
        await asyncio.gather(
            *[producer.request({"op": "publish", "topic": warm, "body": i}) for i in range(500)]
        )
    before = rss_mib(gateway.proc.pid)
    names = 100_000
    prefix = unique("mbname") + "." + "n" * 120  # names of about 140 characters
    for start in range(0, names, 500):
        replies = await asyncio.gather(
            *[
                producer.request({"op": "publish", "topic": f"{prefix}.{i}", "body": 1}, 60)
                for i in range(start, start + 500)
            ]
        )
        assert all(r["op"] == "published" for r in replies), replies[0]
    grown = rss_mib(gateway.proc.pid) - before
    await producer.close()
    print(f"gateway RSS grew {grown:.1f} MiB for {names} topic names")
    # Nobody subscribes to any of them: nothing of them needs keeping but a bounded summary.
    assert grown <= SLACK_MIB, f"gateway RSS grew {grown:.0f} MiB for {names} topic names"


def test_body_size_is_what_the_bounds_assume() -> None:
    """The bounds above are in units of BODY_BYTES: the bodies must really be that big."""
    assert abs(len(json.dumps(body(12345))) - BODY_BYTES) < 64

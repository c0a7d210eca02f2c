"""Injected faults under load: kill -9 at random moments, PostgreSQL and Redis restarted.

The PostgreSQL and Redis tests restart the machine's real servers, so they
need root and the servers' own control commands; elsewhere (a laptop) they
are skipped with the reason shown. Each waits for its server to answer again
before it returns, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import Socket, ahttp, unique
from tests.support.databases import PG_ADMIN_URL, REDIS_URL, postgres_unavailable, redis_unavailable
from tests.support.gateways import GatewayProcess, gateways_on_redis

#: The tests that restart the PostgreSQL and Redis every test uses run alone,
#: after the parallel run; kill -9 of a gateway of the test's own does not.
restarts_shared_servers = pytest.mark.serial

ROUNDS = 20


class Load:
    """Producers and a worker on one queue, recording what the gateway confirmed."""

    def __init__(self, gw: GatewayProcess, token: str, queue: str) -> None:
        self.gw, self.token, self.queue = gw, token, queue
        self.confirmed: set[int] = set()  # enqueues the gateway answered `enqueued` to
        self.unavailable = 0  # enqueues answered `unavailable` (nothing applied)
        self.delivered: set[int] = set()
        self.acked: set[int] = set()  # acks the gateway answered `acked` to
        # Producers stop on this flag, not by cancellation: Python 3.11's
        # wait_for can swallow a cancel that races a frame's arrival.
        self.stopping = False

    async def produce(self, start: int) -> None:
        """Pipelined enqueues of numbered bodies until the socket dies."""
        with contextlib.suppress(Exception):
            async with await Socket.open(f"{self.gw.ws}/ws/produce/", self.token) as p:
                n = start
                while not self.stopping:
                    batch = range(n, n + 50)
                    for i in batch:
                        await p.send({"op": "enqueue", "queue": self.queue, "body": i, "ref": i})
                    for _ in batch:
                        reply = await p.next(timeout=10)
                        if reply["op"] == "enqueued":
                            self.confirmed.add(reply["ref"])
                        elif reply.get("code") == "unavailable":
                            self.unavailable += 1
                    n += 50

    async def consume(self) -> None:
        """Ack every delivery (ref = body), recording confirmed acks, until the socket dies."""
        with contextlib.suppress(Exception):
            url = f"{self.gw.ws}/ws/queues/{self.queue}/?prefetch=50&visibility_timeout=1"
            async with await Socket.open(url, self.token) as w:
                while not self.stopping:
                    try:
                        frame = await w.next(timeout=1)
                    except TimeoutError:
                        continue  # idle: look at the flag again
                    if frame["op"] == "deliver":
                        self.delivered.add(frame["body"])
                        await w.send(
                            {"op": "ack", "receipt": frame["receipt"], "ref": frame["body"]}
                        )
                    elif frame["op"] == "acked":
                        self.acked.add(frame["ref"])

    def start(self, producers: int, base: int) -> list[asyncio.Task[None]]:
        tasks = [asyncio.create_task(self.produce(base + k * 1_000_000)) for k in range(producers)]
        tasks.append(asyncio.create_task(self.consume()))
        return tasks

    async def stop(self, tasks: list[asyncio.Task[None]]) -> None:
        """Stop the producers and the worker started by :meth:`start`."""
        self.stopping = True
        await asyncio.wait(tasks, timeout=60)
        self.stopping = False

    async def drain(self, timeout: float = 120) -> None:
        """Consume until the queue holds nothing deliverable."""
        consumer = asyncio.create_task(self.consume())
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                await asyncio.sleep(0.3)
                status, s = await ahttp(
                    "GET", f"{self.gw.http}/api/queues/{self.queue}", self.token
                )
                if status == 200 and s["visible"] + s["in_flight"] + s["delayed"] == 0:
                    return
            raise AssertionError(f"the queue did not drain: {s}")
        finally:
            await self.stop([consumer])


@pytest.mark.slow
# Twenty gateway starts beside the parallel run's other workers: a guard
# against a hang, not a claim about speed (seen: 300 s on a machine at load 17).
@pytest.mark.timeout(600)
async def test_kill_9_at_random_moments_loses_nothing_confirmed(
    own_gateway: GatewayProcess,
) -> None:
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    token = own_gateway.issue_token("admin", name="faults")
    load = Load(own_gateway, token, unique("kill"))
    for round_no in range(ROUNDS):
        if round_no:
            own_gateway.start()
        tasks = load.start(producers=2, base=round_no * 10_000_000)
        await asyncio.sleep(rng.uniform(0.2, 1.5))  # a random moment under load
        own_gateway.kill()
        await asyncio.wait(tasks, timeout=30)
    own_gateway.start()
    acked_before = set(load.acked)
    redelivered: set[int] = set()
    load.delivered, seen_before = set(), set(load.delivered)
    await load.drain()
    redelivered = load.delivered & acked_before
    assert len(load.confirmed) > ROUNDS * 50, f"the load never got going (seed {seed})"
    lost = load.confirmed - seen_before - load.delivered
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]} (seed {seed})"
    # An ack the gateway confirmed is durable: that message never comes back.
    assert not redelivered, f"acked messages delivered again: {sorted(redelivered)[:5]}"
    _, stats = await ahttp("GET", f"{own_gateway.http}/api/queues/{load.queue}", token)
    assert stats["dead"] == 0, stats  # ten deliveries were never needed


# -- PostgreSQL restarted under load -------------------------------------------


def _postgres_restart_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "restarting PostgreSQL needs root"
    if shutil.which("pg_ctlcluster") is None or not Path("/etc/postgresql").is_dir():
        return "no pg_ctlcluster (Debian's PostgreSQL) to restart the server with"
    return postgres_unavailable()


def restart_postgres() -> None:
    """Restart the machine's PostgreSQL cluster (fast mode: sessions are cut)."""
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart", "-m", "fast"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    deadline = time.monotonic() + 60
    while postgres_unavailable() is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"PostgreSQL at {PG_ADMIN_URL} did not come back")
        time.sleep(0.2)


@pytest.fixture
def pg_gateway(postgres_env: tuple[dict[str, str], Path]) -> Iterator[GatewayProcess]:
    reason = _postgres_restart_unavailable()
    if reason:
        pytest.skip(reason)
    env, var = postgres_env
    process = GatewayProcess(env, var, name="pg-restart")
    process.start()
    yield process
    process.stop()


@restarts_shared_servers
async def test_postgres_restart_under_load_answers_unavailable_then_recovers(
    pg_gateway: GatewayProcess,
) -> None:
    token = pg_gateway.issue_token("admin", name="pg-restart")
    load = Load(pg_gateway, token, unique("pgrestart"))
    tasks = load.start(producers=2, base=0)
    deadline = time.monotonic() + 30
    while len(load.confirmed) < 500 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.to_thread(restart_postgres)
    # The same sockets carry on: enqueues are confirmed again after the restart.
    after = len(load.confirmed)
    deadline = time.monotonic() + 60
    while len(load.confirmed) < after + 500 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await load.stop(tasks)
    assert len(load.confirmed) >= after + 500, "enqueues did not recover after the restart"
    assert load.unavailable > 0, "the restart never reached a client as `unavailable`"
    seen_before = set(load.delivered)
    await load.drain()
    lost = load.confirmed - seen_before - load.delivered
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    assert "Traceback" not in pg_gateway.log_text()


# -- Redis restarted under two gateway processes -------------------------------


def _redis_restart_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "restarting Redis needs root"
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        return "no redis-server / redis-cli to restart Redis with"
    return redis_unavailable()


def restart_redis() -> None:
    """Stop the machine's Redis (no save) and start it again as the machine does."""

    def config(name: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", "6379", "CONFIG", "GET", name],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.split("\n")
        return out[1].strip() if len(out) > 1 else ""

    folder, logfile = config("dir") or "/tmp", config("logfile")
    subprocess.run(["redis-cli", "-p", "6379", "SHUTDOWN", "NOSAVE"], timeout=10)
    deadline = time.monotonic() + 20
    while redis_unavailable() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)  # down for a moment, under load
    command = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1"]
    command += ["--port", "6379", "--save", "", "--appendonly", "no", "--dir", folder]
    if logfile:
        command += ["--logfile", logfile]
    subprocess.run(command, check=True, timeout=30)
    deadline = time.monotonic() + 30
    while redis_unavailable() is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"Redis at {REDIS_URL} did not come back")
        time.sleep(0.1)


@pytest.fixture
def redis_pair() -> Iterator[tuple[GatewayProcess, GatewayProcess, str]]:
    """Gateways A and B on one Redis, each with its own SQLite file holding one token."""
    reason = _redis_restart_unavailable()
    if reason:
        pytest.skip(reason)
    var = Path(tempfile.mkdtemp(prefix="leasecast-redis-restart-"))
    with gateways_on_redis(var, REDIS_URL, GATEWAY_BLOCK_WAIT="2") as pair:
        yield pair


class Reader:
    """A subscriber socket that records every body, the drops reported and how it closed."""

    def __init__(self, socket: Socket) -> None:
        self.socket = socket
        self.bodies: list[int] = []
        self.dropped = 0
        self.close_code: int | None = None
        self.task = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, gw: GatewayProcess, token: str, topic: str, policy: str) -> Reader:
        url = f"{gw.ws}/ws/topics/{topic}/?on_full={policy}&capacity=100000&credit=1000000"
        return cls(await Socket.open(url, token))

    async def _read(self) -> None:
        while True:
            try:
                frame = await self.socket.next(timeout=600)
            except ConnectionError:
                break
            if frame.get("op") == "messages":
                self.dropped += frame["dropped"]
                self.bodies += [item["body"] for item in frame["items"]]
        self.close_code = self.socket.conn.close_code

    def gaps(self, refused: set[int]) -> int:
        """Accepted messages missing between the first and the last body received."""
        missing = 0
        for a, b in zip(self.bodies, self.bodies[1:], strict=False):
            missing += sum(1 for x in range(a + 1, b) if x not in refused)
        return missing


@restarts_shared_servers
async def test_redis_restart_fan_out_resumes_and_block_never_gets_a_gap(
    redis_pair: tuple[GatewayProcess, GatewayProcess, str],
) -> None:
    a, b, token = redis_pair
    topic = unique("redis")
    blocker = await Reader.open(b, token, topic, "block")
    dropper = await Reader.open(b, token, topic, "drop_oldest")
    await asyncio.sleep(1)  # B's group membership reaches Redis
    counter = 0
    refused: set[int] = set()  # publishes the publisher was told failed
    epochs: dict[int, str] = {}  # the topic's epoch each accepted publish got

    async def publish_for(seconds: float) -> None:
        nonlocal counter
        deadline = time.monotonic() + seconds
        async with await Socket.open(f"{a.ws}/ws/produce/", token) as p:
            while time.monotonic() < deadline:
                counter += 1
                reply = await p.request({"op": "publish", "topic": topic, "body": counter}, 30)
                if reply["op"] != "published":
                    refused.add(counter)
                else:
                    epochs[counter] = reply["epoch"]
                await asyncio.sleep(0.005)

    await publish_for(1.5)
    restart = asyncio.create_task(asyncio.to_thread(restart_redis))
    await publish_for(3)  # publishes while Redis is down and coming back
    await restart
    await asyncio.sleep(2)  # B's receive loop reconnects and rejoins its groups
    late = await Reader.open(b, token, topic, "drop_oldest")
    await asyncio.sleep(1)
    await publish_for(2)
    await asyncio.sleep(2)
    for reader in (blocker, dropper, late):
        await reader.socket.close()
        await asyncio.wait_for(reader.task, 10)
    # Fan-out resumed: what was published after the restart reached B's subscribers.
    assert late.bodies and late.bodies[-1] == counter, late.bodies[-5:]
    # Redis lost the topic's stream and offsets: a new epoch (protocol 1.1,
    # Topics). The subscribers of the old one were closed with 4409, never
    # shown the new stream as if it went on from the old.
    old_epoch = epochs[min(epochs)]
    assert epochs[counter] != old_epoch
    for reader in (blocker, dropper):
        assert reader.close_code == 4409, reader.close_code
        assert {epochs.get(x, old_epoch) for x in reader.bodies} == {old_epoch}
    # Whatever the outage lost is counted as dropped, never silent.
    assert dropper.dropped >= dropper.gaps(refused), (dropper.dropped, dropper.gaps(refused))
    # The block subscriber got every message in order or was disconnected at its gap.
    assert blocker.gaps(refused) == 0, blocker.bodies
    # What it got is the old epoch's accepted publishes from the first on, with
    # no hole: whatever Redis lost before B read it ended the socket (4409).
    accepted = [x for x in range(1, counter + 1) if epochs.get(x) == old_epoch]
    assert blocker.bodies == accepted[: len(blocker.bodies)], "a silent gap"
    assert "Traceback" not in a.log_text() + b.log_text()

"""Leasecast through its Python client, and raw WebSocket fan-out (Leasecast, ``websockets``).

- :class:`LeasecastQueue`: ``leasecast.Producer`` and ``leasecast.Worker`` as
  they come (``batch=True``, the default path: coalesced ``enqueue_many``,
  batched deliveries, ``ack_many``) or with ``batch=False`` (v1 frames: one
  ``enqueue``, ``deliver``, ``ack`` per message).
- :class:`RawSocketFanout`: subscribers as bare WebSockets, the publisher a
  socket sending one publish frame per message and reading one reply each;
  for the gateway (``/ws/topics/``) and for ``bench/websockets_baseline.py``
  (``websockets.broadcast``), through :class:`bench.fanout.Target`.
- :class:`ClientSubscriberFanout`: the gateway with ``leasecast.Subscriber``
  subscribers.
- :class:`LeasecastResume`: a topic with history, read back from an offset
  by a raw socket (``since``/``epoch``, unlimited credit) or by
  ``leasecast.Subscriber`` (its default credit).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import orjson
from leasecast import Producer, Subscriber, Worker
from websockets.asyncio.client import ClientConnection, connect

from bench.fanout import Target
from bench.peers.base import (
    FanoutPeer,
    OnBodies,
    OnMessage,
    PeerProducer,
    PeerPublisher,
    PeerSubscriber,
    PeerWorker,
    QueuePeer,
    ResumePeer,
)
from bench.procstat import cpu_of
from bench.workqueue import LeasecastTarget

SQLITE_DURABILITY = (
    "`enqueued`/`acked` after the commit; SQLite WAL with synchronous=NORMAL "
    "(the default, GATEWAY_SQLITE_SYNCHRONOUS): survives a crash of the process, "
    "no fsync per commit (FULL adds one)"
)
POSTGRES_DURABILITY = (
    "`enqueued`/`acked` after the commit; synchronous_commit on: every group commit of "
    "enqueues and acks waits for the WAL fsync (lease rounds do not)"
)


def backends_cpu_seconds(database: str) -> float | None:
    """CPU seconds so far of the PostgreSQL backends connected to ``database``
    (None if the server cannot be asked)."""
    try:
        import psycopg

        from tests.support.databases import PG_ADMIN_URL

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", (database,)
            ).fetchall()
    except Exception:
        return None
    return cpu_of(row[0] for row in rows)


class _ClientProducer(PeerProducer):
    def __init__(self, producer: Producer, queue: str) -> None:
        self.producer = producer
        self.queue = queue

    async def enqueue(self, body: dict[str, float]) -> None:
        await self.producer.enqueue(self.queue, body)

    async def close(self) -> None:
        await self.producer.close()


class _ClientWorker(PeerWorker):
    def __init__(self, worker: Worker, on_message: OnMessage) -> None:
        self.worker = worker
        self.loop = asyncio.create_task(self._run(on_message))

    async def _run(self, on_message: OnMessage) -> None:
        async for delivery in self.worker:
            on_message(delivery.body["t"], delivery.ack)

    async def close(self) -> None:
        await self.worker.close()
        self.loop.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.loop


class LeasecastQueue(QueuePeer):
    """A gateway driven by ``leasecast.Producer`` and ``leasecast.Worker``."""

    def __init__(self, target: LeasecastTarget, *, batch: bool, database: str) -> None:
        self.target = target
        self.batch = batch
        self.name = f"leasecast-{database}" + ("" if batch else "-v1")
        self.durability = POSTGRES_DURABILITY if database == "postgres" else SQLITE_DURABILITY
        self.url = target.gateway.http
        self.token = target.headers["Authorization"].removeprefix("Bearer ")
        self.runs = 0

    async def new_queue(self) -> str:
        self.runs += 1
        return f"hl{self.runs}x{id(self) % 10_000}{'b' if self.batch else 'v'}"

    async def producer(self, queue: str) -> PeerProducer:
        producer = Producer(self.url, token=self.token, batch=self.batch)
        await producer.__aenter__()
        return _ClientProducer(producer, queue)

    async def worker(self, queue: str, prefetch: int, on_message: OnMessage) -> PeerWorker:
        worker = Worker(self.url, queue, token=self.token, prefetch=prefetch, batch=self.batch)
        await worker.connect()
        return _ClientWorker(worker, on_message)

    def server_pids(self) -> list[int]:
        proc = self.target.gateway.proc
        return [proc.pid] if proc is not None else []

    def database_cpu(self) -> float | None:
        """The CPU of the gateway's PostgreSQL sessions (its store's, its
        listener's, its schedules'), which live as long as the gateway: other
        databases on the same server (other people's tests) do not count."""
        url = self.target.gateway.env.get("DATABASE_URL")
        if not url:
            return None
        return backends_cpu_seconds(url.rsplit("/", 1)[-1].split("?")[0])


# -- fan-out ------------------------------------------------------------------


class _SocketSubscriber(PeerSubscriber):
    def __init__(self, ws: ClientConnection, leasecast: bool, on_bodies: OnBodies) -> None:
        self.ws = ws
        self.reader = asyncio.create_task(self._read(leasecast, on_bodies))

    async def _read(self, leasecast: bool, on_bodies: OnBodies) -> None:
        async for text in self.ws:
            frame = orjson.loads(text)
            if leasecast:
                if frame.get("op") == "messages":
                    # One message at a time, as the Subscriber arm hands them
                    # (and as an application handles them): the two arms then
                    # differ in the client alone, not in the benchmark's callback.
                    for item in frame["items"]:
                        on_bodies([item["body"]["t"]])
            else:
                on_bodies([frame["body"]["t"]])

    async def close(self) -> None:
        await self.ws.close()
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.reader


class _SocketPublisher(PeerPublisher):
    """Publish frames on one socket; each reply (in order) confirms the oldest publish."""

    def __init__(self, ws: ClientConnection, target: Target) -> None:
        self.ws = ws
        self.target = target
        self.waiting: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for _reply in self.ws:
            self.waiting.get_nowait().set_result(None)

    async def publish(self, topic: str, body: dict[str, float]) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.put_nowait(future)
        frame: dict[str, Any] = {"topic": topic, "body": body}
        if self.target.leasecast:
            frame["op"] = "publish"
        await self.ws.send(orjson.dumps(frame).decode())
        await future

    async def close(self) -> None:
        await self.ws.close()
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.reader


class RawSocketFanout(FanoutPeer):
    """Bare WebSocket subscribers of the gateway or of the ``websockets.broadcast`` server."""

    def __init__(self, name: str, target: Target, pids: list[int], delivery: str) -> None:
        self.name = name
        self.target = target
        self.pids = pids
        self.delivery = delivery

    async def subscriber(self, topic: str, expected: int, on_bodies: OnBodies) -> PeerSubscriber:
        ws = await connect(
            self.target.sub_url(topic, max(expected, 1024)),
            additional_headers=self.target.headers,
            max_size=None,
        )
        return _SocketSubscriber(ws, self.target.leasecast, on_bodies)

    async def publisher(self) -> PeerPublisher:
        ws = await connect(self.target.pub_url(), additional_headers=self.target.headers)
        return _SocketPublisher(ws, self.target)

    def server_pids(self) -> list[int]:
        return self.pids


class _ClientSubscriber(PeerSubscriber):
    def __init__(self, subscriber: Subscriber, on_bodies: OnBodies) -> None:
        self.subscriber = subscriber
        self.reader = asyncio.create_task(self._read(on_bodies))

    async def _read(self, on_bodies: OnBodies) -> None:
        async for message in self.subscriber:
            on_bodies([message.body["t"]])

    async def close(self) -> None:
        await self.subscriber.close()
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.reader


class ClientSubscriberFanout(RawSocketFanout):
    """The gateway, subscribed through ``leasecast.Subscriber`` (its default credit)."""

    async def subscriber(self, topic: str, expected: int, on_bodies: OnBodies) -> PeerSubscriber:
        token = self.target.headers["Authorization"].removeprefix("Bearer ")
        subscriber = Subscriber(
            self.target.base, topic, token=token, capacity=max(expected, 1024), reconnect=False
        )
        await subscriber.__aenter__()
        return _ClientSubscriber(subscriber, on_bodies)


# -- resume -------------------------------------------------------------------


async def publish_all(ws: ClientConnection, topic: str, bodies: list[Any]) -> dict[str, Any]:
    """Publish ``bodies`` in order on a ``/ws/produce/`` socket, 100 unconfirmed
    at most; the last ``published`` reply (its ``offset`` and ``epoch``)."""
    window = asyncio.Semaphore(100)
    last: dict[str, Any] = {}

    async def replies() -> None:
        nonlocal last
        for _ in bodies:
            reply = orjson.loads(await ws.recv())
            if reply.get("op") != "published":
                raise RuntimeError(f"publish refused: {reply}")
            last = reply
            window.release()

    reader = asyncio.create_task(replies())
    try:
        for body in bodies:
            await window.acquire()
            await ws.send(orjson.dumps({"op": "publish", "topic": topic, "body": body}).decode())
        await reader
    finally:
        reader.cancel()
    return last


class LeasecastResume(ResumePeer):
    """A topic with ``history_size`` room for what is missed, read back with
    ``since``/``epoch``: by a raw socket (credit 1,000,000,000) or by
    ``leasecast.Subscriber`` as it comes (credit 256, granted as it reads)."""

    def __init__(self, name: str, target: LeasecastTarget, *, client: bool, delivery: str) -> None:
        self.name = name
        self.target = target
        self.client = client
        self.delivery = delivery

    async def fill(self, missed: int) -> Any:
        from tests.support.clients import ahttp

        gateway = self.target.gateway
        topic = f"resume{uuid.uuid4().hex[:10]}"
        status, doc = await ahttp(
            "PATCH", f"{gateway.http}/api/topics/{topic}", self.target.token,
            {"history_size": missed + 1_000},
        )  # fmt: skip
        if status != 200:
            raise RuntimeError(f"PATCH /api/topics/{topic}: {status} {doc}")
        async with connect(
            f"{gateway.ws}/ws/produce/", additional_headers=self.target.headers
        ) as ws:
            first = await publish_all(ws, topic, [{"m": 0}])
            await publish_all(ws, topic, [{"m": m} for m in range(1, missed + 1)])
        return topic, int(first["offset"]), str(first["epoch"])

    async def replay(self, position: Any, missed: int) -> list[int]:
        topic, since, epoch = position
        if self.client:
            return await self._through_client(topic, since, epoch, missed)
        got: list[int] = []
        url = (
            f"{self.target.gateway.ws}/ws/topics/{topic}/?since={since}&epoch={epoch}"
            f"&capacity={missed + 1_000}&credit=1000000000"
        )
        async with connect(url, additional_headers=self.target.headers, max_size=None) as ws:
            while len(got) < missed:
                frame = orjson.loads(await ws.recv())
                if frame.get("op") == "subscribed" and not frame.get("recovered"):
                    raise RuntimeError(f"the position was not recovered: {frame}")
                if frame.get("op") == "messages":
                    got += [item["body"]["m"] for item in frame["items"]]
        return got[:missed]

    async def _through_client(self, topic: str, since: int, epoch: str, missed: int) -> list[int]:
        got: list[int] = []
        async with Subscriber(
            self.target.gateway.http, topic, token=self.target.token, since=since, epoch=epoch,
            capacity=missed + 1_000, reconnect=False,
        ) as subscriber:  # fmt: skip
            async for message in subscriber:
                got.append(message.body["m"])
                if len(got) >= missed:
                    break
        if subscriber.gaps:
            raise RuntimeError("the position was not recovered")
        return got

    def server_pids(self) -> list[int]:
        proc = self.target.gateway.proc
        return [proc.pid] if proc is not None else []

"""NATS JetStream through nats-py: a WorkQueue stream on file storage, a durable pull consumer.

- **stream**: one per measurement, ``retention=workqueue`` (a message is
  removed once acked), ``storage=file``, one subject.
- **producers**: ``js.publish`` awaits the stream's PubAck (the message is
  in the stream's file).
- **workers**: one durable pull consumer (explicit ack) shared by all
  workers; each worker keeps up to ``prefetch`` messages requested
  (``$JS.API.CONSUMER.MSG.NEXT`` with ``batch``), topping the request up
  when half has arrived, as the newer NATS clients' ``consume()`` does.
  nats-py's own ``fetch(batch)`` waits for the whole batch (or its
  timeout) once the stream is empty, which would make the paced latency
  the timeout rather than the system's.
- **ack**: ``msg.ack()``, one ``+ACK`` publish per message, not answered;
  so the clock stops when the stream reports no messages left.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import orjson

from bench.peers.base import (
    OnMessage,
    PeerProducer,
    PeerWorker,
    QueuePeer,
    ResumePeer,
    port_unavailable,
)
from bench.procstat import pids_named

# Another port (LEASECAST_BENCH_NATS_PORT) for a server elsewhere, or none (the smoke test).
NATS_PORT = int(os.environ.get("LEASECAST_BENCH_NATS_PORT", "4222"))
NATS_URL = f"nats://127.0.0.1:{NATS_PORT}"
DURABILITY = (
    "WorkQueue stream, file storage, PubAck once the server stored the message; "
    "no fsync per message: the file store is synced on an interval (sync_interval, "
    "2 minutes by default), so an OS crash or a power cut may lose acknowledged "
    "messages of that interval; +ACK is not answered"
)
RESUME_DELIVERY = (
    "a stream on file storage (limits retention) read from its first message by an "
    "ordered push consumer (nats-py `ordered_consumer=True`): in order, no acks; "
    "stored without an fsync per message (sync_interval)"
)


def unavailable() -> str | None:
    """Why NATS (with JetStream) cannot be used, or None."""
    return port_unavailable("NATS", NATS_PORT)


class _Producer(PeerProducer):
    def __init__(self, nc: Any, subject: str) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.subject = subject

    async def enqueue(self, body: dict[str, float]) -> None:
        await self.js.publish(self.subject, orjson.dumps(body))

    async def close(self) -> None:
        await self.nc.close()


class _Worker(PeerWorker):
    """Pull requests kept topped up to ``prefetch`` outstanding messages."""

    def __init__(self, nc: Any, stream: str, consumer: str, prefetch: int) -> None:
        self.nc = nc
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.prefetch = prefetch
        self.requested = 0  # messages asked for and not yet received
        self.inbox = nc.new_inbox()

    async def start(self, on_message: OnMessage) -> None:
        async def handle(msg: Any) -> None:
            if not msg.data and msg.headers and msg.headers.get("Status"):
                # 408 (request expired) or 409: that request will bring nothing more.
                pending = msg.headers.get("Nats-Pending-Messages")
                self.requested = max(0, self.requested - int(pending)) if pending else 0
            else:
                self.requested -= 1
                on_message(orjson.loads(msg.data)["t"], msg.ack)
            await self.top_up()

        await self.nc.subscribe(self.inbox, cb=handle)
        await self.top_up()

    async def top_up(self) -> None:
        if self.requested > self.prefetch // 2:
            return
        batch = self.prefetch - self.requested
        self.requested = self.prefetch
        request = {"batch": batch, "expires": 30_000_000_000}  # 30 s, in ns
        await self.nc.publish(self.next_subject, orjson.dumps(request), reply=self.inbox)

    async def close(self) -> None:
        await self.nc.close()


class JetStreamQueue(QueuePeer):
    """NATS JetStream on 127.0.0.1:4222."""

    name = "nats-jetstream"
    durability = DURABILITY

    def __init__(self) -> None:
        self.nc: Any = None
        self.js: Any = None
        self.runs = 0

    async def start(self) -> None:
        import nats

        self.nc = await nats.connect(NATS_URL)
        self.js = self.nc.jetstream()

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()

    async def new_queue(self) -> str:
        from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType

        self.runs += 1
        stream = f"LCHEADLINE{int(time.time() * 1000)}X{self.runs}"
        await self.js.add_stream(
            name=stream,
            subjects=[stream.lower()],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
        )
        await self.js.add_consumer(
            stream,
            ConsumerConfig(
                durable_name="workers", ack_policy=AckPolicy.EXPLICIT, max_ack_pending=-1
            ),
        )
        return stream

    async def drop_queue(self, queue: str) -> None:
        await self.js.delete_stream(queue)

    async def producer(self, queue: str) -> PeerProducer:
        import nats

        return _Producer(await nats.connect(NATS_URL), queue.lower())

    async def worker(self, queue: str, prefetch: int, on_message: OnMessage) -> PeerWorker:
        import nats

        worker = _Worker(await nats.connect(NATS_URL), queue, "workers", prefetch)
        await worker.start(on_message)
        return worker

    async def drained(self, queue: str) -> None:
        # Acks are not answered: the stream's count says when the last one was applied.
        while (await self.js.stream_info(queue)).state.messages:
            await asyncio.sleep(0.005)

    def server_pids(self) -> list[int]:
        return pids_named("nats-server")


class JetStreamResume(ResumePeer):
    """A stream on file storage, read back from its start by an ordered consumer."""

    name = "nats-jetstream-ordered"
    delivery = RESUME_DELIVERY

    def __init__(self) -> None:
        self.nc: Any = None
        self.js: Any = None
        self.streams: list[str] = []

    async def start(self) -> None:
        import nats

        self.nc = await nats.connect(NATS_URL)
        self.js = self.nc.jetstream()

    async def close(self) -> None:
        if self.nc is None:
            return
        for stream in self.streams:
            try:
                await self.js.delete_stream(stream)
            except Exception as exc:  # a stream left behind is only disk space
                print(f"   could not delete stream {stream}: {exc!r}", flush=True)
        await self.nc.close()

    async def fill(self, missed: int) -> Any:
        from nats.js.api import StorageType

        stream = f"LCRESUME{int(time.time() * 1000)}X{len(self.streams)}"
        subject = stream.lower()
        await self.js.add_stream(name=stream, subjects=[subject], storage=StorageType.FILE)
        self.streams.append(stream)
        # Core publishes on one connection keep their order; the stream's
        # count says when all are stored.
        for m in range(1, missed + 1):
            await self.nc.publish(subject, orjson.dumps({"m": m}))
        await self.nc.flush()
        while (await self.js.stream_info(stream)).state.messages < missed:
            await asyncio.sleep(0.005)
        return subject

    async def replay(self, position: Any, missed: int) -> list[int]:
        got: list[int] = []
        sub = await self.js.subscribe(position, ordered_consumer=True)
        try:
            async for msg in sub.messages:
                got.append(orjson.loads(msg.data)["m"])
                if len(got) >= missed:
                    break
        finally:
            await sub.unsubscribe()
        return got

    def server_pids(self) -> list[int]:
        return pids_named("nats-server")

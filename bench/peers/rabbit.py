"""RabbitMQ through aio-pika: a durable queue, persistent messages, publisher confirms.

The same settings as ``bench.workqueue.rabbit_figures`` (one channel with
confirms per producer, one channel with ``basic.qos(prefetch)`` per worker,
one manual ack per message), behind the common load generator.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from bench.peers.base import OnMessage, PeerProducer, PeerWorker, QueuePeer
from bench.procstat import pids_named
from bench.workqueue import RABBIT_URL, rabbit_unavailable

__all__ = ["RabbitQueue", "rabbit_unavailable"]

DURABILITY = (
    "durable classic queue, persistent messages, publisher confirms: a confirm is sent "
    "once the message is written and fsynced (RabbitMQ batches the fsyncs); "
    "basic.ack is not answered"
)


class _Producer(PeerProducer):
    def __init__(self, channel: Any, queue: str) -> None:
        self.channel = channel
        self.queue = queue

    async def enqueue(self, body: dict[str, float]) -> None:
        import aio_pika

        await self.channel.default_exchange.publish(
            aio_pika.Message(orjson.dumps(body), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=self.queue,
        )

    async def close(self) -> None:
        await self.channel.close()


class _Worker(PeerWorker):
    def __init__(self, channel: Any) -> None:
        self.channel = channel

    async def close(self) -> None:
        await self.channel.close()


class RabbitQueue(QueuePeer):
    """RabbitMQ on 127.0.0.1:5672 as guest."""

    name = "rabbitmq"
    durability = DURABILITY

    def __init__(self) -> None:
        self.connection: Any = None
        self.runs = 0

    async def start(self) -> None:
        import aio_pika

        self.connection = await aio_pika.connect_robust(RABBIT_URL)

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()

    async def new_queue(self) -> str:
        self.runs += 1
        name = f"lc-headline-{int(time.time() * 1000)}-{self.runs}"
        channel = await self.connection.channel()
        await channel.declare_queue(name, durable=True)
        await channel.close()
        return name

    async def drop_queue(self, queue: str) -> None:
        channel = await self.connection.channel()
        await channel.queue_delete(queue)
        await channel.close()

    async def producer(self, queue: str) -> PeerProducer:
        return _Producer(await self.connection.channel(publisher_confirms=True), queue)

    async def worker(self, queue: str, prefetch: int, on_message: OnMessage) -> PeerWorker:
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        declared = await channel.declare_queue(queue, durable=True)

        async def handle(message: Any) -> None:
            on_message(orjson.loads(message.body)["t"], message.ack)

        await declared.consume(handle)
        return _Worker(channel)

    def server_pids(self) -> list[int]:
        return pids_named("beam.smp")

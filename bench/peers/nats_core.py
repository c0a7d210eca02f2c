"""NATS core publish/subscribe through nats-py: the fan-out baseline with no persistence.

Each subscriber is its own connection with one subscription to the topic's
subject; the publisher publishes on one connection and flushes (a PING/PONG
round trip) after each message it is told to wait for, so the common
window of unconfirmed publishes means what it means for the others: the
server has read them.
"""

from __future__ import annotations

from typing import Any

import orjson

from bench.peers.base import FanoutPeer, OnBodies, PeerPublisher, PeerSubscriber
from bench.peers.nats_js import NATS_URL, unavailable
from bench.procstat import pids_named

__all__ = ["NatsCoreFanout", "unavailable"]

DELIVERY = (
    "at most once, in memory; a subscriber that falls behind past its pending "
    "limits is cut off as a slow consumer"
)


class _Subscriber(PeerSubscriber):
    def __init__(self, nc: Any) -> None:
        self.nc = nc

    async def close(self) -> None:
        await self.nc.close()


class _Publisher(PeerPublisher):
    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.sent = 0

    async def publish(self, topic: str, body: dict[str, float]) -> None:
        await self.nc.publish(topic, orjson.dumps(body))
        self.sent += 1
        if self.sent % 100 == 0:  # one round trip per hundred, as a window of 100 allows
            await self.nc.flush()

    async def close(self) -> None:
        await self.nc.flush()
        await self.nc.close()


class NatsCoreFanout(FanoutPeer):
    """NATS core subjects on 127.0.0.1:4222."""

    name = "nats-core"
    delivery = DELIVERY

    async def subscriber(self, topic: str, expected: int, on_bodies: OnBodies) -> PeerSubscriber:
        import nats

        nc = await nats.connect(NATS_URL)

        async def handle(msg: Any) -> None:
            on_bodies([orjson.loads(msg.data)["t"]])

        await nc.subscribe(topic, cb=handle)
        await nc.flush()  # the subscription reached the server
        return _Subscriber(nc)

    async def publisher(self) -> PeerPublisher:
        import nats

        return _Publisher(await nats.connect(NATS_URL))

    def server_pids(self) -> list[int]:
        return pids_named("nats-server")

"""Mosquitto through aiomqtt: the MQTT fan-out baseline at QoS 0.

Each subscriber is its own MQTT connection subscribed to the topic at
QoS 0; the publisher publishes at QoS 0 (nothing is answered: a publish
returns once the client handed it to its socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import orjson

from bench.peers.base import FanoutPeer, OnBodies, PeerPublisher, PeerSubscriber, port_unavailable
from bench.procstat import pids_named

# Another port (LEASECAST_BENCH_MQTT_PORT) for a broker elsewhere, or none (the smoke test).
MQTT_PORT = int(os.environ.get("LEASECAST_BENCH_MQTT_PORT", "1883"))
DELIVERY = "QoS 0: at most once, in memory; nothing stored, nothing answered"


def unavailable() -> str | None:
    """Why Mosquitto cannot be used, or None."""
    return port_unavailable("Mosquitto (MQTT)", MQTT_PORT)


class _Subscriber(PeerSubscriber):
    def __init__(self, client: Any, on_bodies: OnBodies) -> None:
        self.client = client
        self.reader = asyncio.create_task(self._read(on_bodies))

    async def _read(self, on_bodies: OnBodies) -> None:
        async for message in self.client.messages:
            on_bodies([orjson.loads(message.payload)["t"]])

    async def close(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.reader
        await self.client.__aexit__(None, None, None)


class _Publisher(PeerPublisher):
    def __init__(self, client: Any) -> None:
        self.client = client

    async def publish(self, topic: str, body: dict[str, float]) -> None:
        await self.client.publish(topic, orjson.dumps(body), qos=0)

    async def close(self) -> None:
        await self.client.__aexit__(None, None, None)


class MosquittoFanout(FanoutPeer):
    """Mosquitto on 127.0.0.1:1883."""

    name = "mosquitto-qos0"
    delivery = DELIVERY

    async def _client(self) -> Any:
        import aiomqtt

        client = aiomqtt.Client("127.0.0.1", MQTT_PORT)
        # The load generator's window bounds the publishes in flight: no warning per publish.
        client.pending_calls_threshold = 1_000_000
        await client.__aenter__()
        return client

    async def subscriber(self, topic: str, expected: int, on_bodies: OnBodies) -> PeerSubscriber:
        client = await self._client()
        await client.subscribe(topic, qos=0)  # returns on SUBACK
        return _Subscriber(client, on_bodies)

    async def publisher(self) -> PeerPublisher:
        return _Publisher(await self._client())

    def server_pids(self) -> list[int]:
        return pids_named("mosquitto")

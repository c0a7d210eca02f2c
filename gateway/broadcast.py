"""The broadcast adapter of one gateway process: dispatcher core, sender loop, block waits.

Publishing offers the message to every local subscriber's buffer at once
(``gateway.fanout``); one sender task drains the buffers against credit, by
weight, into coalesced ``messages`` frames (DESIGN decisions 6 and 8). With a
relay (``gateway.relay``), each publish is also handed to the other gateway
processes: one channel-layer message per process per publish, or per batch of
a topic's publishes that piled up while the previous one was sent (decision 7).

``block`` (protocol: Broadcast topics): a publish that meets a full ``block``
buffer waits for room, up to ``GATEWAY_BLOCK_WAIT`` seconds; a socket still
full then is closed with 4008 and the publish proceeds. Publishes to one topic
are applied in order, so a later publish never overtakes a waiting one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from gateway.fanout import Dispatcher, Policy, Subscription

__all__ = ["Broadcaster", "SubscriberSink", "get_broadcaster"]

log = logging.getLogger("leasecast.broadcast")

#: Close code for a ``block`` subscriber that stayed full (protocol: Broadcast topics).
CLOSE_SLOW_CONSUMER = 4008
#: Messages the sender takes per turn before letting the loop run other work.
SEND_BUDGET = 2048


class SubscriberSink(Protocol):
    """What the broadcaster needs of a subscriber socket."""

    def push(self, frame: str) -> None:
        """Queue a frame for sending."""

    def slow_consumer(self) -> None:
        """Close the socket with 4008."""


def encode_messages(topic: str, items: list[tuple[int, bytes]], dropped: int) -> str:
    """``{"op": "messages", "topic", "items": [{"seq", "body"}...], "dropped"}``."""
    parts = b",".join(b'{"seq":%d,"body":%s}' % (seq, body) for seq, body in items)
    return f'{{"op":"messages","topic":"{topic}","items":[{parts.decode()}],"dropped":{dropped}}}'


class Broadcaster:
    """Topics, subscribers and the sender of one process.

    Args:
        block_wait: seconds a publish waits for a full ``block`` subscriber.
        relay: hands a publish to the other processes (None: single process).
    """

    def __init__(
        self,
        *,
        block_wait: float = 10.0,
        relay: Callable[[str, int, int, bytes], Awaitable[None]] | None = None,
        # -- memory
        topic_idle: float = 300.0,
    ) -> None:
        self.dispatcher = Dispatcher(time.time)
        self.block_wait = block_wait
        self.relay = relay
        self.sinks: dict[int, SubscriberSink] = {}
        self._room = asyncio.Event()  # set whenever buffers drained: blocked publishes retry
        self._work = asyncio.Event()
        self._gates: dict[str, asyncio.Lock] = {}
        self._origin_seq: dict[str, int] = {}  # publishes made here, per topic
        # A topic's publishes here are one stream per epoch: a topic forgotten
        # while idle (no local subscriber, no publish for ``topic_idle``
        # seconds) starts a new epoch at seq 1, and other processes, seeing
        # the new epoch, know the seqs started again (gateway.relay). Epochs
        # only increase, so a late mark of an older stream is recognised.
        self._origin_epoch: dict[str, int] = {}
        self._epochs = itertools.count(1)
        self.topic_idle = topic_idle
        self._next_sweep = time.monotonic() + min(10.0, topic_idle)
        self._sender = asyncio.get_running_loop().create_task(self._send_loop())
        # Figures for the dashboard.
        self.slow_consumers_closed = 0
        self.on_topic_change: Callable[[str, int], None] | None = None
        self.relay_state: Any = None  # the Relay, for its figures

    # -- membership

    def subscribe(
        self,
        sink: SubscriberSink,
        topic: str,
        *,
        capacity: int,
        policy: Policy,
        weight: int,
        credit: int,
    ) -> Subscription:
        """Add a subscriber socket."""
        sub = self.dispatcher.subscribe(
            topic, capacity=capacity, policy=policy, weight=weight, credit=credit
        )
        self.sinks[sub.sid] = sink
        if self.on_topic_change is not None:
            self.on_topic_change(topic, self.dispatcher.subscribers(topic))
        return sub

    def unsubscribe(self, sid: int) -> None:
        """Remove a subscriber socket (closed, or gone silent)."""
        self.sinks.pop(sid, None)
        sub = self.dispatcher.unsubscribe(sid)
        if sub is not None:
            self._room.set()  # a blocked publish no longer waits for it
            if self.on_topic_change is not None:
                self.on_topic_change(sub.topic, self.dispatcher.subscribers(sub.topic))

    def grant(self, sid: int, n: int) -> None:
        """A subscriber granted credit."""
        self.dispatcher.grant(sid, n)
        self._work.set()

    # -- publishing

    def publish_now(self, topic: str, body: bytes) -> int | None:
        """The synchronous fast path of :meth:`publish`: the seq if the publish is
        complete already, or None (nothing done) if it must be awaited."""
        if self.relay is not None:
            return None
        self._sweep_idle_topics()  # before this publish marks the topic busy
        gate = self._gates.get(topic)
        if gate is not None and gate.locked():
            return None
        members = self.dispatcher.topics.get(topic)
        if members and any(
            s.policy is Policy.BLOCK and s.buffered >= s.capacity for s in members.values()
        ):
            return None
        outcome = self.dispatcher.publish(topic, body)
        assert not outcome.blocked
        self._work.set()
        return self._next_seq(topic)[1]

    async def publish(self, topic: str, body: bytes) -> int:
        """Publish to local subscribers and hand on to the relay; returns the topic seq.

        Returns once every local buffer has taken the message or dropped it by
        its policy (a full ``block`` subscriber: waited for, or closed with 4008).
        """
        self._sweep_idle_topics()  # before this publish marks the topic busy
        await self._in_order(topic, body)
        epoch, seq = self._next_seq(topic)
        if self.relay is not None:
            await self.relay(topic, epoch, seq, body)
        return seq

    def _next_seq(self, topic: str) -> tuple[int, int]:
        """The (epoch, seq) of the next publish of ``topic`` made here."""
        epoch = self._origin_epoch.get(topic)
        if epoch is None:
            epoch = self._origin_epoch[topic] = next(self._epochs)
        seq = self._origin_seq[topic] = self._origin_seq.get(topic, 0) + 1
        return epoch, seq

    def _sweep_idle_topics(self) -> None:
        # On the publish path, at most every few seconds: memory grows only
        # through publishes, so this is where it is given back.
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + min(10.0, self.topic_idle)
        for topic in self.dispatcher.forget_idle(self.topic_idle):
            self._origin_seq.pop(topic, None)
            self._origin_epoch.pop(topic, None)
            gate = self._gates.get(topic)
            if gate is not None and not gate.locked():
                del self._gates[topic]

    async def deliver_relayed(self, topic: str, body: bytes) -> None:
        """A message published on another process (from the relay)."""
        await self._in_order(topic, body)

    async def _in_order(self, topic: str, body: bytes) -> None:
        gate = self._gates.get(topic)
        if gate is not None and gate.locked():
            async with gate:  # a publish to this topic is waiting: keep the order
                await self._publish_locally(topic, body)
        else:
            await self._publish_locally(topic, body)

    def lose(self, topic: str, n: int) -> None:
        """``n`` messages of ``topic`` were lost between processes."""
        for sub in self.dispatcher.lose(topic, n):
            self._close_slow(sub)
        self._work.set()

    async def _publish_locally(self, topic: str, body: bytes) -> None:
        outcome = self.dispatcher.publish(topic, body)
        self._work.set()
        if outcome.blocked:
            gate = self._gates.setdefault(topic, asyncio.Lock())
            if gate.locked():
                # Inside a waiting publish's gate already (relayed order): just wait.
                await self._wait_for_room(outcome.blocked, body)
            else:
                async with gate:
                    await self._wait_for_room(outcome.blocked, body)

    async def _wait_for_room(self, blocked: list[Subscription], body: bytes) -> None:
        deadline = time.monotonic() + self.block_wait
        while blocked:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for sub in blocked:
                    self._close_slow(sub)
                return
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), remaining)
            blocked = self.dispatcher.offer_again(blocked, body)
            self._work.set()

    def _close_slow(self, sub: Subscription) -> None:
        sink = self.sinks.get(sub.sid)
        self.unsubscribe(sub.sid)
        self.slow_consumers_closed += 1
        if sink is not None:
            sink.slow_consumer()

    # -- sending

    async def _send_loop(self) -> None:
        while True:
            await self._work.wait()
            self._work.clear()
            while self.dispatcher.has_ready:
                for sub, items, dropped in self.dispatcher.drain(SEND_BUDGET):
                    sink = self.sinks.get(sub.sid)
                    if sink is not None and (items or dropped):
                        sink.push(encode_messages(sub.topic, items, dropped))
                self._room.set()
                # Let frames in (credit, publishes) between turns.
                await asyncio.sleep(0)

    def describe_topics(self) -> list[dict[str, Any]]:
        """Every topic of this process for ``/api/stats``."""
        topics = set(self.dispatcher.topics) | set(self.dispatcher.published)
        rows = []
        for topic in sorted(topics):
            subs = self.dispatcher.topics.get(topic, {}).values()
            meter = self.dispatcher.publish_rate.get(topic)
            rows.append(
                {
                    "name": topic,
                    "subscribers": len(subs),
                    "published": self.dispatcher.published.get(topic, 0),
                    "publish_rate": meter.per_second() if meter else 0.0,
                    "dropped": sum(s.dropped for s in subs),
                }
            )
        return rows

    def relay_figures(self) -> dict[str, int] | None:
        """Messages relayed to and from other processes, and lost between them."""
        relay = self.relay_state
        if relay is None:
            return None
        return {"sent": relay.sent, "received": relay.received, "lost": relay.lost}

    def close(self) -> None:
        """Stop the sender."""
        self._sender.cancel()


_broadcasters: dict[asyncio.AbstractEventLoop, Broadcaster] = {}


def get_broadcaster(factory: Callable[[], Broadcaster] | None = None) -> Broadcaster:
    """The broadcaster of the running event loop (one per gateway process)."""
    loop = asyncio.get_running_loop()
    broadcaster = _broadcasters.get(loop)
    if broadcaster is None:
        if factory is None:
            from gateway.relay import make_broadcaster

            factory = make_broadcaster
        broadcaster = _broadcasters[loop] = factory()
    return broadcaster

"""Fan-out between gateway processes over the Channels layer (DESIGN decision 7).

With ``REDIS_URL`` set, ``channels_redis`` is the channel layer. Each process's
channel (``gateway.layer``) joins one group per topic it has subscribers for;
a publish is one ``group_send`` (one channel-layer message per process), and
each receiving process fans out locally.

The layer can drop messages (a full channel, a Redis restart). Every relayed
message carries its origin process and that origin's per-topic sequence
number, so a receiver sees a gap and acts on it as the protocol demands:
``block`` subscribers of the topic are disconnected with 4008, the others
count the loss in ``dropped`` (protocol: Publish).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

from django.conf import settings

from gateway.broadcast import Broadcaster
from gateway.layer import ProcessChannel, get_process_channel

__all__ = ["Relay", "group_for", "make_broadcaster"]

log = logging.getLogger("leasecast.relay")

#: How often recently published topics send their last seq as a mark.
MARK_INTERVAL = 0.25
#: For how long after a topic's last publish marks are sent (seconds).
MARK_FOR = 5.0


def group_for(topic: str) -> str:
    """A valid Channels group name for any topic name (groups are limited to 100 characters)."""
    return "lct." + hashlib.sha1(topic.encode()).hexdigest()


class Relay:
    """Carries publishes between processes and detects what the layer lost.

    Args:
        channel: this process's channel (``gateway.layer``).
        origin: this process's name.
    """

    def __init__(self, channel: ProcessChannel, origin: str) -> None:
        self.channel = channel
        self.layer = channel.layer
        self.origin = origin
        self.broadcaster: Broadcaster | None = None
        self._joined: set[str] = set()
        # (origin, topic) -> (epoch, last seq seen)
        self._last: dict[tuple[str, str], tuple[int, int]] = {}
        # topic -> (epoch, last seq sent, when)
        self._recent: dict[str, tuple[int, int, float]] = {}
        channel.on("fanout.", self._handle)
        self._marker = asyncio.get_running_loop().create_task(self._mark_loop())
        # Figures for the dashboard.
        self.sent = 0
        self.received = 0
        self.lost = 0

    async def send(self, topic: str, epoch: int, seq: int, body: bytes) -> None:
        """Hand a local publish to the other processes."""
        await self.layer.group_send(
            group_for(topic),
            {"type": "fanout.message", "o": self.origin, "t": topic, "e": epoch, "s": seq,
             "b": body},
        )  # fmt: skip
        self.sent += 1
        self._recent[topic] = (epoch, seq, time.monotonic())

    async def _mark_loop(self) -> None:
        # A gap shows only when a later message arrives, so a loss at the end
        # of a burst would stay silent. For MARK_FOR seconds after a topic's
        # last publish, its last seq is sent again every MARK_INTERVAL as a
        # body-less mark: a receiver whose channel overflowed (and lost the
        # first marks too) still sees the trailing gap once it catches up.
        while True:
            await asyncio.sleep(MARK_INTERVAL)
            now = time.monotonic()
            for topic, (epoch, seq, when) in list(self._recent.items()):
                if now - when > MARK_FOR:
                    del self._recent[topic]
                    continue
                try:
                    await self.layer.group_send(
                        group_for(topic),
                        {"type": "fanout.mark", "o": self.origin, "t": topic, "e": epoch,
                         "s": seq},
                    )  # fmt: skip
                except Exception as exc:
                    log.warning("relay mark for %r failed: %s", topic, exc)

    def topic_changed(self, topic: str, subscribers: int) -> None:
        """Join a topic's group with its first local subscriber, leave it after the last."""
        if subscribers and topic not in self._joined:
            self._joined.add(topic)
            asyncio.get_running_loop().create_task(self._group(topic, join=True))
        elif not subscribers and topic in self._joined:
            self._joined.discard(topic)
            # A later re-join starts a fresh stream: no gap against old numbers.
            for key in [k for k in self._last if k[1] == topic]:
                del self._last[key]
            asyncio.get_running_loop().create_task(self._group(topic, join=False))

    async def _group(self, topic: str, *, join: bool) -> None:
        try:
            if join:
                await self.channel.join(group_for(topic))
            else:
                await self.channel.leave(group_for(topic))
        except Exception as exc:
            log.warning("group %s for %r failed: %s", "add" if join else "discard", topic, exc)

    async def _handle(self, message: dict[str, Any]) -> None:
        origin, topic, epoch, seq = message["o"], message["t"], message["e"], message["s"]
        if origin == self.origin or self.broadcaster is None:
            return
        body = message.get("b")  # None: a mark
        self.received += 1
        key = (origin, topic)
        seen = self._last.get(key)
        newer = seen is None
        if seen is not None:
            last = seen[1]
            if epoch < seen[0]:
                return  # a mark of a stream the origin has since restarted: stale
            if epoch > seen[0]:
                # The origin forgot the topic while idle and started its seqs
                # again: this epoch's stream began at 1.
                last, newer = 0, True
            # Before a message, seqs last+1 .. seq-1 are missing; before a mark
            # (which only repeats the last seq sent), last+1 .. seq are.
            missing = seq - last - (1 if body is not None else 0)
            if missing > 0:
                self.lost += missing
                log.warning("relay lost %d messages of %r from %s", missing, topic, origin)
                self.broadcaster.lose(topic, missing)
            newer = newer or seq > last
        if newer:
            self._last[key] = (epoch, seq)
            if body is not None:
                await self.broadcaster.deliver_relayed(topic, body)


def make_broadcaster() -> Broadcaster:
    """The process's broadcaster, with a relay when the channel layer spans processes."""
    from gateway.engine import PROCESS_NAME

    block_wait = float(getattr(settings, "GATEWAY_BLOCK_WAIT", 10.0))
    topic_idle = float(getattr(settings, "GATEWAY_TOPIC_IDLE", 300.0))
    channel = get_process_channel()
    if channel is None:
        return Broadcaster(block_wait=block_wait, topic_idle=topic_idle)
    relay = Relay(channel, PROCESS_NAME)
    broadcaster = Broadcaster(block_wait=block_wait, relay=relay.send, topic_idle=topic_idle)
    relay.broadcaster = broadcaster
    broadcaster.on_topic_change = relay.topic_changed
    broadcaster.relay_state = relay
    return broadcaster

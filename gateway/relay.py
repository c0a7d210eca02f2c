"""Fan-out between gateway processes over the Channels layer (DESIGN decision 7).

With ``REDIS_URL`` set, ``channels_redis`` is the channel layer. Each process's
channel (``gateway.layer``) joins one group per topic it has subscribers for;
publishes are handed on with ``group_send`` (one channel-layer message per
process, for one publish or a batch of them, see below), and each receiving
process fans out locally.

The layer can drop messages (a full channel, a Redis restart). Every relayed
message carries its origin process and that origin's per-topic sequence
number, so a receiver sees a gap and acts on it as the protocol demands:
``block`` subscribers of the topic are disconnected with 4008, the others
count the loss in ``dropped`` (protocol: Publish).

Each ``group_send`` holds one connection of ``channels_redis``'s pool for its
few round trips, and redis-py's asyncio pool does not wait for a free
connection: past ``max_connections`` (100 by default) it raises "Too many
connections". So publishes are never handed to the layer one task each: they
join this process's outbox, and one sender task empties it, one
``group_send`` at a time, with the publishes of one topic that piled up
meanwhile in one ``fanout.batch`` message (in seq order). A pipelining
producer then costs one layer message per round trip, not one connection per
frame, and a topic's messages leave in the order they were published. Group
membership changes go through one task too, the latest wish per topic winning.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import deque
from typing import Any

from gateway.broadcast import Broadcaster
from gateway.conf import gateway_settings
from gateway.layer import ProcessChannel, get_process_channel

__all__ = ["Relay", "group_for", "make_broadcaster"]

log = logging.getLogger("leasecast.relay")

#: How often recently published topics send their last seq as a mark.
MARK_INTERVAL = 0.25
#: For how long after a topic's last publish marks are sent (seconds).
MARK_FOR = 5.0
#: At most this many publishes, and about this many body bytes, per relayed batch.
BATCH_ITEMS = 512
BATCH_BYTES = 1024 * 1024

#: A publish waiting in the outbox: topic, epoch, seq, body, and its waiter.
Outgoing = tuple[str, int, int, bytes, asyncio.Future[None]]


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
        # Publishes not yet handed to the layer, in publish order.
        self._outbox: deque[Outgoing] = deque()
        self._outbox_ready = asyncio.Event()
        # topic -> join (True) or leave (False), not yet applied.
        self._membership: dict[str, bool] = {}
        self._membership_ready = asyncio.Event()
        channel.on("fanout.", self._handle)
        loop = asyncio.get_running_loop()
        self._marker = loop.create_task(self._mark_loop())
        self._sender = loop.create_task(self._send_loop())
        self._member = loop.create_task(self._membership_loop())
        # Figures for the dashboard.
        self.sent = 0
        self.received = 0
        self.lost = 0

    async def send(self, topic: str, epoch: int, seq: int, body: bytes) -> None:
        """Hand a local publish to the other processes; returns once the layer took it.

        Raises what the layer raised if the batch carrying it failed.
        """
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outbox.append((topic, epoch, seq, body, done))
        self._outbox_ready.set()
        await done

    async def _send_loop(self) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while self._outbox:
                pending, self._outbox = self._outbox, deque()
                for batch in _batches(pending):
                    await self._send_batch(batch)

    async def _send_batch(self, batch: list[Outgoing]) -> None:
        """One ``group_send`` for consecutive publishes of one topic and epoch."""
        topic, epoch = batch[0][0], batch[0][1]
        message: dict[str, Any]
        if len(batch) == 1:
            message = {"type": "fanout.message", "o": self.origin, "t": topic, "e": epoch,
                       "s": batch[0][2], "b": batch[0][3]}  # fmt: skip
        else:
            message = {"type": "fanout.batch", "o": self.origin, "t": topic, "e": epoch,
                       "i": [(seq, body) for _, _, seq, body, _ in batch]}  # fmt: skip
        error: Exception | None = None
        try:
            await self.layer.group_send(group_for(topic), message)
        except Exception as exc:
            error = exc
        else:
            self.sent += len(batch)
        # Marks repeat the last seq even if this batch failed: another
        # process then sees the loss, never a silent gap.
        self._recent[topic] = (epoch, batch[-1][2], time.monotonic())
        for *_, done in batch:
            if done.done():
                continue  # its publish was cancelled
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

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
            self._membership[topic] = True
            self._membership_ready.set()
        elif not subscribers and topic in self._joined:
            self._joined.discard(topic)
            # A later re-join starts a fresh stream: no gap against old numbers.
            for key in [k for k in self._last if k[1] == topic]:
                del self._last[key]
            self._membership[topic] = False
            self._membership_ready.set()

    async def _membership_loop(self) -> None:
        # One change at a time, so a burst of new topics does not take a
        # connection each, and a join and a leave of one topic never race.
        while True:
            await self._membership_ready.wait()
            self._membership_ready.clear()
            while self._membership:
                topic = next(iter(self._membership))
                join = self._membership.pop(topic)
                await self._group(topic, join=join)

    async def _group(self, topic: str, *, join: bool) -> None:
        try:
            if join:
                await self.channel.join(group_for(topic))
            else:
                await self.channel.leave(group_for(topic))
        except Exception as exc:
            log.warning("group %s for %r failed: %s", "add" if join else "discard", topic, exc)

    async def _handle(self, message: dict[str, Any]) -> None:
        origin, topic, epoch = message["o"], message["t"], message["e"]
        if origin == self.origin or self.broadcaster is None:
            return
        if message["type"] == "fanout.batch":
            for seq, body in message["i"]:
                await self._take(origin, topic, epoch, seq, body)
        else:
            await self._take(origin, topic, epoch, message["s"], message.get("b"))  # None: a mark

    async def _take(
        self, origin: str, topic: str, epoch: int, seq: int, body: bytes | None
    ) -> None:
        assert self.broadcaster is not None
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


def _batches(pending: deque[Outgoing]) -> list[list[Outgoing]]:
    """``pending`` as batches of one topic and epoch each, every topic's in publish order."""
    batches: list[list[Outgoing]] = []
    open_batch: dict[tuple[str, int], tuple[list[Outgoing], int]] = {}  # stream -> (batch, bytes)
    for item in pending:
        stream = (item[0], item[1])
        batch, size = open_batch.get(stream, (None, 0))
        if batch is None or len(batch) >= BATCH_ITEMS or size + len(item[3]) > BATCH_BYTES:
            batch, size = [], 0
            batches.append(batch)
        batch.append(item)
        open_batch[stream] = (batch, size + len(item[3]))
    return batches


def make_broadcaster() -> Broadcaster:
    """The process's broadcaster, with a relay when the channel layer spans processes."""
    from gateway.engine import PROCESS_NAME

    conf = gateway_settings()
    block_wait, topic_idle = conf.block_wait, conf.topic_idle
    channel = get_process_channel()
    if channel is None:
        return Broadcaster(block_wait=block_wait, topic_idle=topic_idle)
    relay = Relay(channel, PROCESS_NAME)
    broadcaster = Broadcaster(block_wait=block_wait, relay=relay.send, topic_idle=topic_idle)
    relay.broadcaster = broadcaster
    broadcaster.on_topic_change = relay.topic_changed
    broadcaster.relay_state = relay
    return broadcaster

"""Dispatch: a process's topic messages into the local buffers, in offset order, and out.

:meth:`Dispatch.deliver` is the one place messages enter the fan-out
dispatcher (``gateway.core.fanout``), and a topic's ``dispatched`` offset
(:class:`~gateway.topics.followed.Followed`) is the last one it has taken:
a subscriber resuming from an older offset is replayed up to exactly that
offset (``gateway.topics.replay``), then attached to the live stream in the
same step, so the seam has no gap and no duplicate. ``complete`` trails it:
the last offset every local buffer has taken (a full ``block`` buffer
included, after waiting for room) or dropped by its policy. A publish is
confirmed only once its offset is complete, whoever dispatched it: the
publisher itself or the stream reader, which often reads a publish back
before its append answers.

``block`` (protocol: Broadcast topics): a message that meets a full ``block``
buffer waits for room, up to ``GATEWAY_BLOCK_WAIT`` seconds; a socket still
full then is closed with 4008 and delivery proceeds. A topic's messages are
delivered in order, so a later one never overtakes a waiting one.

One sender task drains the buffers against credit, by weight, into coalesced
``messages`` frames (design decisions 6 and 8).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from gateway.core.fanout import Dispatcher, Policy, PublishOutcome, Subscription
from gateway.core.history import Entry
from gateway.core.wire import encode_entry, encode_messages
from gateway.topics.followed import Followed

__all__ = [
    "GATHER_SECONDS",
    "SEND_BUDGET",
    "THIN_FRAME",
    "Dispatch",
    "SubscriberSink",
    "TopicMeter",
    "Unmetered",
]

#: Messages the sender takes per turn before letting the loop run other work.
SEND_BUDGET = 2048
#: A turn whose frames held fewer messages than this on average is thin. When
#: a burst arrives one publish per pass of the event loop (as they come off a
#: publisher's socket), each message goes out in a frame of its own to every
#: subscriber, and that state feeds itself: a frame costs the gateway and the
#: client about the same whatever it holds, so both fall behind without the
#: frames getting fuller (1-2 messages a frame and a fifth of the deliveries
#: per second of a run whose frames hold 10-20, in ``bench.fanout
#: --clients``). So after a thin turn, if more is already waiting (a burst,
#: not a message now and then), the sender waits :data:`GATHER_SECONDS`
#: before its next turn and what arrives meanwhile shares frames. A message
#: that finds the sender idle still goes at once.
THIN_FRAME = 4
#: How long the sender lets a burst gather after a thin turn. 1 ms was not
#: enough to leave the thin state on 2 cores (the writers' sends of 100 thin
#: frames take about that long by themselves); 5 ms was (docs/benchmarks.md).
GATHER_SECONDS = 0.005


class SubscriberSink(Protocol):
    """What the broadcaster needs of a subscriber socket."""

    def push(self, frame: str) -> None:
        """Queue a frame for sending."""

    def slow_consumer(self) -> None:
        """Close the socket with 4008."""

    def stream_restarted(self) -> None:
        """Close the socket with 4409: the topic's offsets restarted."""


class TopicMeter(Protocol):
    """What the broadcaster counts (the runtime hands it its metrics registry)."""

    def topic_published(self, topic: str, n: int = 1) -> None:
        """``n`` messages were published to ``topic`` on this process."""

    def topic_delivered(self, topic: str, n: int = 1) -> None:
        """``n`` messages of ``topic`` were sent to one subscriber socket."""

    def topic_dropped(self, topic: str, policy: str, n: int = 1) -> None:
        """``n`` messages of ``topic`` were dropped for a subscriber with ``policy``."""

    def slow_consumer_closed(self, topic: str) -> None:
        """A subscriber of ``topic`` was closed as a slow consumer."""

    def topic_presence(self, topic: str, members: int) -> None:
        """``topic`` (with presence) has ``members`` subscriptions on this process."""


class Unmetered:
    """The meter of a broadcaster built without one (tests, benchmarks)."""

    def topic_published(self, topic: str, n: int = 1) -> None:
        pass

    def topic_delivered(self, topic: str, n: int = 1) -> None:
        pass

    def topic_dropped(self, topic: str, policy: str, n: int = 1) -> None:
        pass

    def slow_consumer_closed(self, topic: str) -> None:
        pass

    def topic_presence(self, topic: str, members: int) -> None:
        pass


class Dispatch:
    """The local buffers of one process's topics, what enters them, and the sender.

    Args:
        meter: what is counted (published, delivered, dropped, closed).
        block_wait: seconds a message waits for a full ``block`` subscriber.
        unsubscribe: removes a subscriber everywhere it is known (the
            broadcaster's), called when one is closed as a slow consumer.
    """

    def __init__(
        self, *, meter: TopicMeter, block_wait: float, unsubscribe: Callable[[int], None]
    ) -> None:
        self.dispatcher = Dispatcher(time.time)
        self.meter = meter
        self.block_wait = block_wait
        self.sinks: dict[int, SubscriberSink] = {}
        #: the topics dispatched here, by name
        self.followed: dict[str, Followed] = {}
        self._unsubscribe = unsubscribe
        self._room = asyncio.Event()  # set whenever buffers drained: blocked messages retry
        self._work = asyncio.Event()
        self._sender = asyncio.get_running_loop().create_task(self._send_loop())
        # Figures for the dashboard and the stats.
        self.slow_consumers_closed = 0
        self.lost = 0  # messages a lagging stream reader found trimmed away

    def kick(self) -> None:
        """Buffers may have messages to send and credit for them: wake the sender."""
        self._work.set()

    def made_room(self) -> None:
        """A buffer went away or drained: a message waiting for room tries again."""
        self._room.set()

    def dispatch_now(self, topic: str, followed: Followed, entry: Entry) -> None:
        """Offer a publish made here at once (one process, no full ``block`` buffer)."""
        outcome = self.dispatcher.publish(topic, encode_entry(entry.offset, entry.body))
        assert not outcome.blocked
        self.count_drops(topic, outcome)
        followed.dispatched = entry.offset
        followed.completed(entry.offset)
        followed.notify_moved()
        self._work.set()

    async def deliver(self, topic: str, entries: Iterable[Entry], *, gone_to: int = 0) -> None:
        """Dispatch ``entries`` to the local buffers, in offset order, each once.

        Entries may come out of order (this process's publishes, and what the
        stream reader reads): each waits until every lower offset was
        dispatched, or is known lost. ``gone_to``: the stream reader found
        every offset up to it gone from the stream (trimmed before it read
        them); those not held here are lost, and counted as such.
        """
        followed = self.followed.get(topic)
        if followed is None:
            return
        pending = followed.pending
        for entry in entries:
            if entry.offset > followed.dispatched:
                pending[entry.offset] = entry
        followed.gone_to = max(followed.gone_to, gone_to)
        if followed.draining:
            return  # the call that is draining (maybe waiting for room) takes them
        followed.draining = True
        try:
            await self._drain_pending(topic, followed)
        finally:
            followed.draining = False
            followed.notify_drained()
        self._work.set()
        followed.notify_moved()

    async def deliver_read(self, topic: str, entries: list[Entry], gone_to: int) -> None:
        """What the stream reader read (see :meth:`deliver`).

        While the topic's messages wait for a full ``block`` subscriber, the
        reader waits too instead of piling what it reads in memory: it falls
        behind in the stream, and what the stream trims meanwhile is counted
        lost (design decision 11; docs/protocol.md, Broadcast details).
        """
        followed = self.followed.get(topic)
        while followed is not None and followed.draining:
            await followed.wait_drained()
            followed = self.followed.get(topic)
        await self.deliver(topic, entries, gone_to=gone_to)

    async def _drain_pending(self, topic: str, followed: Followed) -> None:
        pending = followed.pending
        while True:
            offset = followed.dispatched + 1
            entry = pending.pop(offset, None)
            if entry is None:
                if offset > followed.gone_to or followed.appending:
                    return
                # Lost: the run up to the next held entry, or to the end of what is gone.
                stop = min([o for o in pending if o > offset], default=followed.gone_to + 1)
                stop = min(stop, followed.gone_to + 1)
                followed.dispatched = stop - 1
                self.lose(topic, stop - offset)
                followed.completed(followed.dispatched)
                continue
            payload = encode_entry(entry.offset, entry.body)
            outcome = self.dispatcher.publish(topic, payload)
            self.count_drops(topic, outcome)
            # Dispatched to everyone but the blocked: a subscriber attaching
            # now is replayed up to here, and the wait below offers it to the
            # blocked ones only.
            followed.dispatched = entry.offset
            if outcome.blocked:
                self._work.set()
                await self._wait_for_room(outcome.blocked, payload)
                if self.followed.get(topic) is not followed:
                    return  # restarted or unfollowed while waiting
            # Taken everywhere now (or its blocked takers closed): confirmed.
            followed.completed(entry.offset)

    def lose(self, topic: str, n: int) -> None:
        """``n`` messages of ``topic`` never reached this process's buffers."""
        self.lost += n
        for sub in self.dispatcher.topics.get(topic, {}).values():
            if sub.policy is not Policy.BLOCK:
                self.meter.topic_dropped(topic, sub.policy.value, n)
        for sub in self.dispatcher.lose(topic, n):
            self.close_slow(sub)
        self._work.set()

    async def _wait_for_room(self, blocked: list[Subscription], payload: bytes) -> None:
        deadline = time.monotonic() + self.block_wait
        while blocked:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for sub in blocked:
                    self.close_slow(sub)
                return
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), remaining)
            blocked = self.dispatcher.offer_again(blocked, payload)
            self._work.set()

    def close_slow(self, sub: Subscription) -> None:
        """Close a subscriber that stayed full (``block``) or lost messages it must
        not lose: 4008 (protocol: Broadcast topics)."""
        sink = self.sinks.get(sub.sid)
        self._unsubscribe(sub.sid)
        self.slow_consumers_closed += 1
        self.meter.slow_consumer_closed(sub.topic)
        if sink is not None:
            sink.slow_consumer()

    # -- sending

    async def _send_loop(self) -> None:
        while True:
            await self._work.wait()
            self._work.clear()
            while self.dispatcher.has_ready:
                sent = frames = 0
                for sub, items, dropped in self.dispatcher.drain(SEND_BUDGET):
                    if items:
                        self.meter.topic_delivered(sub.topic, len(items))
                    sink = self.sinks.get(sub.sid)
                    if sink is not None and (items or dropped):
                        sink.push(encode_messages(sub.topic, items, dropped))
                        sent, frames = sent + len(items), frames + 1
                self._room.set()
                # Let frames in (credit, publishes) between turns.
                await asyncio.sleep(0)
                if sent < THIN_FRAME * frames and self.dispatcher.has_ready:
                    # A thin turn, and a burst under way: let it gather.
                    await asyncio.sleep(GATHER_SECONDS)

    def count_drops(self, topic: str, outcome: PublishOutcome) -> None:
        """Count what the buffers' policies dropped for one message."""
        for policy, n in outcome.dropped_by.items():
            self.meter.topic_dropped(topic, policy, n)

    def close(self) -> None:
        """Stop the sender."""
        self._sender.cancel()

"""The broadcast adapter of one gateway process: offsets, membership and publishing.

Publishing gives every message the topic's next offset (protocol 1.1: Topics:
history, offsets and resume) and offers it to every local subscriber's buffer
(``gateway.core.fanout``), from which one sender task sends coalesced
``messages`` frames against credit (design decisions 6 and 8).

Where offsets come from depends on the deployment (design decision 11):

- one process (no ``REDIS_URL``): a :class:`~gateway.core.history.Sequencer` and
  :class:`~gateway.core.history.History` in this process; a publish is appended
  and dispatched in one step;
- several processes: the topic's Redis stream (``gateway.topics.streams``) is the
  sequence, the history and the relay. A publish is appended there; every
  process, this one included, dispatches what its stream reader reads, in
  offset order, so all sockets everywhere see one order.

:class:`Broadcaster` is what the sockets, the HTTP API and the stream reader
use; it holds the offsets, the members and the publishes, and hands the rest
to three parts, each in its own module:

- ``gateway.topics.dispatch``: messages into the local buffers in offset
  order (the resume seam, ``block`` waits, slow consumers) and the sender;
- ``gateway.topics.replay``: the history kept here and the catch-up of
  resuming subscribers;
- ``gateway.topics.housekeeping``: forgetting idle topics, and the topics'
  description for the stats and the dashboard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.core.fanout import Policy, Subscription
from gateway.core.history import (
    Entry,
    Head,
    Resume,
    Sequencer,
    TopicSettings,
    plan_latest,
    plan_resume,
)
from gateway.core.wire import Ref, encode_subscribed
from gateway.topics.dispatch import Dispatch, SubscriberSink, TopicMeter, Unmetered
from gateway.topics.followed import Followed, release
from gateway.topics.housekeeping import Housekeeping
from gateway.topics.presence import Presence
from gateway.topics.replay import Replay
from gateway.topics.settings import TopicSettingsCache
from gateway.topics.shared import SharedTopics

__all__ = [
    "Broadcaster",
    "Published",
    "SharedTopics",
    "Start",
    "SubscriberSink",
    "TopicMeter",
]

log = logging.getLogger("leasecast.broadcast")


@dataclass(frozen=True, slots=True)
class Published:
    """A publish accepted: the topic's epoch and the offset of its (last) message."""

    epoch: str
    offset: int


@dataclass(frozen=True, slots=True)
class Start:
    """How a subscriber socket starts (from :meth:`Broadcaster.prepare`).

    ``resume`` is None for a v1 subscriber (no ``since``, no ``recover``):
    no ``subscribed`` frame and nothing replayed.
    """

    head: Head
    resume: Resume | None
    settings: TopicSettings


class Broadcaster:
    """Topics, subscribers, offsets and publishes of one process.

    Args:
        settings: the topics' stored settings (history size and ttl).
        shared: the processes' shared streams (Redis), or None for one process.
        meter: what is counted (the runtime's metrics); nothing by default.
        block_wait: seconds a message waits for a full ``block`` subscriber.
        topic_idle: seconds after which an unused topic is forgotten here.
        topic_limit: topics with no subscriber kept here; beyond it the least
            recently published are forgotten at once.
    """

    def __init__(
        self,
        *,
        settings: TopicSettingsCache,
        shared: SharedTopics | None = None,
        meter: TopicMeter | None = None,
        block_wait: float = 10.0,
        # -- memory
        topic_idle: float = 300.0,
        topic_limit: int = 10_000,
    ) -> None:
        self.settings = settings
        self.shared = shared
        self.meter: TopicMeter = meter or Unmetered()
        self.sequencer = Sequencer()  # one process: the sequence (unused with ``shared``)
        #: who subscribes to the topics with presence (shared, with several processes)
        self.presence: Presence = Presence(self.meter) if shared is None else shared.presence
        self._preparing: dict[str, int] = {}  # topic -> sockets between prepare and attach
        self._awaited: dict[str, int] = {}  # topic -> publishes started and not done
        self._gates: dict[str, asyncio.Lock] = {}  # one process: publishes in order
        self.dispatch = Dispatch(
            meter=self.meter, block_wait=block_wait, unsubscribe=self.unsubscribe
        )
        self.replay = Replay(
            settings=settings, shared=shared, sequencer=self.sequencer, dispatch=self.dispatch
        )
        self.housekeeping = Housekeeping(
            dispatch=self.dispatch,
            replay=self.replay,
            preparing=self._preparing,
            gates=self._gates,
            topic_idle=topic_idle,
            topic_limit=topic_limit,
        )
        # The parts' state, by the names this class's code reads them by.
        self.dispatcher = self.dispatch.dispatcher
        self.sinks = self.dispatch.sinks
        self.followed = self.dispatch.followed

    @property
    def slow_consumers_closed(self) -> int:
        """Subscribers closed with 4008 so far (the stats and the dashboard)."""
        return self.dispatch.slow_consumers_closed

    @property
    def lost(self) -> int:
        """Messages a lagging stream reader found trimmed away."""
        return self.dispatch.lost

    # -- membership

    async def prepare(
        self, topic: str, *, since: int | None = None, epoch: str | None = None,
        recover_latest: bool = False,
    ) -> Start:  # fmt: skip
        """Get ready to attach a subscriber (before its socket is accepted).

        Follows the topic on this process if it was not, and decides a resume
        (``since`` with ``epoch``) or a cache-mode start (``recover_latest``).
        """
        settings = await self.settings.get(topic)
        head = await self._follow(topic)
        # Followed until attach() or abandon(), even if every other local
        # subscriber of the topic leaves meanwhile.
        self._preparing[topic] = self._preparing.get(topic, 0) + 1
        resume: Resume | None = None
        now = time.time()
        if since is not None and epoch is not None:
            first = None
            if since < head.offset and head.epoch == epoch:
                entries = await self.replay.read(topic, since, 1, head.offset)
                first = entries[0] if entries else None
            resume = plan_resume(
                since=since, epoch=epoch, head=head, first_missed=first, settings=settings, now=now
            )
        elif recover_latest:
            latest = None
            if head.offset:
                entries = await self.replay.read(topic, head.offset - 1, 1, head.offset)
                latest = entries[0] if entries else None
            resume = plan_latest(head=head, latest=latest, settings=settings, now=now)
        return Start(head, resume, settings)

    def attach(
        self,
        sink: SubscriberSink,
        topic: str,
        start: Start,
        *,
        capacity: int,
        policy: Policy,
        weight: int,
        credit: int,
        announce: bool = False,
        ref: Ref = None,
    ) -> Subscription:
        """Add a subscriber prepared by :meth:`prepare`; with a resume, send
        ``subscribed`` and replay first.

        With ``announce``, ``subscribed`` is sent without a resume too (its
        ``recovered`` null): the multiplexed socket's reply to ``subscribe``,
        echoing ``ref``. Subscribers are normally added through
        :class:`gateway.topics.subscription.TopicSubscription`.
        """
        self._prepared(topic)
        sub = self.dispatcher.subscribe(
            topic, capacity=capacity, policy=policy, weight=weight, credit=credit
        )
        self.sinks[sub.sid] = sink
        followed = self.followed.get(topic)
        if followed is None or followed.epoch != start.head.epoch:
            # The topic's offsets restarted since prepare(): as for any
            # subscriber of the old epoch, the socket must resubscribe.
            self.unsubscribe(sub.sid)
            sink.stream_restarted()
            return sub
        head = start.head
        if start.resume is None:
            if announce:
                sink.push(encode_subscribed(topic, head.epoch, head.offset, None, ref))
            return sub
        sink.push(encode_subscribed(topic, head.epoch, head.offset, start.resume.recovered, ref))
        after = start.resume.after
        if after is not None and followed is not None and after != followed.dispatched:
            # Off the live stream until the replay reaches what is dispatched.
            self.dispatcher.detach(sub.sid)
            self.replay.start(sub, after)
        return sub

    def abandon(self, topic: str) -> None:
        """A socket prepared for ``topic`` will not attach (refused, or closed first)."""
        self._prepared(topic)
        self._maybe_unfollow(topic)

    def _prepared(self, topic: str) -> None:
        left = self._preparing.get(topic, 0) - 1
        if left > 0:
            self._preparing[topic] = left
        else:
            self._preparing.pop(topic, None)

    def unsubscribe(self, sid: int) -> None:
        """Remove a subscriber socket (closed, or gone silent)."""
        self.sinks.pop(sid, None)
        self.replay.stop(sid)
        sub = self.dispatcher.unsubscribe(sid)
        if sub is not None:
            self.dispatch.made_room()  # a blocked message no longer waits for it
            self._maybe_unfollow(sub.topic)

    def grant(self, sid: int, n: int) -> None:
        """A subscriber granted credit."""
        self.dispatcher.grant(sid, n)
        self.replay.granted(sid)
        self.dispatch.kick()

    def set_writable(self, sid: int, writable: bool) -> None:
        """A subscriber's transport filled up (False) or has room again (True)."""
        if writable:
            self.dispatcher.resume(sid)
            self.dispatch.kick()
            self.replay.granted(sid)
        else:
            self.dispatcher.pause(sid)

    async def _follow(self, topic: str) -> Head:
        """Dispatch the topic here from now on; returns its head."""
        followed = self.followed.get(topic)
        if self.shared is None:
            head = self.sequencer.head(topic)
            if followed is None:
                self.followed[topic] = Followed(head.epoch, head.offset)
            return head
        head = await self.shared.head(topic)
        followed = self.followed.get(topic)  # again: another socket may have followed meanwhile
        if followed is not None and followed.epoch != head.epoch:
            self.restart_topic(topic)
            followed = None
        if followed is None:
            self.followed[topic] = Followed(head.epoch, head.offset)
            self.shared.follow(topic, head.offset)
        return head

    def _maybe_unfollow(self, topic: str) -> None:
        if self.shared is None or self.dispatcher.subscribers(topic) or topic in self._preparing:
            return
        subscriptions = self.dispatcher.subscriptions
        if any(subscriptions[sid].topic == topic for sid in self.replay.replaying()):
            return
        followed = self.followed.pop(topic, None)
        if followed is not None:
            self.shared.unfollow(topic)
            release(followed)

    def epoch_of(self, topic: str) -> str | None:
        """The epoch this process dispatches ``topic`` in, if it follows it."""
        followed = self.followed.get(topic)
        return None if followed is None else followed.epoch

    def restart_topic(self, topic: str) -> None:
        """The topic's offsets restarted elsewhere (a new epoch): its sockets must resubscribe."""
        followed = self.followed.pop(topic, None)
        if followed is not None:
            release(followed)
            if self.shared is not None:
                self.shared.unfollow(topic)
        log.warning("topic %r has a new epoch: its subscribers here are closed (4409)", topic)
        for sub in list(self.dispatcher.topics.get(topic, {}).values()) + [
            self.dispatcher.subscriptions[sid]
            for sid in self.replay.replaying()
            if self.dispatcher.subscriptions[sid].topic == topic
        ]:
            sink = self.sinks.get(sub.sid)
            self.unsubscribe(sub.sid)
            if sink is not None:
                sink.stream_restarted()

    # -- publishing

    def publish_now(self, topic: str, body: bytes) -> Published | None:
        """The synchronous fast path of :meth:`publish` (one process only): the
        publish done, or None (nothing done) if it must be awaited."""
        if self.shared is not None:
            return None
        settings = self.settings.cached(topic)
        if settings is None:
            return None
        self.housekeeping.sweep()  # before this publish marks the topic busy
        if self._awaited.get(topic):
            return None  # an earlier publish of the topic is still on its way: after it
        members = self.dispatcher.topics.get(topic)
        if members and any(
            s.policy is Policy.BLOCK and s.buffered >= s.capacity for s in members.values()
        ):
            return None
        epoch, (entry,) = self._append_here(topic, [body], settings)
        self.meter.topic_published(topic)
        followed = self.followed.get(topic)
        if followed is None:
            # Never subscribed to here: nothing to dispatch, and nothing kept
            # per topic beyond its offset (publishers may use ever-new names).
            self.dispatcher.publish(topic, b"")  # its counters, for the stats
            return Published(epoch, entry.offset)
        self.dispatch.dispatch_now(topic, followed, entry)
        return Published(epoch, entry.offset)

    def publish(self, topic: str, bodies: list[bytes]) -> asyncio.Future[Published]:
        """Publish ``bodies`` in order; the future gives the epoch and the last one's offset.

        It is running when this returns, and counted as on its way at once:
        a later publish to the topic, even one that could take the
        synchronous path (:meth:`publish_now`), comes after it. The future is
        done once every local buffer has taken the bodies or dropped them by
        its policy (a full ``block`` subscriber: waited for, or closed with
        4008), and, with several processes, once they are in the shared stream.

        Raises (from the future):
            Unavailable: the shared stream could not take them.
            Backpressure: too many publishes wait for the shared stream.
        """
        self._awaited[topic] = self._awaited.get(topic, 0) + 1
        task = asyncio.ensure_future(self._publish(topic, bodies))
        task.add_done_callback(lambda _: self._arrived(topic))
        return task

    def _arrived(self, topic: str) -> None:
        left = self._awaited.get(topic, 0) - 1
        if left > 0:
            self._awaited[topic] = left
        else:
            self._awaited.pop(topic, None)

    async def _publish(self, topic: str, bodies: list[bytes]) -> Published:
        self.housekeeping.sweep()  # before this publish marks the topic busy
        if self.shared is not None:
            followed = self.followed.get(topic)
            if followed is not None:
                # Until the append answers, offsets the reader finds trimmed
                # may be this publish's own: none is counted lost meanwhile.
                followed.appending += 1
            try:
                head = await self.shared.append(topic, bodies)
            finally:
                if followed is not None:
                    followed.appending -= 1
            await self._dispatched_here(topic, head, bodies)
            self.meter.topic_published(topic, len(bodies))
            return Published(head.epoch, head.offset)
        gate = self._gates.setdefault(topic, asyncio.Lock())
        async with gate:  # in order with every other publish to the topic
            settings = await self.settings.get(topic)
            epoch, entries = self._append_here(topic, bodies, settings)
            if topic in self.followed:
                await self.dispatch.deliver(topic, entries)
            else:
                for _ in entries:  # never subscribed to here: the stats' counters only
                    self.dispatcher.publish(topic, b"")
            self.meter.topic_published(topic, len(bodies))
            return Published(epoch, entries[-1].offset)

    def _append_here(
        self, topic: str, bodies: list[bytes], settings: TopicSettings
    ) -> tuple[str, list[Entry]]:
        """Take the next offsets here (one process) and keep the history; the epoch
        and the entries."""
        before = self.sequencer.advance(topic, len(bodies))
        now = time.time()
        entries = [Entry(before.offset + i, body, now) for i, body in enumerate(bodies, 1)]
        self.replay.keep(topic, entries, settings)
        return before.epoch, entries

    async def _dispatched_here(self, topic: str, head: Head, bodies: list[bytes]) -> None:
        """Dispatch a publish made here, if this process follows the topic, and wait for it.

        The publisher has the bodies and now their offsets: it hands them to
        :meth:`Dispatch.deliver` itself rather than wait for the stream reader to read
        them back. So this process's subscribers never lose its own publishes,
        however small the stream's window, and the reply comes a round trip
        sooner. They are dispatched in offset order with what the reader
        brings from the other processes (which may fill offsets before them).
        """
        followed = self.followed.get(topic)
        if followed is None:
            return
        if followed.epoch != head.epoch:
            self.restart_topic(topic)
            return
        if followed.complete >= head.offset:
            if followed.gone_to > followed.dispatched:
                await self.dispatch.deliver(topic, [])  # losses held back for this append
            return
        # Not ``dispatched``: the stream reader may have dispatched these
        # offsets already and be waiting for room in a full block buffer for
        # one of them; the publish is confirmed when that room is found.
        first = head.offset - len(bodies) + 1
        now = time.time()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        followed.waiters.append((head.offset, done))
        await self.dispatch.deliver(topic, [Entry(first + i, b, now) for i, b in enumerate(bodies)])
        if not done.done():
            # Waiting for offsets before ours, from another process, to be
            # read; or for a full block subscriber to make room (up to the
            # block wait, then it is closed). The messages are in the stream
            # either way.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(done), self.dispatch.block_wait + 5.0)

    # -- what the stream reader and the HTTP API use

    async def deliver(self, topic: str, entries: Iterable[Entry], *, gone_to: int = 0) -> None:
        """Dispatch ``entries`` to the local buffers (:meth:`Dispatch.deliver`)."""
        await self.dispatch.deliver(topic, entries, gone_to=gone_to)

    async def deliver_read(self, topic: str, entries: list[Entry], gone_to: int) -> None:
        """What the stream reader read (:meth:`Dispatch.deliver_read`)."""
        await self.dispatch.deliver_read(topic, entries, gone_to)

    def lose(self, topic: str, n: int) -> None:
        """``n`` messages of ``topic`` never reached this process's buffers."""
        self.dispatch.lose(topic, n)

    async def history(self, topic: str, after: int | None, limit: int) -> tuple[Head, list[Entry]]:
        """``GET /api/topics/TOPIC/history``: the kept messages after ``after``, oldest first."""
        return await self.replay.history(topic, after, limit)

    async def head(self, topic: str) -> Head:
        """The topic's epoch and latest offset."""
        return await self.replay.head(topic)

    def describe_topics(self) -> list[dict[str, Any]]:
        """Every topic of this process for ``/api/stats``."""
        return self.housekeeping.describe_topics()

    def relay_figures(self) -> dict[str, int] | None:
        """Messages lost between processes (a reader that fell behind the stream's window)."""
        return self.housekeeping.relay_figures()

    def close(self) -> None:
        """Stop the sender and every replay (a shared presence stops with its streams)."""
        self.dispatch.close()
        self.replay.close()
        if self.shared is None:
            self.presence.close()

"""The broadcast adapter of one gateway process: offsets, history, resume, sending.

Publishing gives every message the topic's next offset (protocol 1.1: Topics:
history, offsets and resume) and offers it to every local subscriber's buffer
(``gateway.core.fanout``); one sender task drains the buffers against credit, by
weight, into coalesced ``messages`` frames (design decisions 6 and 8).

Where offsets come from depends on the deployment (design decision 11):

- one process (no ``REDIS_URL``): a :class:`~gateway.core.history.Sequencer` and
  :class:`~gateway.core.history.History` in this process; a publish is appended
  and dispatched in one step;
- several processes: the topic's Redis stream (``gateway.topics.streams``) is the
  sequence, the history and the relay. A publish is appended there; every
  process, this one included, dispatches what its stream reader reads, in
  offset order, so all sockets everywhere see one order.

Either way :meth:`Broadcaster.deliver` is the one place messages enter the
dispatcher, and ``dispatched[topic]`` is the last offset it has taken: a
subscriber resuming from an older offset is replayed from the history up to
exactly that offset, then attached to the live stream in the same step, so
the seam has no gap and no duplicate. ``complete[topic]`` trails it: the last
offset every local buffer has taken (a full ``block`` buffer included, after
waiting for room) or dropped by its policy. A publish is confirmed only once
its offset is complete, whoever dispatched it: the publisher itself or the
stream reader, which often reads a publish back before its append answers.

``block`` (protocol: Broadcast topics): a message that meets a full ``block``
buffer waits for room, up to ``GATEWAY_BLOCK_WAIT`` seconds; a socket still
full then is closed with 4008 and delivery proceeds. A topic's messages are
delivered in order, so a later one never overtakes a waiting one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.core.fanout import Dispatcher, Policy, PublishOutcome, Subscription
from gateway.core.history import (
    Entry,
    Head,
    History,
    Resume,
    Sequencer,
    TopicSettings,
    kept,
    plan_latest,
    plan_resume,
)
from gateway.core.wire import encode_entry, encode_messages, encode_subscribed
from gateway.topics.settings import TopicSettingsCache

__all__ = [
    "Broadcaster",
    "Published",
    "SharedTopics",
    "Start",
    "SubscriberSink",
]

log = logging.getLogger("leasecast.broadcast")

#: Messages the sender takes per turn before letting the loop run other work.
SEND_BUDGET = 2048
#: Messages a resuming subscriber is replayed per read of the history.
REPLAY_CHUNK = 1000


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


class _Unmetered:
    """The meter of a broadcaster built without one (tests, benchmarks)."""

    def topic_published(self, topic: str, n: int = 1) -> None:
        pass

    def topic_delivered(self, topic: str, n: int = 1) -> None:
        pass

    def topic_dropped(self, topic: str, policy: str, n: int = 1) -> None:
        pass

    def slow_consumer_closed(self, topic: str) -> None:
        pass


class SharedTopics(Protocol):
    """Offsets, history and relay shared by the processes (``gateway.topics.streams``)."""

    async def head(self, topic: str) -> Head:
        """The topic's epoch and latest offset (an epoch is made on first use)."""

    async def append(self, topic: str, bodies: list[bytes]) -> Head:
        """Append ``bodies``; returns the epoch and the offset of the last one."""

    async def read(self, topic: str, after: int, limit: int) -> list[Entry]:
        """Stored entries with offsets greater than ``after``, oldest first."""

    def follow(self, topic: str, after: int) -> None:
        """Start reading the topic's new entries, those after offset ``after``."""

    def unfollow(self, topic: str) -> None:
        """Stop reading the topic."""


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


@dataclass(eq=False, slots=True)
class _Followed:
    """A topic this process dispatches: its epoch and the last offset dispatched.

    One per topic in use, thousands when publishers use ever-new names: the
    events are made only when something waits on them.
    """

    epoch: str
    #: offered to every local buffer but the full ``block`` ones (the resume seam)
    dispatched: int
    #: taken by every local buffer, the full ``block`` ones too (publishes
    #: up to here are confirmed); equals ``dispatched`` unless a message waits
    #: for room. Starts at ``dispatched``.
    complete: int = -1
    #: publishes made here waiting for their offset to be dispatched here
    waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    #: entries received out of order, waiting for the offsets before them
    pending: dict[int, Entry] = field(default_factory=dict)
    #: offsets up to this are gone from the stream: not held means lost
    gone_to: int = 0
    #: a deliver() is dispatching (maybe waiting for room): others only add
    draining: bool = False
    #: publishes of this process whose offsets are not known yet
    appending: int = 0
    _moved: asyncio.Event | None = None
    _drained: asyncio.Event | None = None

    def __post_init__(self) -> None:
        if self.complete < 0:
            self.complete = self.dispatched

    def completed(self, offset: int) -> None:
        """Every local buffer took (or dropped) the messages up to ``offset``:
        the publishes waiting for them are done."""
        self.complete = max(self.complete, offset)
        if not self.waiters:
            return
        still = []
        for waited, done in self.waiters:
            if waited <= self.complete:
                if not done.done():
                    done.set_result(None)
            else:
                still.append((waited, done))
        self.waiters = still

    def notify_moved(self) -> None:
        """``dispatched`` moved (resuming subscribers wait for it)."""
        if self._moved is not None:
            self._moved.set()

    async def wait_moved(self) -> None:
        """Until ``dispatched`` moves next (or the topic is released)."""
        if self._moved is None:
            self._moved = asyncio.Event()
        self._moved.clear()
        await self._moved.wait()

    def notify_drained(self) -> None:
        """A drain ended (the stream reader waits for it)."""
        if self._drained is not None:
            self._drained.set()

    async def wait_drained(self) -> None:
        """Until the running drain ends."""
        if self._drained is None:
            self._drained = asyncio.Event()
        self._drained.clear()
        await self._drained.wait()


class Broadcaster:
    """Topics, subscribers, offsets and the sender of one process.

    Args:
        settings: the topics' stored settings (history size and ttl).
        shared: the processes' shared streams (Redis), or None for one process.
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
        self.dispatcher = Dispatcher(time.time)
        self.settings = settings
        self.shared = shared
        self.meter: TopicMeter = meter or _Unmetered()
        self.block_wait = block_wait
        self.sinks: dict[int, SubscriberSink] = {}
        self.sequencer = Sequencer()  # one process: the sequence (unused with ``shared``)
        self.histories: dict[str, History] = {}
        self.followed: dict[str, _Followed] = {}
        self._catching_up: dict[int, asyncio.Task[None]] = {}
        self._preparing: dict[str, int] = {}  # topic -> sockets between prepare and attach
        self._awaited: dict[str, int] = {}  # topic -> publishes started and not done
        self._credit_granted: dict[int, asyncio.Event] = {}
        self._room = asyncio.Event()  # set whenever buffers drained: blocked messages retry
        self._work = asyncio.Event()
        self._gates: dict[str, asyncio.Lock] = {}
        self.topic_idle = topic_idle
        self._next_sweep = time.monotonic() + min(10.0, topic_idle)
        self.topic_limit = topic_limit
        self._sweep_above = topic_limit  # topics counted here that make room at once
        self._sender = asyncio.get_running_loop().create_task(self._send_loop())
        # Figures for the dashboard and the stats.
        self.slow_consumers_closed = 0
        self.lost = 0  # messages a lagging stream reader found trimmed away

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
                entries = await self._read(topic, since, 1, head.offset)
                first = entries[0] if entries else None
            resume = plan_resume(
                since=since, epoch=epoch, head=head, first_missed=first, settings=settings, now=now
            )
        elif recover_latest:
            latest = None
            if head.offset:
                entries = await self._read(topic, head.offset - 1, 1, head.offset)
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
    ) -> Subscription:
        """Add a subscriber socket prepared by :meth:`prepare`; with a resume, send
        ``subscribed`` and replay first."""
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
        if start.resume is None:
            return sub
        head = start.head
        sink.push(encode_subscribed(topic, head.epoch, head.offset, start.resume.recovered))
        after = start.resume.after
        if after is not None and followed is not None and after != followed.dispatched:
            # Off the live stream until the replay reaches what is dispatched.
            self.dispatcher.detach(sub.sid)
            self._credit_granted[sub.sid] = asyncio.Event()
            self._catching_up[sub.sid] = asyncio.get_running_loop().create_task(
                self._catch_up(sub, after)
            )
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
        task = self._catching_up.pop(sid, None)
        if task is not None:
            task.cancel()
        self._credit_granted.pop(sid, None)
        sub = self.dispatcher.unsubscribe(sid)
        if sub is not None:
            self._room.set()  # a blocked message no longer waits for it
            self._maybe_unfollow(sub.topic)

    def grant(self, sid: int, n: int) -> None:
        """A subscriber granted credit."""
        self.dispatcher.grant(sid, n)
        granted = self._credit_granted.get(sid)
        if granted is not None:
            granted.set()
        self._work.set()

    def set_writable(self, sid: int, writable: bool) -> None:
        """A subscriber's transport filled up (False) or has room again (True)."""
        if writable:
            self.dispatcher.resume(sid)
            self._work.set()
            granted = self._credit_granted.get(sid)
            if granted is not None:
                granted.set()
        else:
            self.dispatcher.pause(sid)

    async def _follow(self, topic: str) -> Head:
        """Dispatch the topic here from now on; returns its head."""
        followed = self.followed.get(topic)
        if self.shared is None:
            head = self.sequencer.head(topic)
            if followed is None:
                self.followed[topic] = _Followed(head.epoch, head.offset)
            return head
        head = await self.shared.head(topic)
        followed = self.followed.get(topic)  # again: another socket may have followed meanwhile
        if followed is not None and followed.epoch != head.epoch:
            self.restart_topic(topic)
            followed = None
        if followed is None:
            self.followed[topic] = _Followed(head.epoch, head.offset)
            self.shared.follow(topic, head.offset)
        return head

    def _maybe_unfollow(self, topic: str) -> None:
        if self.shared is None or self.dispatcher.subscribers(topic) or topic in self._preparing:
            return
        if any(self.dispatcher.subscriptions[sid].topic == topic for sid in self._catching_up):
            return
        followed = self.followed.pop(topic, None)
        if followed is not None:
            self.shared.unfollow(topic)
            _release(followed)

    def epoch_of(self, topic: str) -> str | None:
        """The epoch this process dispatches ``topic`` in, if it follows it."""
        followed = self.followed.get(topic)
        return None if followed is None else followed.epoch

    def restart_topic(self, topic: str) -> None:
        """The topic's offsets restarted elsewhere (a new epoch): its sockets must resubscribe."""
        followed = self.followed.pop(topic, None)
        if followed is not None:
            _release(followed)
            if self.shared is not None:
                self.shared.unfollow(topic)
        log.warning("topic %r has a new epoch: its subscribers here are closed (4409)", topic)
        for sub in list(self.dispatcher.topics.get(topic, {}).values()) + [
            self.dispatcher.subscriptions[sid]
            for sid in list(self._catching_up)
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
        self._sweep_idle_topics()  # before this publish marks the topic busy
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
        outcome = self.dispatcher.publish(topic, encode_entry(entry.offset, body))
        assert not outcome.blocked
        _count_drops(self.meter, topic, outcome)
        followed.dispatched = entry.offset
        followed.completed(entry.offset)
        followed.notify_moved()
        self._work.set()
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
        self._sweep_idle_topics()  # before this publish marks the topic busy
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
                await self.deliver(topic, entries)
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
        if settings.history_size:
            history = self.histories.get(topic)
            if history is None:
                history = self.histories[topic] = History(time.time)
            history.append(entries, settings)
        else:
            self.histories.pop(topic, None)
        return before.epoch, entries

    async def _dispatched_here(self, topic: str, head: Head, bodies: list[bytes]) -> None:
        """Dispatch a publish made here, if this process follows the topic, and wait for it.

        The publisher has the bodies and now their offsets: it hands them to
        :meth:`deliver` itself rather than wait for the stream reader to read
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
                await self.deliver(topic, [])  # losses held back for this append
            return
        # Not ``dispatched``: the stream reader may have dispatched these
        # offsets already and be waiting for room in a full block buffer for
        # one of them; the publish is confirmed when that room is found.
        first = head.offset - len(bodies) + 1
        now = time.time()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        followed.waiters.append((head.offset, done))
        await self.deliver(topic, [Entry(first + i, b, now) for i, b in enumerate(bodies)])
        if not done.done():
            # Waiting for offsets before ours, from another process, to be
            # read; or for a full block subscriber to make room (up to the
            # block wait, then it is closed). The messages are in the stream
            # either way.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(done), self.block_wait + 5.0)

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

    async def _drain_pending(self, topic: str, followed: _Followed) -> None:
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
            _count_drops(self.meter, topic, outcome)
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
            self._close_slow(sub)
        self._work.set()

    async def _wait_for_room(self, blocked: list[Subscription], payload: bytes) -> None:
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
            blocked = self.dispatcher.offer_again(blocked, payload)
            self._work.set()

    def _close_slow(self, sub: Subscription) -> None:
        sink = self.sinks.get(sub.sid)
        self.unsubscribe(sub.sid)
        self.slow_consumers_closed += 1
        self.meter.slow_consumer_closed(sub.topic)
        if sink is not None:
            sink.slow_consumer()

    def _sweep_idle_topics(self) -> None:
        # On the publish path, at most every few seconds, or at once when
        # ever-new names crowd in: memory grows only through publishes, so
        # this is where it is given back.
        now = time.monotonic()
        crowded = len(self.dispatcher.publish_rate) >= self._sweep_above
        if now < self._next_sweep and not crowded:
            return
        self._next_sweep = now + min(10.0, self.topic_idle / 2)
        # Down to 90% of the limit, so the sort is paid once per tenth of it.
        keep = self.topic_limit * 9 // 10
        for topic in self.dispatcher.forget_idle(self.topic_idle, keep):
            if topic in self._preparing:
                continue  # a socket is about to attach to it
            history = self.histories.get(topic)
            settings = self.settings.cached(topic)
            if history is not None and settings is not None:
                history.trim(settings)
            if history is not None and len(history):
                continue  # its history still answers resumes: keep its offsets
            self.histories.pop(topic, None)
            if self.shared is None:
                # Forgotten: the next publish starts a new epoch at offset 1.
                self.sequencer.forget(topic)
                followed = self.followed.pop(topic, None)
                if followed is not None:
                    _release(followed)
            gate = self._gates.get(topic)
            if gate is not None and not gate.locked():
                del self._gates[topic]
        # Subscribed topics are never forgotten: if they alone pass the limit,
        # the next sweep waits for a tenth of it more, not for every publish.
        self._sweep_above = max(
            self.topic_limit, len(self.dispatcher.publish_rate) + self.topic_limit // 10
        )

    # -- history and resume

    async def history(self, topic: str, after: int | None, limit: int) -> tuple[Head, list[Entry]]:
        """``GET /api/topics/TOPIC/history``: the kept messages after ``after``, oldest first."""
        head = await self.head(topic)
        start = 0 if after is None else after
        return head, await self._read(topic, start, limit, head.offset)

    async def head(self, topic: str) -> Head:
        """The topic's epoch and latest offset."""
        if self.shared is not None:
            return await self.shared.head(topic)
        return self.sequencer.head(topic)

    async def _read(self, topic: str, after: int, limit: int, latest: int) -> list[Entry]:
        """Kept entries after ``after`` up to ``latest``, by the topic's settings."""
        settings = await self.settings.get(topic)
        if not settings.history_size:
            return []
        if self.shared is not None:
            stored = await self.shared.read(topic, after, limit)
        else:
            history = self.histories.get(topic)
            stored = [] if history is None else history.after(after, limit, latest=latest,
                                                              settings=settings)  # fmt: skip
        now = time.time()
        return [e for e in stored if e.offset <= latest and kept(e, latest, settings, now)]

    async def _catch_up(self, sub: Subscription, after: int) -> None:
        """Replay ``sub`` from the history after ``after`` under its credit, then attach it."""
        topic, position = sub.topic, after
        try:
            while True:
                followed = self.followed.get(topic)
                if followed is None:
                    return  # restarted: the socket is being closed
                target = followed.dispatched
                if position == target:
                    # The seam: nothing awaited between this check and the
                    # attach, so the next dispatched message is target + 1.
                    self.dispatcher.attach(sub.sid)
                    self._work.set()
                    return
                if position > target:
                    # Resumed at an offset this process has not dispatched
                    # yet (read elsewhere first): wait for the reader.
                    await followed.wait_moved()
                    continue
                room = sub.credit if not sub.paused else 0
                if room <= 0:
                    granted = self._credit_granted[sub.sid]
                    granted.clear()
                    await granted.wait()
                    continue
                entries = await self._read(topic, position, min(room, REPLAY_CHUNK), target)
                if sub.sid not in self.dispatcher.subscriptions:
                    return
                if not entries or entries[0].offset != position + 1:
                    # Trimmed away while replaying: a loss, told as for any.
                    resumed_at = entries[0].offset - 1 if entries else target
                    missing = resumed_at - position
                    sub.lose(missing)
                    self.lost += missing
                    if sub.policy is not Policy.BLOCK:
                        self.meter.topic_dropped(topic, sub.policy.value, missing)
                    if sub.policy is Policy.BLOCK:
                        self._close_slow(sub)
                        return
                    position = resumed_at
                    continue
                items = []
                for entry in entries:
                    sub.seq += 1
                    items.append((sub.seq, encode_entry(entry.offset, entry.body)))
                sub.credit -= len(items)
                sub.delivered += len(items)
                sub.delivered_rate.add(len(items))
                self.meter.topic_delivered(topic, len(items))
                dropped, sub.unreported = sub.unreported, 0
                sink = self.sinks.get(sub.sid)
                if sink is not None:
                    sink.push(encode_messages(topic, items, dropped))
                position = entries[-1].offset
        finally:
            self._catching_up.pop(sub.sid, None)
            self._credit_granted.pop(sub.sid, None)

    # -- sending

    async def _send_loop(self) -> None:
        while True:
            await self._work.wait()
            self._work.clear()
            while self.dispatcher.has_ready:
                for sub, items, dropped in self.dispatcher.drain(SEND_BUDGET):
                    if items:
                        self.meter.topic_delivered(sub.topic, len(items))
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
            followed = self.followed.get(topic)
            settings = self.settings.cached(topic)
            rows.append(
                {
                    "name": topic,
                    "subscribers": len(subs),
                    "published": self.dispatcher.published.get(topic, 0),
                    "publish_rate": meter.per_second() if meter else 0.0,
                    "dropped": sum(s.dropped for s in subs),
                    "epoch": followed.epoch if followed else None,
                    "offset": followed.dispatched if followed else None,
                    "history_size": settings.history_size if settings else None,
                    "history_ttl": settings.history_ttl if settings else None,
                }
            )
        return rows

    def relay_figures(self) -> dict[str, int] | None:
        """Messages lost between processes (a reader that fell behind the stream's window)."""
        if self.shared is None:
            return None
        return {"lost": self.lost}

    def close(self) -> None:
        """Stop the sender and every replay."""
        self._sender.cancel()
        for task in self._catching_up.values():
            task.cancel()


def _release(followed: _Followed) -> None:
    followed.notify_drained()
    for _, done in followed.waiters:
        if not done.done():
            done.set_result(None)
    followed.waiters.clear()
    followed.notify_moved()


def _count_drops(meter: TopicMeter, topic: str, outcome: PublishOutcome) -> None:
    for policy, n in outcome.dropped_by.items():
        meter.topic_dropped(topic, policy, n)

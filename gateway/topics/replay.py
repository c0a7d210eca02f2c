"""Replay: the history kept by one process, and the catch-up of resuming subscribers.

A subscriber resuming from an offset older than what this process has
dispatched (protocol 1.1: Topics: history, offsets and resume) is kept off
the live stream and replayed from the history under its credit, in chunks,
up to exactly the topic's ``dispatched`` offset; then it is attached to the
live stream with nothing awaited in between, so the seam has no gap and no
duplicate (``gateway.topics.dispatch``). Messages trimmed away while it
replays are a loss, told as any other.

The history is the Redis stream with several processes
(:class:`~gateway.topics.shared.SharedTopics`), one
:class:`~gateway.core.history.History` per topic in this process otherwise.
"""

from __future__ import annotations

import asyncio
import time

from gateway.core.fanout import Policy, Subscription
from gateway.core.history import Entry, Head, History, Sequencer, TopicSettings, kept
from gateway.core.wire import encode_entry, encode_messages
from gateway.topics.dispatch import Dispatch
from gateway.topics.settings import TopicSettingsCache
from gateway.topics.shared import SharedTopics

__all__ = ["REPLAY_CHUNK", "Replay"]

#: Messages a resuming subscriber is replayed per read of the history.
REPLAY_CHUNK = 1000


class Replay:
    """The topics' history here and the subscribers being replayed from it.

    Args:
        settings: the topics' stored settings (history size and ttl).
        shared: the processes' shared streams, or None for one process.
        sequencer: this process's offsets (one process: the heads).
        dispatch: the local buffers a replayed subscriber joins.
    """

    def __init__(
        self,
        *,
        settings: TopicSettingsCache,
        shared: SharedTopics | None,
        sequencer: Sequencer,
        dispatch: Dispatch,
    ) -> None:
        self.settings = settings
        self.shared = shared
        self.sequencer = sequencer
        self._dispatch = dispatch
        #: one process: each topic's kept messages
        self.histories: dict[str, History] = {}
        self._catching_up: dict[int, asyncio.Task[None]] = {}
        self._credit_granted: dict[int, asyncio.Event] = {}

    def keep(self, topic: str, entries: list[Entry], settings: TopicSettings) -> None:
        """Keep a publish made here in the topic's history (one process), as its
        settings say (none kept: the history is dropped)."""
        if settings.history_size:
            history = self.histories.get(topic)
            if history is None:
                history = self.histories[topic] = History(time.time)
            history.append(entries, settings)
        else:
            self.histories.pop(topic, None)

    # -- resuming subscribers

    def start(self, sub: Subscription, after: int) -> None:
        """Replay ``sub`` (detached from the live stream) from after ``after``, then attach it."""
        self._credit_granted[sub.sid] = asyncio.Event()
        self._catching_up[sub.sid] = asyncio.get_running_loop().create_task(
            self._catch_up(sub, after)
        )

    def granted(self, sid: int) -> None:
        """A subscriber being replayed got credit, or room in its transport."""
        granted = self._credit_granted.get(sid)
        if granted is not None:
            granted.set()

    def stop(self, sid: int) -> None:
        """Stop replaying a subscriber (it went away)."""
        task = self._catching_up.pop(sid, None)
        if task is not None:
            task.cancel()
        self._credit_granted.pop(sid, None)

    def replaying(self) -> list[int]:
        """The subscribers being replayed now."""
        return list(self._catching_up)

    def close(self) -> None:
        """Stop every replay."""
        for task in self._catching_up.values():
            task.cancel()

    # -- history

    async def history(self, topic: str, after: int | None, limit: int) -> tuple[Head, list[Entry]]:
        """``GET /api/topics/TOPIC/history``: the kept messages after ``after``, oldest first."""
        head = await self.head(topic)
        start = 0 if after is None else after
        return head, await self.read(topic, start, limit, head.offset)

    async def head(self, topic: str) -> Head:
        """The topic's epoch and latest offset."""
        if self.shared is not None:
            return await self.shared.head(topic)
        return self.sequencer.head(topic)

    async def read(self, topic: str, after: int, limit: int, latest: int) -> list[Entry]:
        """Kept entries after ``after`` up to ``latest``, by the topic's settings.

        Args:
            topic: the topic.
            after: the offset the entries follow.
            limit: most entries returned.
            latest: the last offset wanted (what is dispatched here, or the head).
        """
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

    def _read_ahead(
        self, topic: str, after: int, room: int, latest: int
    ) -> asyncio.Task[list[Entry]]:
        """Start reading the next chunk of a replay (see :meth:`_catch_up`)."""
        task = asyncio.get_running_loop().create_task(
            self.read(topic, after, min(room, REPLAY_CHUNK), latest)
        )
        # A read given up (the subscriber left) may have failed: seen, not logged.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    async def _catch_up(self, sub: Subscription, after: int) -> None:
        """Replay ``sub`` from the history after ``after`` under its credit, then attach it.

        While one chunk is made into a frame and sent, the read of the next
        (what the credit left allows) is already under way: on Redis a read
        is a round trip and a script's work there, which would otherwise
        alternate with this process's work instead of overlapping it.
        """
        topic, position = sub.topic, after
        # The read started for the chunk after ``position``, if any.
        ahead: tuple[int, asyncio.Task[list[Entry]]] | None = None
        try:
            while True:
                followed = self._dispatch.followed.get(topic)
                if followed is None:
                    return  # restarted: the socket is being closed
                target = followed.dispatched
                if position == target:
                    # The seam: nothing awaited between this check and the
                    # attach, so the next dispatched message is target + 1.
                    self._dispatch.dispatcher.attach(sub.sid)
                    self._dispatch.kick()
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
                entries = []
                if ahead is not None and ahead[0] == position:
                    entries = (await ahead[1])[:room]
                elif ahead is not None:
                    ahead[1].cancel()
                ahead = None
                if not entries or entries[0].offset != position + 1:
                    # A loss is only ever decided on a read made now, up to
                    # what is dispatched now (the read ahead stopped earlier).
                    entries = await self.read(topic, position, min(room, REPLAY_CHUNK), target)
                if sub.sid not in self._dispatch.dispatcher.subscriptions:
                    return
                if not entries or entries[0].offset != position + 1:
                    # Trimmed away while replaying: a loss, told as for any.
                    resumed_at = entries[0].offset - 1 if entries else target
                    missing = resumed_at - position
                    sub.lose(missing)
                    self._dispatch.lost += missing
                    if sub.policy is not Policy.BLOCK:
                        self._dispatch.meter.topic_dropped(topic, sub.policy.value, missing)
                    if sub.policy is Policy.BLOCK:
                        self._dispatch.close_slow(sub)
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
                self._dispatch.meter.topic_delivered(topic, len(items))
                dropped, sub.unreported = sub.unreported, 0
                sink = self._dispatch.sinks.get(sub.sid)
                if sink is not None:
                    sink.push(encode_messages(topic, items, dropped))
                position = entries[-1].offset
                room = sub.credit if not sub.paused else 0
                if room > 0 and position < target:
                    ahead = (position, self._read_ahead(topic, position, room, target))
        finally:
            if ahead is not None:
                ahead[1].cancel()
            self._catching_up.pop(sub.sid, None)
            self._credit_granted.pop(sub.sid, None)

"""One subscription to one topic, whatever carries it (docs/design.md, "One subscription model").

A subscriber socket (``/ws/topics/TOPIC/``), a subscription on the
multiplexed socket (``/ws/``) and a server-sent event stream are each a
:class:`TopicSubscription` in the process's broadcaster: the same buffer,
policy, priority, credit, ``seq``, resume and presence. Only the adapter
differs, and it hands the subscription a :class:`SubscriptionSink`: where
its frames go, and what to do when the gateway ends it.

The life of one, as an adapter drives it::

    sub = TopicSubscription(broadcaster, presence, topic, options, user=..., info=...)
    await sub.prepare()          # settings, head, resume decided; may raise
    sub.attach(sink)             # subscribed (if asked), replay, then live
    sub.grant(n)                 # credit (an SSE adapter grants as it writes)
    sub.set_writable(False)      # the transport is full: its buffer fills
    sub.close()                  # any time, more than once

After :meth:`close` nothing more reaches the sink. The gateway ends a
subscription itself with :meth:`SubscriptionSink.slow_consumer` (a ``block``
buffer that stayed full past the block wait) or
:meth:`SubscriptionSink.stream_restarted` (the topic's offsets restarted); the
subscription is closed already when the sink hears it.
"""

from __future__ import annotations

import secrets
from typing import Any, Protocol

from gateway.core.errors import Invalid
from gateway.core.fanout import Subscription
from gateway.core.presence import Member
from gateway.core.subscribe import SubscribeOptions
from gateway.core.wire import Ref, encode_join, encode_leave, encode_presence
from gateway.topics.broadcast import Broadcaster, Start
from gateway.topics.presence import Presence

__all__ = ["SubscriptionSink", "TopicSubscription"]


class SubscriptionSink(Protocol):
    """What an adapter gives its subscription: where frames go, and how it ends.

    Frames are the wire's JSON text (``messages``, ``subscribed``, ``join``,
    ``leave``, ``presence``); an adapter that is no WebSocket (server-sent
    events) translates them.
    """

    def push(self, frame: str) -> None:
        """Send a frame after those pushed before it (never blocks)."""

    def slow_consumer(self) -> None:
        """The gateway ended the subscription: a ``block`` buffer stayed full too long."""

    def stream_restarted(self) -> None:
        """The gateway ended the subscription: the topic's offsets restarted."""


class TopicSubscription:
    """One subscription: its buffer in the broadcaster, its resume and its presence.

    Args:
        broadcaster: the process's broadcaster.
        presence: the process's presence.
        topic: the topic (a checked name).
        options: what the subscriber asked for (``gateway.core.subscribe``).
        user: who subscribes, as presence lists them.
        info: the signed token's ``info`` claim as JSON text, or None.
    """

    def __init__(
        self,
        broadcaster: Broadcaster,
        presence: Presence,
        topic: str,
        options: SubscribeOptions,
        *,
        user: str,
        info: str | None = None,
    ) -> None:
        self.broadcaster = broadcaster
        self.presence = presence
        self.topic = topic
        self.options = options
        self.member = Member(secrets.token_hex(8), user, info)
        #: the dispatcher's buffer, credit and counters (set by :meth:`attach`)
        self.state: Subscription | None = None
        self._start: Start | None = None
        self._sink: SubscriptionSink | None = None
        self._joined = False
        self._watching = False
        self._snapshot: list[Member] = []
        self._held: list[str] = []  # presence frames told before attach()
        self.closed = False

    @property
    def client(self) -> str:
        """This subscription's member id (unique on every process)."""
        return self.member.client

    async def prepare(self) -> None:
        """Get ready: the topic's settings and head, the resume decided, presence watched.

        Raises:
            Invalid: ``presence`` asked for on a topic whose setting is off.
            Unavailable: the shared streams or presence could not be read.
        """
        options = self.options
        self._start = start = await self.broadcaster.prepare(
            self.topic,
            since=options.since,
            epoch=options.epoch,
            recover_latest=options.recover_latest,
        )
        if options.presence:
            if not start.settings.presence:
                self.close()
                raise Invalid(f"topic {self.topic!r} has no presence (its presence setting is off)")
            try:
                self._snapshot = await self.presence.watch(self.topic, self)
            except BaseException:
                self.close()
                raise
            self._watching = True
        if self.closed:  # closed while it waited
            self._release()

    def attach(self, sink: SubscriptionSink, *, announce: bool = False, ref: Ref = None) -> None:
        """Start delivering to ``sink`` (after :meth:`prepare`).

        Args:
            sink: where the frames go.
            announce: send ``subscribed`` even without a resume (the
                multiplexed socket's reply to ``subscribe``).
            ref: the ``ref`` the ``subscribed`` frame echoes.
        """
        assert self._start is not None, "prepare() first"
        if self.closed:
            return
        self._sink = sink
        start = self._start
        state = self.broadcaster.attach(
            self,
            self.topic,
            start,
            capacity=self.options.capacity,
            policy=self.options.policy,
            weight=self.options.priority,
            credit=self.options.credit,
            announce=announce,
            ref=ref,
        )
        if self.closed:  # the topic restarted meanwhile: told already
            return
        self.state = state
        if start.settings.presence:
            self.presence.join(self.topic, self.member)
            self._joined = True
        if self._watching:
            joins = [(m.client, m.user, m.info) for m in self._snapshot]
            self._snapshot = []
            sink.push(encode_presence(self.topic, joins))
            held, self._held = self._held, []
            for frame in held:
                sink.push(frame)

    def grant(self, n: int) -> None:
        """The subscriber granted ``n`` more messages."""
        if self.state is not None and not self.closed:
            self.broadcaster.grant(self.state.sid, n)

    def set_writable(self, writable: bool) -> None:
        """The adapter's transport filled up (False) or has room (True)."""
        if self.state is not None and not self.closed:
            self.broadcaster.set_writable(self.state.sid, writable)

    def close(self) -> None:
        """End the subscription: its buffer goes, it leaves the topic's presence."""
        if self.closed:
            return
        self.closed = True
        self._release()

    def _release(self) -> None:
        if self.state is not None:
            self.broadcaster.unsubscribe(self.state.sid)
        elif self._start is not None and self._sink is None:
            self.broadcaster.abandon(self.topic)  # prepared, never attached
            self._start = None
        if self._joined:
            self._joined = False
            self.presence.leave(self.topic, self.client)
        if self._watching:
            self._watching = False
            self.presence.unwatch(self.topic, self.client)

    # -- what the broadcaster and the presence tell it

    def push(self, frame: str) -> None:
        """A frame from the broadcaster (``messages``, ``subscribed``)."""
        if self._sink is not None and not self.closed:
            self._sink.push(frame)

    def slow_consumer(self) -> None:
        """The broadcaster closed the buffer: it stayed full past the block wait."""
        if not self.closed:
            self.close()
            if self._sink is not None:
                self._sink.slow_consumer()

    def stream_restarted(self) -> None:
        """The broadcaster closed the buffer: the topic's offsets restarted."""
        if not self.closed:
            self.close()
            if self._sink is not None:
                self._sink.stream_restarted()

    def presence_changed(self, joins: list[Member], leaves: list[Member]) -> None:
        """Other members joined or left (these frames use no credit and are never dropped)."""
        if self.closed:
            return
        if len(joins) + len(leaves) == 1:
            frame = (
                encode_join(self.topic, joins[0].client, joins[0].user, joins[0].info)
                if joins
                else encode_leave(self.topic, leaves[0].client, leaves[0].user)
            )
        else:
            frame = encode_presence(
                self.topic,
                [(m.client, m.user, m.info) for m in joins],
                [(m.client, m.user, m.info) for m in leaves],
            )
        if self._sink is None:
            self._held.append(frame)
        else:
            self._sink.push(frame)

    def describe(self) -> dict[str, Any]:
        """The subscription's live state (``/api/stats``, the dashboard)."""
        sub = self.state
        if sub is None:
            return {"topic": self.topic, "state": "starting"}
        return {
            "topic": self.topic,
            "policy": sub.policy.value,
            "capacity": sub.capacity,
            "buffered": sub.buffered,
            "credit": sub.credit,
            "delivered": sub.delivered,
            "dropped": sub.dropped,
            "dropped_oldest": sub.dropped_oldest,
            "dropped_newest": sub.dropped_newest,
            "dropped_relay": sub.dropped_relay,
            "priority": sub.weight,
            "rate": sub.delivered_rate.per_second(),
            "drop_rate": sub.dropped_rate.per_second(),
        }

"""The multiplexed socket ``/ws/``: one socket, many topics (protocol 1.2: The multiplexed socket).

Each ``subscribe`` makes a :class:`~gateway.topics.subscription.TopicSubscription`,
the same as a subscriber socket's (its own buffer, policy, priority, credit,
``seq``, resume and presence); only the carrier differs. Where a subscriber
socket would be closed (a ``block`` subscription full past the block wait,
the topic's offsets restarted) only that subscription ends, told by
``unsubscribed`` with a ``reason``; the socket and its other subscriptions
go on. Bad input (a topic subscribed twice, outside the token's scopes,
beyond ``GATEWAY_MAX_SUBSCRIPTIONS``, bad options) is one ``error`` frame.

A subscription is ready after an await (its topic's settings and head, maybe
from Redis), so its reply comes later than frames sent after it may be
answered. Credit for it granted meanwhile is kept for it, and an
``unsubscribe`` meanwhile is answered after its ``subscribed``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal, assert_never

from consumers.base import GatewaySocket
from gateway.core.errors import Invalid, ProtocolError
from gateway.core.protocol import (
    AckFrame,
    AckManyFrame,
    ClientFrame,
    CreditFrame,
    DisconnectFrame,
    EnqueueFrame,
    EnqueueManyFrame,
    ExtendFrame,
    NackFrame,
    PublishFrame,
    RejectFrame,
    SubscribeFrame,
    SubscriptionFrame,
    UnsubscribeFrame,
)
from gateway.core.wire import Ref, encode_error, encode_unsubscribed
from gateway.topics.subscription import TopicSubscription

__all__ = ["MultiplexSocket"]

log = logging.getLogger("leasecast.socket")

#: Subscriptions described per socket in ``/api/stats`` (the rest are counted).
DESCRIBED = 100


class _Carried:
    """One subscription carried by a multiplexed socket: its sink, and its start."""

    __slots__ = ("credit", "leaving", "ref", "socket", "starting", "sub")

    def __init__(self, socket: MultiplexSocket, sub: TopicSubscription, ref: Ref) -> None:
        self.socket = socket
        self.sub = sub
        self.ref = ref
        #: prepare() runs: no reply yet
        self.starting = True
        #: credit granted before it started
        self.credit = 0
        #: an ``unsubscribe`` arrived while it started: its ref, answered after
        self.leaving: tuple[Ref] | None = None

    # -- the subscription's sink

    def push(self, frame: str) -> None:
        self.socket.push(frame)

    def slow_consumer(self) -> None:
        self.socket.ended(self, "slow_consumer")

    def stream_restarted(self) -> None:
        self.socket.ended(self, "stream_restarted")


class MultiplexSocket(GatewaySocket):
    """Many subscriptions on one socket, and ``publish`` / ``enqueue`` as on other sockets."""

    kind = "multiplex"
    ops = frozenset({"subscribe", "unsubscribe", "credit", "publish", "enqueue", "enqueue_many"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: this socket's subscriptions, by topic (starting ones included)
        self.carried: dict[str, _Carried] = {}
        self._writable = True
        self._starts: set[asyncio.Task[None]] = set()

    # -- lifecycle

    def closed(self) -> None:
        self._end_all()

    async def disconnect(self, code: int) -> None:
        self._end_all()
        await super().disconnect(code)

    def _end_all(self) -> None:
        carried, self.carried = self.carried, {}
        for entry in carried.values():
            # A subscription still starting is not cancelled: its start sees it
            # closed and gives back what it took (the topic followed here).
            entry.sub.close()

    def writable_changed(self, writable: bool) -> None:
        """The transport filled up or has room: every subscription's buffer pauses or drains."""
        self._writable = writable
        for entry in list(self.carried.values()):
            entry.sub.set_writable(writable)

    # -- frames

    def handle_subscription(self, frame: SubscriptionFrame) -> None:
        match frame:
            case SubscribeFrame():
                self._subscribe(frame)
            case UnsubscribeFrame():
                self._unsubscribe(frame)
            case _:
                assert_never(frame)

    def handle(self, frame: ClientFrame) -> None:
        match frame:
            case CreditFrame():
                self._credit(frame)
            case PublishFrame():
                self.publish(frame)
            case EnqueueFrame() | EnqueueManyFrame():
                self.enqueue(frame)
            case AckFrame() | AckManyFrame() | NackFrame() | RejectFrame() | ExtendFrame():
                raise AssertionError("not in this socket's ops")
            case DisconnectFrame():
                raise AssertionError("not in this socket's ops")
            case _:
                assert_never(frame)

    def _subscribe(self, frame: SubscribeFrame) -> None:
        topic = frame.topic
        if topic in self.carried:
            raise Invalid(f"topic {topic!r} is subscribed on this socket already")
        limit = self.conf.max_subscriptions
        if len(self.carried) >= limit:
            raise Invalid(
                f"this socket holds {limit} subscriptions already "
                "(GATEWAY_MAX_SUBSCRIPTIONS); unsubscribe one first"
            )
        self.require("subscribe", topic)
        entry = _Carried(self, self.subscribe(topic, frame.options), frame.ref)
        self.carried[topic] = entry
        # A refreshed token must still allow it, as a subscriber socket's URL.
        self._url_checks.add(("subscribe", topic))
        task = asyncio.ensure_future(self._start(entry))
        self._starts.add(task)
        task.add_done_callback(self._starts.discard)

    async def _start(self, entry: _Carried) -> None:
        sub = entry.sub
        try:
            await sub.prepare()
        except Exception as exc:
            if self.carried.get(sub.topic) is entry:
                del self.carried[sub.topic]
                self._url_checks.discard(("subscribe", sub.topic))
            sub.close()
            if isinstance(exc, ProtocolError):
                self.push(encode_error(exc.code, exc.detail, entry.ref))
            else:
                log.exception("subscription to %r failed to start", sub.topic)
                self.push(encode_error("unavailable", "subscribe failed; retry", entry.ref))
            if entry.leaving is not None:
                self.push(encode_unsubscribed(sub.topic, ref=entry.leaving[0]))
            return
        if sub.closed:
            return  # the socket went meanwhile
        sub.attach(entry, announce=True, ref=entry.ref)
        entry.starting = False
        if sub.closed:
            return  # ended at once (told by unsubscribed)
        if not self._writable:
            sub.set_writable(False)
        if entry.credit:
            sub.grant(entry.credit)
        if entry.leaving is not None:
            sub.close()
            self.push(encode_unsubscribed(sub.topic, ref=entry.leaving[0]))

    def _unsubscribe(self, frame: UnsubscribeFrame) -> None:
        topic = frame.topic
        entry = self.carried.pop(topic, None)
        if entry is None:
            raise Invalid(f"topic {topic!r} is not subscribed on this socket")
        self._url_checks.discard(("subscribe", topic))
        if entry.starting:
            entry.leaving = (frame.ref,)  # answered once its subscribe is
            return
        # Closed first: nothing of the topic follows the reply.
        entry.sub.close()
        self.push(encode_unsubscribed(topic, ref=frame.ref))

    def _credit(self, frame: CreditFrame) -> None:
        if frame.topic is None:
            raise Invalid("credit on /ws/ names its subscription: field 'topic'")
        entry = self.carried.get(frame.topic)
        if entry is None:
            raise Invalid(f"topic {frame.topic!r} is not subscribed on this socket")
        if entry.starting:
            entry.credit += frame.n
        else:
            entry.sub.grant(frame.n)

    def ended(self, entry: _Carried, reason: Literal["slow_consumer", "stream_restarted"]) -> None:
        """The gateway ended a subscription: ``unsubscribed`` with the reason."""
        topic = entry.sub.topic
        if self.carried.get(topic) is entry:
            del self.carried[topic]
            self._url_checks.discard(("subscribe", topic))
        # While it started, this is the reply to its subscribe.
        self.push(encode_unsubscribed(topic, reason, entry.ref if entry.starting else None))

    def describe(self) -> dict[str, Any]:
        """This socket's live state for ``/api/stats``: its first started subscriptions."""
        entries = list(self.carried.values())
        started = [entry for entry in entries if not entry.starting]
        return {
            **self.identity(),
            "subscriptions": len(entries),
            "topics": [entry.sub.describe() for entry in started[:DESCRIBED]],
        }

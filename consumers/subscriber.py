"""The subscriber socket ``/ws/topics/TOPIC/`` (protocol: Subscriber socket).

One :class:`~gateway.topics.subscription.TopicSubscription` carried by its own
socket: its buffer lives in the process's broadcaster; this socket grants
credit and sends the frames the subscription makes for it. With
``since=OFFSET&epoch=EPOCH`` or ``recover=latest`` on its URL (protocol 1.1:
Topics: history, offsets and resume) it first sends ``subscribed``, and the
broadcaster replays what it missed before the live messages. With
``presence=true`` (protocol 1.2: Presence) it also receives the topic's
``presence``, ``join`` and ``leave`` frames. Where the gateway ends the
subscription, the socket is closed: 4008 (slow consumer) or 4409 (the
topic's offsets restarted).
"""

from __future__ import annotations

from typing import Any, assert_never

from consumers.base import GatewaySocket
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
    check_name,
)
from gateway.core.subscribe import options_from_query
from gateway.core.wire import CloseCode
from gateway.topics.subscription import TopicSubscription

__all__ = ["SubscriberSocket"]


class SubscriberSocket(GatewaySocket):
    """A subscriber: receives ``messages`` frames against the credit it grants."""

    kind = "subscriber"
    ops = frozenset({"credit", "publish", "enqueue", "enqueue_many"})

    topic: str
    subscription: TopicSubscription

    async def open(self, params: dict[str, str]) -> None:
        self.topic = check_name(self.scope["url_route"]["kwargs"]["topic"], "topic")
        options = options_from_query(params)
        self.require("subscribe", self.topic)
        self.subscription = self.subscribe(self.topic, options)
        await self.subscription.prepare()

    def opened(self) -> None:
        self.subscription.attach(self)

    def closed(self) -> None:
        self.subscription.close()

    async def disconnect(self, code: int) -> None:
        sub: TopicSubscription | None = getattr(self, "subscription", None)
        if sub is not None:
            # Prepared, maybe never attached (refused after open(), or gone first).
            sub.close()
        await super().disconnect(code)

    def writable_changed(self, writable: bool) -> None:
        """Its transport filled up or has room: the broadcaster pauses or resumes its buffer."""
        sub: TopicSubscription | None = getattr(self, "subscription", None)
        if sub is not None:
            sub.set_writable(writable)

    def slow_consumer(self) -> None:
        """Close with 4008: a ``block`` buffer stayed full past the block wait."""
        self.push_close(CloseCode.SLOW_CONSUMER)

    def stream_restarted(self) -> None:
        """Close with 4409: the topic's offsets restarted (a new epoch); resubscribe."""
        self.push_close(CloseCode.STREAM_RESTARTED)

    def handle(self, frame: ClientFrame) -> None:
        match frame:
            case CreditFrame():
                self.subscription.grant(frame.n)
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

    def describe(self) -> dict[str, Any]:
        """This socket's live state for ``/api/stats``."""
        return {**self.identity(), **self.subscription.describe()}

"""The subscriber socket ``/ws/topics/TOPIC/`` (protocol: Subscriber socket).

Its buffer lives in the process's broadcaster; this socket grants credit and
sends the ``messages`` frames the broadcaster's sender makes for it.
"""

from __future__ import annotations

from typing import Any, assert_never

from consumers.base import GatewaySocket, int_param
from gateway.broadcast import CLOSE_SLOW_CONSUMER, Broadcaster, get_broadcaster
from gateway.errors import Invalid
from gateway.fanout import Policy, Subscription
from gateway.protocol import (
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

__all__ = ["SubscriberSocket"]


class SubscriberSocket(GatewaySocket):
    """A subscriber: receives ``messages`` frames against the credit it grants."""

    kind = "subscriber"
    ops = frozenset({"credit", "publish", "enqueue", "enqueue_many"})

    topic: str
    subscription: Subscription
    broadcaster: Broadcaster

    async def open(self, params: dict[str, str]) -> None:
        self.topic = check_name(self.scope["url_route"]["kwargs"]["topic"], "topic")
        self._capacity = int_param(params, "capacity", 1024, 1, 1_000_000)
        raw_policy = params.get("on_full", "drop_oldest")
        try:
            self._policy = Policy(raw_policy)
        except ValueError:
            choices = ", ".join(p.value for p in Policy)
            raise Invalid(f"on_full must be one of {choices}, got {raw_policy[:40]!r}") from None
        self._priority = int_param(params, "priority", 1, 1, 1000)
        self._credit = int_param(params, "credit", 256, 0, 1_000_000_000)
        self.require("subscribe", self.topic)
        self.broadcaster = get_broadcaster()

    def opened(self) -> None:
        self.subscription = self.broadcaster.subscribe(
            self,
            self.topic,
            capacity=self._capacity,
            policy=self._policy,
            weight=self._priority,
            credit=self._credit,
        )

    def closed(self) -> None:
        self.broadcaster.unsubscribe(self.subscription.sid)

    def slow_consumer(self) -> None:
        """Close with 4008: a ``block`` buffer stayed full past the block wait."""
        self.push_close(CLOSE_SLOW_CONSUMER)

    def handle(self, frame: ClientFrame) -> None:
        match frame:
            case CreditFrame():
                self.broadcaster.grant(self.subscription.sid, frame.n)
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
        sub = self.subscription
        return {
            **self.identity(),
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

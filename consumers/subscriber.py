"""The subscriber socket ``/ws/topics/TOPIC/`` (protocol: Subscriber socket).

Its buffer lives in the process's broadcaster; this socket grants credit and
sends the ``messages`` frames the broadcaster's sender makes for it. With
``since=OFFSET&epoch=EPOCH`` or ``recover=latest`` on its URL (protocol 1.1:
Topics: history, offsets and resume) it first sends ``subscribed``, and the
broadcaster replays what it missed before the live messages.
"""

from __future__ import annotations

from typing import Any, assert_never

from consumers.base import GatewaySocket, int_param
from gateway.core.errors import Invalid
from gateway.core.fanout import Policy, Subscription
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
from gateway.core.wire import CloseCode
from gateway.topics.broadcast import Broadcaster, Start

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
        since, epoch, recover_latest = _resume_params(params)
        self.require("subscribe", self.topic)
        self.broadcaster = self.runtime.broadcaster
        self._start: Start = await self.broadcaster.prepare(
            self.topic, since=since, epoch=epoch, recover_latest=recover_latest
        )

    def opened(self) -> None:
        self.subscription = self.broadcaster.attach(
            self,
            self.topic,
            self._start,
            capacity=self._capacity,
            policy=self._policy,
            weight=self._priority,
            credit=self._credit,
        )

    def closed(self) -> None:
        self.broadcaster.unsubscribe(self.subscription.sid)

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "_start") and not hasattr(self, "subscription"):
            # Prepared, never attached (refused after open(), or gone first).
            self.broadcaster.abandon(self.topic)
        await super().disconnect(code)

    def writable_changed(self, writable: bool) -> None:
        """Its transport filled up or has room: the broadcaster pauses or resumes its buffer."""
        sub = getattr(self, "subscription", None)  # None before opened()
        if sub is not None:
            self.broadcaster.set_writable(sub.sid, writable)

    def slow_consumer(self) -> None:
        """Close with 4008: a ``block`` buffer stayed full past the block wait."""
        self.push_close(CloseCode.SLOW_CONSUMER)

    def stream_restarted(self) -> None:
        """Close with 4409: the topic's offsets restarted (a new epoch); resubscribe."""
        self.push_close(CloseCode.STREAM_RESTARTED)

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


def _resume_params(params: dict[str, str]) -> tuple[int | None, str | None, bool]:
    """``since`` + ``epoch``, or ``recover=latest``, from the URL (protocol 1.1: Topics)."""
    raw_since, epoch, recover = params.get("since"), params.get("epoch"), params.get("recover")
    if recover is not None:
        if recover != "latest":
            raise Invalid(f"recover must be 'latest', got {recover[:40]!r}")
        if raw_since is not None or epoch is not None:
            raise Invalid("recover=latest cannot be combined with since/epoch")
        return None, None, True
    if (raw_since is None) != (epoch is None):
        raise Invalid("since and epoch go together: send both, or neither")
    if raw_since is None or epoch is None:
        return None, None, False
    since = int_param(params, "since", 0, 0, 2**63 - 1)
    if not 1 <= len(epoch) <= 64 or not epoch.isprintable():
        raise Invalid("epoch must be the 1..64 character string a subscribed frame gave")
    return since, epoch, False

"""The producer socket ``/ws/produce/`` (protocol: Producer socket, Publish)."""

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
)

__all__ = ["ProducerSocket"]


class ProducerSocket(GatewaySocket):
    """Takes ENQUEUE (and ``enqueue_many``) and PUBLISH frames for any name the token allows."""

    kind = "producer"
    ops = frozenset({"enqueue", "enqueue_many", "publish"})

    def handle(self, frame: ClientFrame) -> None:
        match frame:
            case EnqueueFrame() | EnqueueManyFrame():
                self.enqueue(frame)
            case AckFrame() | AckManyFrame() | NackFrame() | RejectFrame() | ExtendFrame():
                raise AssertionError("not in this socket's ops")
            case PublishFrame():
                self.publish(frame)
            case CreditFrame() | DisconnectFrame():
                raise AssertionError("not in this socket's ops")
            case _:
                assert_never(frame)

    def describe(self) -> dict[str, Any]:
        """This socket's live state for ``/api/stats``."""
        return {
            **self.identity(),
        }

"""Typed results of the client's calls (dataclasses, never bare dicts).

:class:`~leasecast.worker.Delivery` and :class:`~leasecast.subscriber.Message`,
the items a worker and a subscriber yield, live beside their iterators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EnqueueResult", "PublishResult", "Subscribed"]


@dataclass(frozen=True)
class EnqueueResult:
    """A stored message: the answer to an enqueue (or an ack's follow-up).

    Attributes:
        id: the message id.
        duplicate: True if the idempotency key matched an earlier message of
            the queue within its dedup window: nothing was enqueued and ``id``
            is that earlier message's.
    """

    id: str
    duplicate: bool

    @classmethod
    def from_wire(cls, item: dict[str, Any]) -> EnqueueResult:
        """From an ``enqueued`` frame or an ``enqueued_many`` result."""
        return cls(id=str(item["id"]), duplicate=bool(item["duplicate"]))


@dataclass(frozen=True)
class PublishResult:
    """A publish the gateway accepted for delivery.

    Attributes:
        topic: the topic.
        seq: the publish's number on the gateway process that took it.
        offset: the topic's offset of this message (protocol 1.1, topic
            history), or None from a gateway without it.
        epoch: the epoch ``offset`` belongs to, or None likewise.
    """

    topic: str
    seq: int
    offset: int | None = None
    epoch: str | None = None

    @classmethod
    def from_wire(cls, topic: str, frame: dict[str, Any]) -> PublishResult:
        """From a ``published`` frame."""
        offset = frame.get("offset")
        epoch = frame.get("epoch")
        return cls(
            topic=str(frame.get("topic", topic)),
            seq=int(frame["seq"]),
            offset=None if offset is None else int(offset),
            epoch=None if epoch is None else str(epoch),
        )


@dataclass(frozen=True)
class Subscribed:
    """The gateway's ``subscribed`` frame: where a (re)subscription starts.

    Attributes:
        topic: the topic.
        epoch: the topic's current epoch.
        offset: the topic's latest offset.
        recovered: True if every message after the position asked for
            (``since``/``epoch``) follows with no gap; False if that position
            could not be recovered (another epoch, or older than the history
            kept): only live messages follow, so messages were missed.
    """

    topic: str
    epoch: str
    offset: int
    recovered: bool

    @classmethod
    def from_wire(cls, topic: str, frame: dict[str, Any]) -> Subscribed:
        """From a ``subscribed`` frame."""
        return cls(
            topic=str(frame.get("topic", topic)),
            epoch=str(frame["epoch"]),
            offset=int(frame["offset"]),
            recovered=bool(frame["recovered"]),
        )

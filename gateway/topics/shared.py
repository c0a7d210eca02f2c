"""What the topics of one process need of the streams all processes share.

``gateway.topics.streams`` implements :class:`SharedTopics` on Redis (design
decision 11); without ``REDIS_URL`` there is none and one process keeps the
sequence and the history itself.
"""

from __future__ import annotations

from typing import Protocol

from gateway.core.history import Entry, Head
from gateway.topics.presence import Presence

__all__ = ["SharedTopics"]


class SharedTopics(Protocol):
    """Offsets, history, relay and presence shared by the processes (``gateway.topics.streams``)."""

    #: the presence of every process's topics
    presence: Presence

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

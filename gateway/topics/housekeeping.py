"""Housekeeping of one process's topics: forgetting idle ones, and describing them.

Memory grows only through publishes (publishers may use ever-new topic
names), so the publish path is where it is given back: a topic nobody
subscribes to here, idle for ``GATEWAY_TOPIC_IDLE`` seconds or past the
``GATEWAY_TOPIC_LIMIT`` most recently published, is forgotten unless its
history still answers resumes. The same place describes the topics for
``/api/stats`` and the dashboard.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from gateway.topics.dispatch import Dispatch
from gateway.topics.followed import release
from gateway.topics.replay import Replay

__all__ = ["Housekeeping"]


class Housekeeping:
    """Forgets idle topics and describes the live ones.

    Args:
        dispatch: the local buffers and the topics dispatched here.
        replay: the histories kept here (and the settings, streams, offsets).
        preparing: topics a socket is about to attach to (never forgotten).
        gates: the publish locks per topic (one process), dropped with a topic.
        topic_idle: seconds after which an unused topic is forgotten here.
        topic_limit: topics with no subscriber kept here; beyond it the least
            recently published are forgotten at once.
    """

    def __init__(
        self,
        *,
        dispatch: Dispatch,
        replay: Replay,
        preparing: Mapping[str, int],
        gates: dict[str, asyncio.Lock],
        topic_idle: float,
        topic_limit: int,
    ) -> None:
        self._dispatch = dispatch
        self._replay = replay
        self._preparing = preparing
        self._gates = gates
        self.topic_idle = topic_idle
        self.topic_limit = topic_limit
        self._next_sweep = time.monotonic() + min(10.0, topic_idle)
        self._sweep_above = topic_limit  # topics counted here that make room at once

    def sweep(self) -> None:
        """Forget the idle topics, if it is time (called before each publish)."""
        # On the publish path, at most every few seconds, or at once when
        # ever-new names crowd in: memory grows only through publishes, so
        # this is where it is given back.
        now = time.monotonic()
        crowded = len(self._dispatch.dispatcher.publish_rate) >= self._sweep_above
        if now < self._next_sweep and not crowded:
            return
        self._next_sweep = now + min(10.0, self.topic_idle / 2)
        # Down to 90% of the limit, so the sort is paid once per tenth of it.
        keep = self.topic_limit * 9 // 10
        for topic in self._dispatch.dispatcher.forget_idle(self.topic_idle, keep):
            if topic in self._preparing:
                continue  # a socket is about to attach to it
            history = self._replay.histories.get(topic)
            settings = self._replay.settings.cached(topic)
            if history is not None and settings is not None:
                history.trim(settings)
            if history is not None and len(history):
                continue  # its history still answers resumes: keep its offsets
            self._replay.histories.pop(topic, None)
            if self._replay.shared is None:
                # Forgotten: the next publish starts a new epoch at offset 1.
                self._replay.sequencer.forget(topic)
                followed = self._dispatch.followed.pop(topic, None)
                if followed is not None:
                    release(followed)
            gate = self._gates.get(topic)
            if gate is not None and not gate.locked():
                del self._gates[topic]
        # Subscribed topics are never forgotten: if they alone pass the limit,
        # the next sweep waits for a tenth of it more, not for every publish.
        self._sweep_above = max(
            self.topic_limit, len(self._dispatch.dispatcher.publish_rate) + self.topic_limit // 10
        )

    # -- what the stats and the dashboard show

    def describe_topics(self) -> list[dict[str, Any]]:
        """Every topic of this process for ``/api/stats``."""
        topics = set(self._dispatch.dispatcher.topics) | set(self._dispatch.dispatcher.published)
        rows = []
        for topic in sorted(topics):
            subs = self._dispatch.dispatcher.topics.get(topic, {}).values()
            meter = self._dispatch.dispatcher.publish_rate.get(topic)
            followed = self._dispatch.followed.get(topic)
            settings = self._replay.settings.cached(topic)
            rows.append(
                {
                    "name": topic,
                    "subscribers": len(subs),
                    "published": self._dispatch.dispatcher.published.get(topic, 0),
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
        if self._replay.shared is None:
            return None
        return {"lost": self._dispatch.lost}

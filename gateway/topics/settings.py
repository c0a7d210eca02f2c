"""Topics' stored settings, cached per process (protocol 1.1: Topics; 1.2: Presence).

Only topics whose settings someone changed have a row (``gateway.models.Topic``);
every other topic has the defaults. So the cache holds the whole table, read
in one query at most once per ``GATEWAY_QUEUE_SETTINGS_TTL`` seconds: a
publish to a topic never seen before costs no query of its own (publishers
choose topic names, and a query per new name made a burst of them crawl). A
change made through this process (``PATCH /api/topics/TOPIC``, the admin)
applies here at once and on the other processes within that time, as for
queue settings.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from channels.db import database_sync_to_async

from gateway.core.history import DEFAULT_TOPIC_SETTINGS, TopicSettings

__all__ = [
    "TopicSettingsCache",
    "load_all_topic_settings",
    "load_topic_settings",
    "save_topic_settings",
]


def load_topic_settings(topic: str) -> TopicSettings:
    """The topic's stored settings, or the defaults (sync; hits the database)."""
    from gateway.models import Topic

    row = Topic.objects.filter(name=topic).values("history_size", "history_ttl", "presence").first()
    if row is None:
        return DEFAULT_TOPIC_SETTINGS
    return TopicSettings(
        history_size=row["history_size"],
        history_ttl=row["history_ttl"],
        presence=row["presence"],
    )


def load_all_topic_settings() -> dict[str, TopicSettings]:
    """Every stored topic's settings (sync; one query)."""
    from gateway.models import Topic

    rows = Topic.objects.values_list("name", "history_size", "history_ttl", "presence")
    return {name: TopicSettings(size, ttl, presence) for name, size, ttl, presence in rows}


def save_topic_settings(topic: str, settings: TopicSettings) -> None:
    """Store the topic's settings (sync; hits the database)."""
    from gateway.models import Topic

    Topic.objects.update_or_create(
        name=topic,
        defaults={
            "history_size": settings.history_size,
            "history_ttl": settings.history_ttl,
            "presence": settings.presence,
        },
    )


class TopicSettingsCache:
    """Every topic's settings, the stored ones read again after ``ttl`` seconds.

    Args:
        ttl: seconds the stored settings are trusted before they are read again.
        load: reads every stored topic's settings (sync; run on Django's
            database thread).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        ttl: float = 2.0,
        *,
        load: Callable[[], dict[str, TopicSettings]] = load_all_topic_settings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self._load = database_sync_to_async(load)
        self._clock = clock
        self._stored: dict[str, TopicSettings] = {}
        self._written: dict[str, TopicSettings] = {}  # put() while a read runs
        self._read_at: float | None = None
        self._loading: asyncio.Future[None] | None = None

    def cached(self, topic: str) -> TopicSettings | None:
        """The topic's settings if the table was read less than ``ttl`` ago, else None."""
        if self._read_at is None or self._clock() - self._read_at >= self.ttl:
            return None
        return self._stored.get(topic, DEFAULT_TOPIC_SETTINGS)

    async def get(self, topic: str) -> TopicSettings:
        """The topic's settings, reading the table again if it is older than ``ttl``."""
        settings = self.cached(topic)
        if settings is not None:
            return settings
        if self._loading is None:
            # One read for every caller that finds the table stale meanwhile.
            self._loading = asyncio.ensure_future(self._reload())
        loading = self._loading
        await asyncio.shield(loading)
        return self._stored.get(topic, DEFAULT_TOPIC_SETTINGS)

    async def _reload(self) -> None:
        try:
            started = self._clock()
            stored = await self._load()
            # Keep what put() wrote meanwhile: it is newer than this read.
            self._stored = {**stored, **self._written}
            self._written = {}
            self._read_at = started
        finally:
            self._loading = None

    def put(self, topic: str, settings: TopicSettings) -> None:
        """Remember ``settings`` of ``topic`` as just written (here, at once)."""
        self._stored = {**self._stored, topic: settings}
        if self._loading is not None:
            self._written[topic] = settings

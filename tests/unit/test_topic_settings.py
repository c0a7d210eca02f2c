"""The topic settings cache: one read of the table per ttl, whatever the names."""

from __future__ import annotations

import asyncio

from gateway.core.history import DEFAULT_TOPIC_SETTINGS, TopicSettings
from gateway.topics.settings import TopicSettingsCache
from tests.support.fakes import FakeClock


async def test_many_new_topics_cost_one_read_per_ttl() -> None:
    clock = FakeClock(100.0)
    reads = []
    stored = {"kept": TopicSettings(10, 60.0)}

    def load() -> dict[str, TopicSettings]:
        reads.append(clock.now)
        return dict(stored)

    cache = TopicSettingsCache(2.0, load=load, clock=clock)
    assert cache.cached("kept") is None  # never read yet
    got = await asyncio.gather(*(cache.get(f"new-{i}") for i in range(100)), cache.get("kept"))
    assert got[:100] == [DEFAULT_TOPIC_SETTINGS] * 100 and got[100] == TopicSettings(10, 60.0)
    assert len(reads) == 1
    assert cache.cached("another") == DEFAULT_TOPIC_SETTINGS  # no read for a new name
    clock.now += 2.0
    assert cache.cached("kept") is None  # stale
    stored["kept"] = TopicSettings(20, 60.0)
    assert await cache.get("kept") == TopicSettings(20, 60.0)
    assert len(reads) == 2


async def test_a_change_made_here_applies_at_once() -> None:
    clock = FakeClock(100.0)
    cache = TopicSettingsCache(2.0, load=dict, clock=clock)
    await cache.get("t")
    cache.put("t", TopicSettings(5, 30.0))
    assert cache.cached("t") == TopicSettings(5, 30.0)

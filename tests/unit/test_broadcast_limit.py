"""The broadcaster's bound on topics nobody subscribes to (``GATEWAY_TOPIC_LIMIT``)."""

from __future__ import annotations

from gateway.core.history import TopicSettings
from gateway.topics.broadcast import Broadcaster, Published
from gateway.topics.settings import TopicSettingsCache


async def publish(broadcaster: Broadcaster, topic: str) -> Published:
    done = broadcaster.publish_now(topic, b"1")
    return done if done is not None else await broadcaster.publish(topic, [b"1"])


async def test_ever_new_names_keep_at_most_the_limit_and_a_forgotten_one_starts_a_new_epoch() -> (
    None
):
    cache = TopicSettingsCache(60.0, load=lambda: {"kept": TopicSettings(100, 3600.0)})
    broadcaster = Broadcaster(settings=cache, topic_idle=3600.0, topic_limit=10)
    try:
        first = await publish(broadcaster, "name-0")
        assert first.offset == 1
        again = await publish(broadcaster, "name-0")
        assert (again.epoch, again.offset) == (first.epoch, 2)
        kept = await publish(broadcaster, "kept")  # it has history: resumable
        for i in range(1, 100):
            await publish(broadcaster, f"name-{i}")
        counted = [f"name-{i}" for i in range(100) if broadcaster.sequencer.known(f"name-{i}")]
        assert len(counted) <= 10, counted  # none is idle, yet at most the limit is kept
        assert counted == [f"name-{i}" for i in range(100 - len(counted), 100)]  # the newest
        # The forgotten one: a new epoch from offset 1, never offsets that seem to go on.
        later = await publish(broadcaster, "name-0")
        assert later.offset == 1 and later.epoch != first.epoch
        # A topic with history is not forgotten while its history answers resumes.
        kept_later = await publish(broadcaster, "kept")
        assert (kept_later.epoch, kept_later.offset) == (kept.epoch, 2)
    finally:
        broadcaster.close()

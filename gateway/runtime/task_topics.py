"""The topic settings of a gateway process, with the rule for task topics.

A task's progress and outcome are published to ``task.RESULT_ID`` (protocol
1.2, Tasks: Progress), which keeps the last 100 messages for an hour
(:data:`gateway.core.task_decisions.TASK_TOPIC_SETTINGS`). That holds by
rule, for every task topic without stored settings of its own, on every
process at once: no row is written per task, so there is nothing for the
other processes' caches to miss while they are fresh, and nothing to prune.
Stored settings of a task topic (``PATCH /api/topics/task.ID``) win.
"""

from __future__ import annotations

from gateway.core.history import TopicSettings
from gateway.core.task_decisions import task_topic_settings
from gateway.topics.settings import TopicSettingsCache

__all__ = ["TaskAwareTopicSettings"]


class TaskAwareTopicSettings(TopicSettingsCache):
    """:class:`TopicSettingsCache` whose task topics keep their history by rule."""

    def cached(self, topic: str) -> TopicSettings | None:
        """As :meth:`TopicSettingsCache.cached`, with the task topics' rule."""
        settings = super().cached(topic)
        return None if settings is None else task_topic_settings(topic, settings)

    async def get(self, topic: str) -> TopicSettings:
        """As :meth:`TopicSettingsCache.get`, with the task topics' rule."""
        return task_topic_settings(topic, await super().get(topic))

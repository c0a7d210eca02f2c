"""A task's topic (protocol 1.2, Tasks: Progress): its name, its settings by rule,
and what it is told: the pure rules of ``gateway.core.task_decisions``."""

from __future__ import annotations

import pytest

from gateway.core.errors import TooLarge
from gateway.core.history import DEFAULT_TOPIC_SETTINGS, TopicSettings
from gateway.core.task_decisions import (
    TASK_TOPIC_SETTINGS,
    Ack,
    Attempt,
    cancelled_update,
    error_line,
    error_of,
    outcome_update,
    progress_update,
    refused,
    succeeded,
    task_topic,
    task_topic_settings,
)
from gateway.runtime.task_topics import TaskAwareTopicSettings
from tests.support.fakes import FakeClock

ATTEMPT = Attempt("r1", "host:1", 1000.0, 1)


class Declined(Exception):
    pass


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_a_task_topic_keeps_100_messages_for_an_hour_unless_stored_otherwise() -> None:
    assert task_topic("abc") == "task.abc"
    assert (TASK_TOPIC_SETTINGS.history_size, TASK_TOPIC_SETTINGS.history_ttl) == (100, 3600.0)
    assert task_topic_settings("task.abc", DEFAULT_TOPIC_SETTINGS) is TASK_TOPIC_SETTINGS
    stored = TopicSettings(history_size=0, history_ttl=300.0)  # a row, even with the defaults
    assert task_topic_settings("task.abc", stored) is stored
    assert task_topic_settings("prices", DEFAULT_TOPIC_SETTINGS) is DEFAULT_TOPIC_SETTINGS
    assert task_topic_settings("tasks.abc", DEFAULT_TOPIC_SETTINGS) is DEFAULT_TOPIC_SETTINGS


async def test_the_process_settings_apply_the_rule_without_a_row() -> None:
    clock = FakeClock()
    cache = TaskAwareTopicSettings(
        2.0, load=lambda: {"task.kept": TopicSettings(5, 60.0)}, clock=clock
    )
    assert await cache.get("task.new") is TASK_TOPIC_SETTINGS
    assert await cache.get("task.kept") == TopicSettings(5, 60.0)  # stored settings win
    assert await cache.get("prices") is DEFAULT_TOPIC_SETTINGS
    assert cache.cached("task.other") is TASK_TOPIC_SETTINGS


def test_what_the_topic_is_told() -> None:
    assert progress_update({"step": 2}) == {"status": "RUNNING", "progress": {"step": 2}}
    assert outcome_update(succeeded(ATTEMPT, (1, 2)).outcome) == {
        "status": "SUCCESSFUL",
        "return_value": [1, 2],
    }
    failed = ATTEMPT.outcome("FAILED", error=error_of(raised(Declined("card declined"))))
    assert outcome_update(failed) == {
        "status": "FAILED",
        "error": f"{__name__}.Declined: card declined",
    }
    retry = ATTEMPT.outcome("READY", error=error_of(raised(ValueError("boom"))))
    assert outcome_update(retry) is None  # a retry: the next attempt's progress follows
    assert outcome_update(None) is None
    assert cancelled_update("why") == {
        "status": "FAILED",
        "error": "leasecast.errors.Cancelled: why",
    }


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (ValueError("boom"), "builtins.ValueError: boom"),
        (KeyError("k"), "builtins.KeyError: 'k'"),
        (Declined(), f"{__name__}.Declined"),
    ],
)
def test_an_error_line_names_the_class_path_and_the_message(exc: Exception, line: str) -> None:
    assert error_line(error_of(raised(exc))) == line


def test_an_error_that_is_not_a_traceback_gives_its_first_line() -> None:
    settlement = refused(succeeded(ATTEMPT, "x"), TooLarge("body over 262144 bytes"))
    assert isinstance(settlement, Ack) and settlement.outcome is not None
    error = settlement.outcome["error"]
    assert error_line(error) == (
        "leasecast.errors.TooLarge: the gateway refused this attempt's outcome "
        "(too_large): body over 262144 bytes"
    )

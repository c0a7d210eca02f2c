"""The topic history and resume rules (gateway.core.history), with exact times."""

from __future__ import annotations

import pytest

from gateway.core.errors import BadFrame, Invalid
from gateway.core.history import (
    DEFAULT_TOPIC_SETTINGS,
    Entry,
    Head,
    History,
    Resume,
    Sequencer,
    TopicSettings,
    kept,
    plan_latest,
    plan_resume,
)
from tests.support.fakes import FakeClock

KEEP_5 = TopicSettings(history_size=5, history_ttl=60.0)


def entry(offset: int, at: float = 1000.0) -> Entry:
    return Entry(offset, b"%d" % offset, at)


# -- settings


def test_defaults_keep_no_history() -> None:
    assert DEFAULT_TOPIC_SETTINGS.as_json() == {
        "history_size": 0,
        "history_ttl": 300.0,
        "presence": False,
    }


def test_settings_change_checked() -> None:
    changed = DEFAULT_TOPIC_SETTINGS.changed({"history_size": 100, "history_ttl": 30})
    assert changed == TopicSettings(100, 30.0)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"history_size": -1}, Invalid),
        ({"history_size": 1.5}, Invalid),
        ({"history_size": 10**9}, Invalid),
        ({"history_size": "10"}, BadFrame),
        ({"history_size": True}, BadFrame),
        ({"history_ttl": 0}, Invalid),
        ({"history_ttl": float("nan")}, Invalid),
        ({"history_ttl": 10**9}, Invalid),
        ({"history_ttl": None}, BadFrame),
        ({"nope": 1}, Invalid),  # an unknown setting (protocol 1.2)
    ],
)
def test_bad_settings_change_nothing(changes: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        KEEP_5.changed(changes)


# -- what counts as history


def test_kept_by_size_and_age() -> None:
    assert kept(entry(6, at=1000.0), latest=10, settings=KEEP_5, now=1000.0)
    assert not kept(entry(5, at=1000.0), latest=10, settings=KEEP_5, now=1000.0)  # 6..10 kept
    assert not kept(entry(10, at=1000.0), latest=10, settings=KEEP_5, now=1060.0)  # too old
    assert kept(entry(10, at=1000.0), latest=10, settings=KEEP_5, now=1059.9)


# -- resume


def test_resume_of_another_epoch_is_not_recovered() -> None:
    plan = plan_resume(
        since=3, epoch="old", head=Head("new", 5), first_missed=entry(4), settings=KEEP_5,
        now=1000.0,
    )  # fmt: skip
    assert plan == Resume(False, None)


def test_resume_at_the_latest_offset_misses_nothing_even_without_history() -> None:
    plan = plan_resume(
        since=5, epoch="e", head=Head("e", 5), first_missed=None,
        settings=DEFAULT_TOPIC_SETTINGS, now=1000.0,
    )  # fmt: skip
    assert plan == Resume(True, 5)


def test_resume_from_the_future_is_not_recovered() -> None:
    plan = plan_resume(
        since=9, epoch="e", head=Head("e", 5), first_missed=None, settings=KEEP_5, now=1000.0
    )
    assert plan == Resume(False, None)


def test_resume_within_history_replays_after_since() -> None:
    plan = plan_resume(
        since=7, epoch="e", head=Head("e", 10), first_missed=entry(8), settings=KEEP_5,
        now=1000.0,
    )  # fmt: skip
    assert plan == Resume(True, 7)


def test_resume_older_than_history_size_is_not_recovered() -> None:
    # 6..10 are kept: resuming from 4 would need 5.
    plan = plan_resume(
        since=4, epoch="e", head=Head("e", 10), first_missed=entry(5), settings=KEEP_5,
        now=1000.0,
    )  # fmt: skip
    assert plan == Resume(False, None)


def test_resume_whose_first_missed_message_expired_is_not_recovered() -> None:
    plan = plan_resume(
        since=7, epoch="e", head=Head("e", 10), first_missed=entry(8, at=900.0),
        settings=KEEP_5, now=1000.0,
    )  # fmt: skip
    assert plan == Resume(False, None)


def test_resume_with_the_first_missed_message_absent_is_not_recovered() -> None:
    for first in (None, entry(9)):
        plan = plan_resume(
            since=7, epoch="e", head=Head("e", 10), first_missed=first, settings=KEEP_5,
            now=1000.0,
        )  # fmt: skip
        assert plan == Resume(False, None)


def test_cache_mode_gets_the_latest_kept_message() -> None:
    assert plan_latest(head=Head("e", 10), latest=entry(10), settings=KEEP_5, now=1000.0) == Resume(
        True, 9
    )
    assert plan_latest(
        head=Head("e", 10), latest=entry(10, at=0.0), settings=KEEP_5, now=1000.0
    ) == Resume(False, None)
    assert plan_latest(head=Head("e", 0), latest=None, settings=KEEP_5, now=1000.0) == Resume(
        False, None
    )


# -- the in-process history


def test_history_keeps_the_last_size_entries_and_reads_after_an_offset() -> None:
    clock = FakeClock()
    history = History(clock)
    history.append([entry(i) for i in range(1, 9)], KEEP_5)
    assert len(history) == 5
    assert [e.offset for e in history.after(0, 100, latest=8, settings=KEEP_5)] == [4, 5, 6, 7, 8]
    assert [e.offset for e in history.after(5, 2, latest=8, settings=KEEP_5)] == [6, 7]
    assert history.entry(4) == entry(4) and history.entry(3) is None
    assert history.latest() == entry(8)


def test_history_forgets_by_age() -> None:
    clock = FakeClock()
    history = History(clock)
    history.append([entry(1, at=1000.0), entry(2, at=1030.0)], KEEP_5)
    clock.now = 1061.0
    assert [e.offset for e in history.after(0, 10, latest=2, settings=KEEP_5)] == [2]
    history.trim(KEEP_5)
    assert len(history) == 1


def test_history_of_size_zero_keeps_nothing() -> None:
    history = History(FakeClock())
    history.append([entry(1)], KEEP_5)
    history.append([entry(2)], DEFAULT_TOPIC_SETTINGS)
    assert len(history) == 0


# -- the in-process sequence


def test_sequencer_offsets_grow_by_one_and_a_forgotten_topic_gets_a_new_epoch() -> None:
    epochs = iter(["a", "b"])
    seq = Sequencer(lambda: next(epochs))
    assert seq.head("t") == Head("a", 0)
    assert seq.advance("t", 3) == Head("a", 0)
    assert seq.advance("t", 1) == Head("a", 3)
    assert seq.head("t") == Head("a", 4)
    seq.forget("t")
    assert seq.head("t") == Head("b", 0)

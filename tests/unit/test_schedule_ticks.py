"""The pure tick core of schedules (gateway.core.schedule_ticks), on a fake clock."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.errors import Invalid
from gateway.core.schedule_ticks import TickRule, due_tick, parse_tick_rule, tick_label
from tests.support.fakes import FakeClock


def at(iso: str) -> float:
    """Unix seconds of an ISO 8601 time with its offset."""
    return datetime.fromisoformat(iso).timestamp()


def fired(rule: TickRule, clock: FakeClock, until: float, step: float = 60.0) -> list[str]:
    """Run a firing loop on ``clock`` up to ``until``, polling every ``step``
    seconds, as the gateway's loop does; returns the ticks fired, as labels."""
    last: float | None = None
    since = clock()
    labels = []
    while clock() < until:
        clock.advance(step)
        tick = due_tick(rule, clock(), last_tick=last, since=since)
        if tick is not None:
            labels.append(tick_label(tick))
            last = tick
    return labels


def test_every_is_aligned_on_the_epoch_and_fires_each_tick_once() -> None:
    rule = parse_tick_rule(every=15, now=0)
    assert rule.next_after(1000.0) == 1005.0
    assert rule.next_after(1005.0) == 1020.0  # strictly after
    assert rule.latest_at(1005.0) == 1005.0
    assert rule.latest_at(1019.9) == 1005.0
    clock = FakeClock(at("2026-11-26T03:00:01+00:00"))
    ticks = fired(rule, clock, clock() + 60, step=0.25)
    assert ticks == [
        "2026-11-26T03:00:15Z",
        "2026-11-26T03:00:30Z",
        "2026-11-26T03:00:45Z",
        "2026-11-26T03:01:00Z",
    ]


def test_cron_fields_names_lists_ranges_steps() -> None:
    rule = parse_tick_rule(cron="0,30 9-10 * jan-mar mon-fri", now=0)
    start = at("2027-01-01T11:00:00+00:00")  # a Friday, after its ticks
    clock = FakeClock(start)
    ticks = fired(rule, clock, at("2027-01-05T00:00:00+00:00"))
    assert ticks == [
        "2027-01-04T09:00:00Z",  # Monday (the weekend skipped)
        "2027-01-04T09:30:00Z",
        "2027-01-04T10:00:00Z",
        "2027-01-04T10:30:00Z",
    ]
    steps = parse_tick_rule(cron="*/20 * * * *", now=0)
    assert tick_label(steps.next_after(at("2027-01-01T00:41:00+00:00")) or 0) == (
        "2027-01-01T01:00:00Z"
    )


@pytest.mark.parametrize(
    ("zone", "night_before", "skipped_day", "next_day"),
    [
        # 02:30 does not exist on 2026-03-29 in Berlin, nor on 2026-03-08 in New York
        ("Europe/Berlin", "2026-03-28T12:00:00+00:00", "2026-03-29", "2026-03-30T00:30:00Z"),
        ("America/New_York", "2026-03-07T12:00:00+00:00", "2026-03-08", "2026-03-09T06:30:00Z"),
    ],
)
def test_cron_wall_time_skipped_by_spring_forward_does_not_tick(
    zone: str, night_before: str, skipped_day: str, next_day: str
) -> None:
    rule = parse_tick_rule(cron="30 2 * * *", timezone=zone, now=0)
    clock = FakeClock(at(night_before))
    ticks = fired(rule, clock, clock() + 3 * 86400)
    assert not any(label.startswith(skipped_day) for label in ticks)
    assert next_day in ticks
    assert len(ticks) == 2  # the two days around the skipped one


@pytest.mark.parametrize(
    ("zone", "start", "first", "after_the_repeat"),
    [
        # Berlin: 03:00 CEST -> 02:00 CET at 01:00 UTC on 2026-10-25
        (
            "Europe/Berlin",
            "2026-10-24T23:50:00+00:00",
            "2026-10-25T00:00:00Z",
            "2026-10-25T02:00:00Z",
        ),
        # New York: 02:00 EDT -> 01:00 EST at 06:00 UTC on 2026-11-01
        (
            "America/New_York",
            "2026-11-01T04:50:00+00:00",
            "2026-11-01T05:00:00Z",
            "2026-11-01T07:00:00Z",
        ),
    ],
)
def test_cron_wall_time_repeated_by_fall_back_ticks_once(
    zone: str, start: str, first: str, after_the_repeat: str
) -> None:
    rule = parse_tick_rule(cron="*/30 * * * *", timezone=zone, now=0)
    clock = FakeClock(at(start))
    ticks = fired(rule, clock, clock() + 4 * 3600)
    # every half hour, but the repeated hour's two wall times only once
    assert ticks[:3] == [first, first.replace(":00:00Z", ":30:00Z"), after_the_repeat]
    assert len(ticks) == len(set(ticks)) == 8 - 2
    # asked in the middle of the repetition, the latest tick is the first pass's
    inside = at(first.replace("Z", "+00:00")) + 3600 + 600
    assert tick_label(rule.latest_at(inside) or 0) == first.replace(":00:00Z", ":30:00Z")


def test_catch_up_fires_only_the_most_recent_tick() -> None:
    rule = parse_tick_rule(every=60, now=0)
    clock = FakeClock(at("2026-11-26T03:00:10+00:00"))
    since = clock()
    last = due_tick(rule, clock(), last_tick=None, since=since)
    assert last is None  # 03:00 came before the schedule did
    clock.advance(60)
    last = due_tick(rule, clock(), last_tick=None, since=since)
    assert last is not None and tick_label(last) == "2026-11-26T03:01:00Z"
    clock.advance(3600)  # no process ran for an hour
    caught = due_tick(rule, clock(), last_tick=last, since=since)
    assert caught is not None and tick_label(caught) == "2026-11-26T04:01:00Z"
    assert due_tick(rule, clock(), last_tick=caught, since=since) is None


def test_a_process_that_fell_behind_fires_every_tick_it_was_late_for() -> None:
    # A running process's loop starved for 5 s of an every-1 s schedule: each
    # of those ticks passed while a gateway ran, so each fires, oldest first
    # (before, only the latest fired and four ticks were lost).
    rule = parse_tick_rule(every=1, now=0)
    started = at("2026-11-26T03:00:00.5+00:00")
    last = at("2026-11-26T03:00:01+00:00")
    now = last + 5.2
    ticks = []
    while (tick := due_tick(rule, now, last_tick=last, since=0, running_since=started)) is not None:
        ticks.append(tick_label(tick))
        last = tick
    assert ticks == [f"2026-11-26T03:00:0{s}Z" for s in range(2, 7)]


def test_ticks_before_the_process_ran_are_caught_up_once_then_each_after() -> None:
    rule = parse_tick_rule(every=60, now=0)
    last = at("2026-11-26T03:00:00+00:00")
    started = at("2026-11-26T04:00:30+00:00")  # no process from 03:00 to 04:00:30
    now = started + 140  # and this one was late for 04:01 and 04:02
    ticks = []
    while (tick := due_tick(rule, now, last_tick=last, since=0, running_since=started)) is not None:
        ticks.append(tick_label(tick))
        last = tick
    assert ticks == ["2026-11-26T04:00:00Z", "2026-11-26T04:01:00Z", "2026-11-26T04:02:00Z"]
    # A schedule created after the process started fires from its first tick on.
    since = started + 10
    first = due_tick(rule, now, last_tick=None, since=since, running_since=started)
    assert first is not None and tick_label(first) == "2026-11-26T04:01:00Z"


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": "0 0 31 4,6 *"}, "cron"),
        ({"cron": "* * * *"}, "five fields"),
        ({"cron": "0 0 0 * * *"}, "five fields"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "0 0 * * *; rm"}, "cron"),
        ({"cron": 5}, "cron"),
        ({"every": 0.5}, "every"),
        ({"every": 0}, "every"),
        ({"every": True}, "every"),
        ({"every": "5"}, "every"),
        ({"every": float("nan")}, "every"),
        ({}, "exactly one"),
        ({"cron": "* * * * *", "every": 5}, "exactly one"),
        ({"every": 5, "timezone": "Mars/Olympus"}, "timezone"),
        ({"every": 5, "timezone": "../../etc/passwd"}, "timezone"),
        ({"every": 5, "timezone": 3}, "timezone"),
    ],
)
def test_invalid_rules_are_refused_with_a_detail(fields: dict[str, object], detail: str) -> None:
    with pytest.raises(Invalid, match=detail):
        parse_tick_rule(now=at("2026-11-26T00:00:00+00:00"), **fields)  # type: ignore[arg-type]


def test_tick_labels() -> None:
    assert tick_label(at("2026-11-26T03:00:00+00:00")) == "2026-11-26T03:00:00Z"
    assert tick_label(at("2026-11-26T03:00:00.5+00:00")) == "2026-11-26T03:00:00.500Z"


_EXPRESSIONS = [
    "*/30 * * * *",
    "30 2 * * *",
    "0 * * * *",
    "15 1-3 * * sun",
    "0 0 1 * *",
    "*/7 2 * * *",
]
_ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]


def _transitions() -> list[float]:
    """The instants of 2026-2027 at which one of :data:`_ZONES` changes its offset."""
    found = []
    start = int(at("2026-01-01T00:00:00+00:00"))
    for zone in map(ZoneInfo, _ZONES):
        before = datetime.fromtimestamp(start, zone).utcoffset()
        for hour in range(start, start + 2 * 365 * 86400, 1800):
            offset = datetime.fromtimestamp(hour, zone).utcoffset()
            if offset != before:
                found.append(float(hour))
                before = offset
    return found


_YEARS = st.floats(
    min_value=at("2026-01-01T00:00:00+00:00"), max_value=at("2027-12-31T00:00:00+00:00")
)
#: Times within three hours of a daylight-saving change, where the rules bite.
_NEAR_CHANGES = st.builds(
    lambda change, offset: change + offset,
    st.sampled_from(_transitions()),
    st.floats(min_value=-3 * 3600, max_value=3 * 3600),
)


@settings(max_examples=400, deadline=None)
@given(
    expression=st.sampled_from(_EXPRESSIONS),
    zone=st.sampled_from(_ZONES),
    # 2026-2027, whole and fractional seconds, and often near a DST change
    t=st.one_of(_YEARS, _NEAR_CHANGES),
)
def test_latest_and_next_agree_around_any_time(expression: str, zone: str, t: float) -> None:
    rule = parse_tick_rule(cron=expression, timezone=zone, now=0)
    latest, following = rule.latest_at(t), rule.next_after(t)
    assert latest is not None and following is not None
    assert latest <= t < following
    # Nothing ticks between them: each finds the other.
    assert rule.next_after(latest) == following
    assert rule.latest_at(following) == following
    assert rule.latest_at(following - 0.001) == latest
    # A tick is a wall time that exists, at its first occurrence.
    for tick in (latest, following):
        local = datetime.fromtimestamp(tick, ZoneInfo(zone))
        assert local.replace(fold=0).timestamp() == tick
